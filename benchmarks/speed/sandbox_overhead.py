"""Milliseconds per `run_tests` call of the code sandbox, against a bare `python -I` start as the floor.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/speed/sandbox_overhead.py --calls 20

The sandbox runs once per completion, so this is the cost it adds to every scored sample.
"""

import argparse
import statistics
import subprocess
import sys
import time

from rloo.rewards.isolation import isolation_layers
from rloo.rewards.sandbox import run_tests

HONEST = "def f(x):\n    return x * x\n"
TESTS = ["assert f(3) == 9", "assert f(4) == 16"]


def per_call_ms(call, calls: int) -> tuple[float, float]:
    """Median and minimum milliseconds of `calls` sequential calls (after one warm-up call)."""
    call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    print("layers:", isolation_layers())
    floor = per_call_ms(lambda: subprocess.run([sys.executable, "-I", "-c", "pass"], check=True), args.calls)
    print(f"bare `python -I -c pass`: median {floor[0]:.1f} ms, min {floor[1]:.1f} ms")

    def sandboxed():
        assert run_tests(HONEST, TESTS).passed == 2

    sandbox = per_call_ms(sandboxed, args.calls)
    print(f"run_tests (2 tests): median {sandbox[0]:.1f} ms, min {sandbox[1]:.1f} ms per call")


if __name__ == "__main__":
    main()

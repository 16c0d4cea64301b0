"""Run TRL's own RLOOTrainer tests against rloo, with only the import changed.

    python benchmarks/trl_suite/trl_suite.py --trl-dir /path/to/trl [--suite rloo|grpo-tools] [-k EXPR] [--against-trl]

The TRL checkout stays outside this repository. Its `tests/test_rloo_trainer.py` (with TRL's
`testing_utils.py` and `conftest.py`) is copied to a temporary folder, the line
`from trl import RLOOConfig, RLOOTrainer` becomes `from rloo import RLOOConfig, RLOOTrainer`, and
pytest runs there against local stand-ins of the Hub ids the tests load (see trl_suite/standins.py
and trl_suite/hub_redirect.py; nothing is downloaded). By default the text tests run: the
`TestRLOOTrainer` class without the vision-language class and the vLLM tests.

Prints the TRL commit, the pass/fail count and every failure's first error line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from hub_cache import build_hub_cache  # noqa: E402

TRL_IMPORT = "from trl import RLOOConfig, RLOOTrainer"
RLOO_IMPORT = "from rloo import RLOOConfig, RLOOTrainer"
DEFAULT_SELECTION = "TestRLOOTrainer and not TestRLOOTrainerVLM and not vllm"
# --suite: (TRL's test file, its import line, the line that puts rloo's classes under the same names, default -k).
# "grpo-tools" runs GRPOTrainer's tool, environment and rollout_func tests against RLOOTrainer (docs/multi_turn.md).
SUITES = {
    "rloo": ("test_rloo_trainer.py", TRL_IMPORT, RLOO_IMPORT, DEFAULT_SELECTION),
    "grpo-tools": ("test_grpo_trainer.py", "from trl import GRPOConfig, GRPOTrainer",
                   "from rloo import RLOOConfig as GRPOConfig, RLOOTrainer as GRPOTrainer",
                   "tool or environment or rollout_func"),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trl-dir", default=os.environ.get("TRL_DIR", "/work/ext/trl"),
                        help="a checkout of huggingface/trl (holds tests/test_rloo_trainer.py)")
    parser.add_argument("--suite", choices=sorted(SUITES), default="rloo",
                        help="rloo: TRL's RLOOTrainer tests; grpo-tools: GRPOTrainer's tool/environment/rollout_func tests")
    parser.add_argument("-k", dest="select", default=None, help="pytest -k expression (default: the suite's)")
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/rloo-trl-suite"),
                        help="where the stand-in models and data set are built (once)")
    parser.add_argument("--against-trl", action="store_true", help="keep `from trl import ...`: TRL's own count")
    parser.add_argument("--keep", action="store_true", help="keep the temporary test folder and print its path")
    parser.add_argument("pytest_args", nargs="*", help="more arguments for pytest (after --)")
    return parser.parse_args(argv)


def trl_commit(trl_dir: Path) -> str:
    result = subprocess.run(["git", "-C", str(trl_dir), "rev-parse", "HEAD"], capture_output=True, text=True)
    return result.stdout.strip() or "unknown (not a git checkout)"


def prepare_folder(trl_dir: Path, folder: Path, against_trl: bool, suite: str = "rloo") -> None:
    """Copy TRL's test file and helpers into `folder/tests`, change the import, add the redirecting conftest."""
    test_file, trl_import, rloo_import, _ = SUITES[suite]
    tests = folder / "tests"
    tests.mkdir(parents=True)
    source = (trl_dir / "tests" / test_file).read_text()
    if source.count(trl_import) != 1:
        raise SystemExit(f"expected exactly one line {trl_import!r} in TRL's test file; the file has changed shape")
    if not against_trl:
        source = source.replace(trl_import, rloo_import)
    (tests / test_file).write_text(source)
    for helper in ("testing_utils.py", "conftest.py"):
        shutil.copy(trl_dir / "tests" / helper, tests / helper)
    (tests / "__init__.py").write_text("")
    shutil.copy(HERE / "hub_redirect.py", folder / "conftest.py")


def summarize(report: Path) -> tuple[int, int, int, list[tuple[str, str]]]:
    """(passed, failed, skipped, [(test, first error line)]) from pytest's JUnit XML."""
    passed = failed = skipped = 0
    failures = []
    for case in ET.parse(report).getroot().iter("testcase"):
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            failed += 1
            message = (problem.get("message") or problem.text or "").strip().splitlines()
            failures.append((case.get("name"), message[0][:300] if message else ""))
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, failures


def main(argv=None) -> int:
    args = parse_args(argv)
    trl_dir = Path(args.trl_dir).resolve()
    if not (trl_dir / "tests" / "test_rloo_trainer.py").exists():
        raise SystemExit(f"{trl_dir} is not a TRL checkout (no tests/test_rloo_trainer.py); pass --trl-dir")
    cache = build_hub_cache(Path(args.cache))
    folder = Path(tempfile.mkdtemp(prefix="trl-suite-"))
    prepare_folder(trl_dir, folder, args.against_trl, args.suite)
    test_file, select = SUITES[args.suite][0], args.select or SUITES[args.suite][3]
    env = {**os.environ, "HF_HUB_CACHE": str(cache / "hub"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "RLOO_TRL_SUITE_CACHE": str(cache), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true",
           # TRL's testing_utils imports helpers from the checkout's own `trl` package.
           "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(trl_dir)) if p)}
    report = folder / "report.xml"
    command = [sys.executable, "-m", "pytest", f"tests/{test_file}", "-k", select, "-p", "no:cacheprovider",
               "-q", "--junitxml", str(report), *args.pytest_args]
    subprocess.run(command, cwd=folder, env=env)
    passed, failed, skipped, failures = summarize(report)
    print(f"\nTRL commit: {trl_commit(trl_dir)}")
    print(f"suite: {args.suite}; selection: -k {select!r}; trainer under test: {'trl' if args.against_trl else 'rloo'}")
    for name, message in failures:
        print(f"FAILED {name}: {message}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    if args.keep:
        print(f"test folder kept: {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

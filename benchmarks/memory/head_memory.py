"""Memory of the LM-head log-prob step alone: rloo's tiled head against TRL's fused head, at a real vocabulary.

    python benchmarks/memory/head_memory.py                      # 2,048, 4,096 and 8,192 tokens, both systems
    python benchmarks/memory/head_memory.py --tokens 4096 --systems trl

`benchmarks/memory/memory.py` shows TRL's growth across `train()` almost flat in the completion length
(about 4.5 GB from 1,024 to 4,096 tokens at vocabulary 151,936). This isolates the step that
explains it: log-probs and entropies of N tokens through a (151,936 x 64) head, forward and
backward, as each trainer runs it in training (rloo: `rloo.algo.lm_head.tiled_head_logprobs`;
TRL: the autograd function behind `trl.trainer.utils.add_fused_lm_head`, with its own tile sizes).
Each measurement is a fresh process, fp32 on CPU, one thread; printed: the growth of the peak RSS
(the kernel's high-water mark) across forward + backward, and the seconds they took.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))

VOCAB, HIDDEN = 151_936, 64


def measure(system: str, tokens: int) -> dict:
    """Forward + backward of the head step on `tokens` tokens; peak RSS growth and seconds."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    hidden = torch.randn(tokens, HIDDEN, requires_grad=True)
    weight = (torch.randn(VOCAB, HIDDEN) * 0.02).requires_grad_()
    targets = torch.randint(0, VOCAB, (tokens,))
    if system == "trl":
        from trl.kernels.chunked_logprob import ChunkedLogProbFunction
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

        def step():
            logps, entropy, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0,
                                                              _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0,
                                                              ("log_probs", "entropy"))
            return logps, entropy
    else:
        from rloo.algo.lm_head import tiled_head_logprobs

        def step():
            logps, entropy = tiled_head_logprobs(hidden[None], weight, None, targets[None], with_entropy=True)
            return logps[0], entropy[0]

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    logps, entropy = step()
    # The policy-gradient loss uses the log-probs; the entropy is a logged metric (no gradient), as in both trainers.
    logps.sum().backward()
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"system": system, "tokens": tokens, "peak_rss_growth_mb": (after - before) / 2**20, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096, 8192],
                        help="tokens per call (8 completions x 1,024 tokens = 8,192)")
    parser.add_argument("--systems", nargs="+", default=["rloo", "trl"], choices=["rloo", "trl"])
    parser.add_argument("--out", type=Path, default=HERE.parent / "results" / "head_memory.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        print(json.dumps(measure(**json.loads(options.worker))))
        return
    print(f"vocab {VOCAB}, hidden {HIDDEN}, fp32 CPU, 1 thread; log-probs + entropies, forward + backward\n")
    print("| tokens | system | peak RSS growth MB | seconds |\n|---:|---|---:|---:|")
    results = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for tokens in options.tokens:
        for system in options.systems:
            spec = json.dumps({"system": system, "tokens": tokens})
            done = subprocess.run([sys.executable, __file__, "--worker", spec], capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise SystemExit(f"{system} at {tokens} tokens failed:\n{done.stderr[-2000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results.append(result)
            print(f"| {tokens} | {system} | {result['peak_rss_growth_mb']:.0f} | {result['seconds']:.1f} |", flush=True)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"vocab": VOCAB, "hidden": HIDDEN, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()

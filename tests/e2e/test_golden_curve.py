"""Golden loss curve: the first 10 losses of a fixed-seed CPU fp32 toy run, against stored values.

The run exercises the whole loop: sampling, a dense reward, the KL to the reference folded into
the reward (beta 0.05), leave-one-out advantages, and two passes over each rollout
(num_iterations=2), so that on the second pass the ratio pi/pi_old moves and the clip bites. On
each rollout's first pass the ratio is 1 and the leave-one-out advantages of a group sum to zero,
so the default sequence-level loss is 0 up to rounding there; the gradient is not, so the curve
stores each step's gradient norm and KL beside its loss. Any
change to what the loop computes moves these numbers; a change that should not (a refactor) must
leave them where they are.

The stored values are tied to this machine's torch build: sampling turns float differences into
different tokens, so another torch version or CPU may need new values. To regenerate them
(after checking that the change in numbers is intended):

    PYTHONPATH=src python tests/e2e/test_golden_curve.py --regenerate
"""

import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from rloo import RLOOConfig, RLOOTrainer
from rloo.toy import addition_dataset, build_char_tokenizer, build_tiny_model

GOLDEN = Path(__file__).with_name("golden_losses.json")
REGENERATE = "PYTHONPATH=src python tests/e2e/test_golden_curve.py --regenerate"
NUM_LOSSES = 10
CURVES = {"losses": "loss/policy_avg", "grad_norms": "grad_norm", "kl": "objective/kl"}


def digit_fraction(completions, **kwargs):
    """Fraction of a completion's characters that are digits: dense, and rises from a random init."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def golden_run(output_dir: str) -> list[dict[str, float]]:
    """The logged metrics of the golden run's first NUM_LOSSES optimizer steps, one dict per step."""
    torch.set_num_threads(1)  # one intra-op thread: the same reductions in the same order every run
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, seed=0)
    args = RLOOConfig(output_dir=output_dir, per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, learning_rate=3e-3, beta=0.05, num_iterations=2,
                      max_steps=NUM_LOSSES, logging_steps=1, save_steps=0, seed=0, overwrite_output_dir=True)
    trainer = RLOOTrainer(model, digit_fraction, args=args, train_dataset=addition_dataset(64, seed=0),
                          processing_class=tokenizer)
    trainer.train()
    lines = (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_first_losses_match_the_golden_curve(tmp_path):
    golden = json.loads(GOLDEN.read_text())
    logged = golden_run(str(tmp_path / "run"))
    assert len(logged) == NUM_LOSSES
    for curve, metric in CURVES.items():
        assert [line[metric] for line in logged] == pytest.approx(golden[curve], rel=1e-4, abs=1e-6), (
            f"the {curve} curve moved; if that is intended, regenerate with: {golden['command']}")
    # The run tests the terms it claims to: the KL and the clip both act, and the clip only in part.
    assert max(line["objective/kl"] for line in logged) > 1e-2
    assert 0 < sum(line["policy/clipfrac_avg"] for line in logged) / NUM_LOSSES < 1


def regenerate() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        logged = golden_run(str(Path(tmp) / "run"))
    record = {"command": REGENERATE, "torch": torch.__version__}
    record.update({curve: [line[metric] for line in logged] for curve, metric in CURVES.items()})
    GOLDEN.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {len(record['losses'])} losses to {GOLDEN}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(f"usage: {REGENERATE}")
    regenerate()

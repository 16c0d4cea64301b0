"""A two-step run logging to the trackers named on the command line, for tests/run/test_trackers.py.

Run in its own process so that each tracker reads its environment (WANDB_MODE, WANDB_DIR,
TRACKIO_DIR, WANDB_PROJECT) fresh: trackio reads TRACKIO_DIR once, at import.
usage: python tracker_run.py OUTPUT_DIR RUN_NAME TRACKER [TRACKER ...]
"""

import sys

import torch
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer
from rloo.toy import build_char_tokenizer, build_tiny_model


def digit_fraction(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


if __name__ == "__main__":
    torch.set_num_threads(1)
    output_dir, run_name, trackers = sys.argv[1], sys.argv[2], sys.argv[3:]
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64)
    dataset = Dataset.from_list([{"prompt": f"{a}+{b}="} for a in range(8) for b in range(8)])
    args = RLOOConfig(output_dir=output_dir, run_name=run_name, report_to=trackers, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=6, max_steps=2, logging_steps=1, save_steps=0,
                      log_completions=True, num_completions_to_print=3, seed=0)
    RLOOTrainer(model, digit_fraction, args=args, train_dataset=dataset, processing_class=tokenizer).train()

"""Run under torchrun by test_dynamic_sampling_distributed.py: dynamic sampling with two processes, each
recording its reward calls, so the test can check that both ran the same rounds and stayed in sync."""

import json
import sys
from pathlib import Path

import torch
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer
from rloo.toy import build_char_tokenizer, build_tiny_model

torch.set_num_threads(1)
out = Path(sys.argv[1])
tokenizer = build_char_tokenizer()
model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
dataset = Dataset.from_list([{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(8) for b in range(8)])
calls = []


def half_constant(prompts, completions):
    """Prompts starting with 0-5 get one reward for all their completions (zero spread)."""
    calls.append(len(prompts))
    return [1.0 if p[0] in "012345" else sum(ch.isdigit() for ch in c) / max(len(c), 1)
            for p, c in zip(prompts, completions)]


args = RLOOConfig(output_dir=str(out / "run"), per_device_train_batch_size=8, num_generations=4, max_completion_length=5,
                  learning_rate=1e-2, max_steps=4, logging_steps=1, save_steps=0, temperature=1.5,
                  dynamic_sampling=True, dynamic_sampling_max_rounds=5)
trainer = RLOOTrainer(model, half_constant, args=args, train_dataset=dataset, processing_class=tokenizer)
trainer.train()
checksum = sum(p.double().sum().item() for p in trainer.model.parameters())
rank = trainer.accelerator.process_index
(out / f"rank{rank}.json").write_text(json.dumps({"calls": calls, "checksum": checksum}))

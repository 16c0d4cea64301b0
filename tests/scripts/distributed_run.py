"""Run by test_distributed.py under `accelerate launch --num_processes 2`: a short RLOO run whose
every process records what it saw, so the test can check groups, counts and weight sync."""

import json
import sys
from pathlib import Path

import torch
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer
from rloo.model_loading import CheckpointedLayer
from rloo.toy import build_char_tokenizer, build_tiny_model

torch.set_num_threads(1)
out = Path(sys.argv[1])
tokenizer = build_char_tokenizer()
model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
dataset = Dataset.from_list([{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(8) for b in range(8)])
seen = []


def digit_fraction(prompts, completions):
    seen.append(prompts)
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


args = RLOOConfig(output_dir=str(out / "run"), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                  num_generations=4, max_completion_length=5, learning_rate=1e-2, beta=0.1, max_steps=3,
                  logging_steps=1, save_steps=0, use_cpu="--use_cpu" in sys.argv,
                  shared_prefix_forward="--shared_prefix_forward" in sys.argv,
                  gradient_checkpointing="--gradient_checkpointing" in sys.argv)
trainer = RLOOTrainer(model, digit_fraction, args=args, train_dataset=dataset, processing_class=tokenizer)
trainer.train()
checksum = sum(p.double().sum().item() for p in trainer.model.parameters())
rank = trainer.accelerator.process_index
(out / f"rank{rank}.json").write_text(json.dumps({
    "num_processes": trainer.accelerator.num_processes, "seen": seen, "checksum": checksum, "episode": trainer.episode,
    "checkpointed_layers": sum(isinstance(module, CheckpointedLayer) for module in trainer.model.modules()),
}))

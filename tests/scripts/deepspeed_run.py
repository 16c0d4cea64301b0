"""Run by test_deepspeed.py under `accelerate launch` with the shipped DeepSpeed configs on 2 CPU
processes: a short RLOO run with gradient accumulation whose every process records how many optimizer
steps DeepSpeed's engine took, its place in the world, and a checksum of its weights."""

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


def digit_fraction(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


args = RLOOConfig(output_dir=str(out / "run"), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                  num_generations=4, max_completion_length=5, learning_rate=1e-2, beta=0.1, max_steps=3,
                  logging_steps=1, save_steps=0, seed=0)
trainer = RLOOTrainer(model, digit_fraction, args=args, train_dataset=dataset, processing_class=tokenizer)
trainer.train()
acc = trainer.accelerator
engine = trainer.model  # a DeepSpeedEngine under DeepSpeed, a DDP wrapper otherwise
(out / f"rank{acc.process_index}.json").write_text(json.dumps({
    "num_processes": acc.num_processes, "distributed_type": str(acc.distributed_type),
    "engine": type(engine).__name__, "global_steps": getattr(engine, "global_steps", None),
    "micro_steps": getattr(engine, "micro_steps", None),
    "zero_stage": acc.state.deepspeed_plugin.zero_stage if acc.state.deepspeed_plugin else None,
    "ds_config": {k: acc.state.deepspeed_plugin.deepspeed_config.get(k) for k in
                  ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
                   "train_batch_size")} if acc.state.deepspeed_plugin else None,
    "checksum": sum(p.double().sum().item() for p in acc.unwrap_model(engine).parameters()),
}))

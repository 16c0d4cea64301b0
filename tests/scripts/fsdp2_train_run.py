"""Run by test_sharding.py under torchrun (2 CPU processes): a short RLOO run with a separate
reference (beta > 0) and a checkpoint every step, under accelerate's FSDP2 or its DDP.

    python fsdp2_train_run.py <out> fsdp2|ddp [--resume]   (--resume: from <out>/<mode>/checkpoint-1)

accelerate 1.15 never picks FSDP on CPU (`AcceleratorState` sets `DistributedType.FSDP` only in its
GPU branch; with `cpu=True` the type stays MULTI_CPU and `prepare` wraps in DDP). For "fsdp2" this
script sets the type and an FSDP2 plugin right after the trainer builds its accelerator; from then
on accelerate's own FSDP2 code runs (`fsdp2_prepare_model`, `get_state_dict`, `save_state`). A test
device only: rloo does not do this for users.
"""

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
from accelerate.state import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer, builders
from rloo.distributed.sharding import sharding_of
from rloo.toy import build_char_tokenizer, build_tiny_model

torch.set_num_threads(1)
out, mode, resume = Path(sys.argv[1]), sys.argv[2], "--resume" in sys.argv
build_accelerator = builders._accelerator


def fsdp2_on_cpu(args):
    accelerator = build_accelerator(args)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["Qwen2DecoderLayer"])
    # AcceleratorState copies PartialState's type in at every construction: set both.
    PartialState._shared_state["distributed_type"] = accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    return accelerator


if mode == "fsdp2":
    builders._accelerator = fsdp2_on_cpu
# The process group first, with a short timeout: a collective one process never joins fails the
# test in two minutes instead of hanging it (the trainer's accelerator joins this group).
PartialState(cpu=True, timeout=timedelta(seconds=120))
tokenizer = build_char_tokenizer()
model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
dataset = Dataset.from_list([{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(8) for b in range(8)])


def digit_fraction(completions):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


args = RLOOConfig(output_dir=str(out / mode), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                  num_generations=4, max_completion_length=5, learning_rate=1e-2, beta=0.1, max_steps=2,
                  logging_steps=1, save_steps=1, use_cpu=True, seed=3)
# 5 eval prompts over 2 processes: 3 and 2 rows, 2 and 1 batches of prompts_per_step=2.
trainer = RLOOTrainer(model, digit_fraction, args=args, train_dataset=dataset, eval_dataset=dataset.select(range(5)),
                      processing_class=tokenizer)
trainer.train(resume_from_checkpoint=str(out / mode / "checkpoint-1") if resume else None)
rank = trainer.accelerator.process_index
(out / f"{mode}{'-resumed' if resume else ''}-rank{rank}.json").write_text(json.dumps({
    "distributed_type": str(trainer.accelerator.distributed_type),
    "policy": sharding_of(trainer.model),
    "reference": sharding_of(trainer.reference),
    "global_step": trainer.global_step,
}))

"""Run by test_sharding.py under torchrun (2 CPU processes, gloo): a tiny policy sharded with FSDP2's
`fully_shard`, checked against the same weights unsharded on every process.

Writes rank<r>.json with what the test compares: greedy completions of the gathered sharded model
(fast sampler) and of the sharded model without gathering (HF generate, kept in step), the same
from the unsharded model, reference log-probs (a sharded separate reference; LoRA with adapters
disabled) next to the unsharded ones, and whether the weights are sharded again after generating.
The main process also saves with `checkpoint.save_model` into <out>/saved and the unsharded weights
into <out>/expected.pt.
"""

import copy
import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from torch.distributed.fsdp import fully_shard

from rloo import RLOOConfig
from rloo.distributed.sharding import full_weights_for_generation, sharding_of
from rloo.generation import FastSampler, GenerateSampler
from rloo.passes.logprobs import completion_logprobs
from rloo.run.checkpoint import CheckpointError, check_finite_weights, save_model
from rloo.toy import build_char_tokenizer, build_tiny_model

torch.set_num_threads(1)
out = Path(sys.argv[1])
# A short timeout: a collective that one process never joins (a broken gather) fails the test
# in a minute instead of hanging it.
acc = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=60))])
rank = acc.process_index
tokenizer = build_char_tokenizer()


def tiny_model():
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # away from the seeded init, so a save of fresh weights cannot pass by accident
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return model


def shard(model):
    """What accelerate's FSDP2 plugin does, by hand: one unit per decoder layer, then the root."""
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


full = tiny_model().eval()
policy = shard(copy.deepcopy(full))
assert sharding_of(policy) == "fsdp2"

# Each process its own prompts ...
texts = [["1+2=", "3+4="], ["5+6=", "12+7=", "9="]][rank]
prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
# ... and its own length: decode loops of different lengths, which only full weights survive
# (a sharded forward is a collective every process must join).
common = dict(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id], max_new_tokens=4 + 4 * rank)
greedy = FastSampler(**common, do_sample=False)
top1 = GenerateSampler(**common, top_k=1)  # generate with top_k=1 is greedy


def completions(sampled):
    return [row[mask.bool()].tolist() for row, mask in zip(sampled.completion_ids, sampled.completion_mask)]


result = {"expected": completions(greedy.sample(full, prompts, 2))}
with full_weights_for_generation(acc, policy) as model:
    result["plain_during"] = all(not hasattr(p, "to_local") for p in model.parameters())  # no DTensor left
    result["gathered"] = completions(greedy.sample(model, prompts, 2))
result["sharded_after"] = all(hasattr(p, "to_local") for p in policy.parameters())
with full_weights_for_generation(acc, policy, gather=False) as model:  # ds3_gather_for_generation=False
    result["not_gathered"] = completions(top1.sample(model, prompts, 2))
result["expected_top1"] = completions(top1.sample(full, prompts, 2))

# Reference log-probs under sharding: a separate sharded reference, and LoRA with adapters disabled.
sampled = greedy.sample(full, prompts, 2)
input_ids = torch.cat([sampled.prompt_ids, sampled.completion_ids], dim=1)
attention_mask = torch.cat([sampled.prompt_mask, sampled.completion_mask], dim=1)
length = sampled.completion_ids.shape[1]


def logps(model):
    with torch.no_grad():
        return (completion_logprobs(model, input_ids, attention_mask, length)[0] * sampled.completion_mask).tolist()


result["policy_after_generation"] = logps(policy)  # the no-grad policy pass after a gathered generation
reference = shard(copy.deepcopy(full)).eval().requires_grad_(False)
result["reference_expected"] = logps(full)
result["reference_sharded"] = logps(reference)

from peft import LoraConfig, get_peft_model  # noqa: E402

lora = get_peft_model(copy.deepcopy(full), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
shard(lora.base_model.model)
with lora.disable_adapter():
    result["lora_reference"] = logps(lora)
result["lora_policy"] = logps(lora)  # adapters on: must differ, or disabling them proves nothing

# A full checkpoint from the sharded policy.
save_model(acc, policy, tokenizer, RLOOConfig(output_dir=str(out)), str(out / "saved"))
if acc.is_main_process:
    torch.save(full.state_dict(), out / "expected.pt")
# A NaN in one process's shard only: both processes refuse to checkpoint (neither waits on the other).
if rank == 1:
    with torch.no_grad():
        policy.model.norm.weight.to_local().fill_(float("nan"))
try:
    check_finite_weights(policy, step=7, accelerator=acc)
    result["nan_refused"] = None
except CheckpointError as error:
    result["nan_refused"] = str(error)
(out / f"rank{rank}.json").write_text(json.dumps(result))
acc.wait_for_everyone()

"""rloo on a GPU, in one short run: correctness of the fast paths on CUDA, then speed and memory against TRL.

    bash scripts/gpu_check.sh OUTDIR            # on the GPU machine: installs the carried wheels, then runs this
    python benchmarks/gpu/gpu_check.py --cpu-tiny --out /tmp/gpu-check   # the dry run (CI): same code paths, tiny, on CPU

Writes OUTDIR/gpu_check.json (rewritten after every section, so a run cut short keeps what it finished) and
OUTDIR/gpu_check.md (the short table, also printed last). Sections, each guarded so that one failure loses
nothing else, and each skipped and recorded when the global time budget (--budget-s) cannot hold it:

  environment         versions, the card, whether the installed releases meet pyproject.toml's declared range
  matmul_peak         the card's measured bf16 matrix-multiply rate (an 8192^3 product, median of 10 after
                      3 warm-ups, timed with CUDA events): the MFU denominator
  correctness (CUDA, each against the plain path; relative error ||got - want|| / ||want|| over real tokens):
    tiled_head_{fp32,bf16}       rloo's tiled LM head against the model's own head: log-probs, entropies, gradients
    lean_activations_{fp32,bf16} lean MLPs and norms against the model's own modules: log-probs, gradients
    shared_prefix_{fp32,bf16}    the shared-prefix training forward against whole rows: log-probs, entropies, gradients
    sampler_same_draws           FastSampler against `generate` from the same random state (fp32): the same tokens
    rloo_step_cuda_vs_cpu        one RLOO optimizer step (fp32, the same completions) on CUDA against CPU:
                                 loss and gradient norm
  speed (a model with Qwen3-0.6B's config, random weights, bf16 autocast; 32 prompts x K = 8, 512 new tokens,
  3 timed steps after 1 warm-up; every system gets the same prompts, reward and batch sizes):
    speed_rloo_512          rloo at its defaults
    speed_trl_ours_512      TRL 1.16's RLOOTrainer with rloo's defaults where the two differ (no gradient
                            checkpointing, dropout off, adamw_torch)
    speed_trl_defaults_512  TRL at its own defaults (gradient checkpointing on, adamw_torch_fused)
    speed_rloo_4096         rloo alone at 4,096 new tokens (8 prompts x K = 8: 32 prompts' KV cache alone would
                            take about 124 GB), 1 timed step, no warm-up step
    speed_rloo_lean_off_512 rloo with lean_activations=False, otherwise as speed_rloo_512: what the CPU-tuned
                            recomputation costs or saves in the GPU's training pass
    speed_trl_cb_512        TRL at rloo's settings with use_transformers_continuous_batching=True (issue #46)
    speed_trl_liger_512     TRL at rloo's settings with use_liger_kernel=True (skipped without liger_kernel)
    speed_rloo_16384        rloo alone at 16,384 new tokens (1 prompt x K = 8), 1 timed step, no warm-up: long
                            reasoning on one GPU; run it alone (--sections environment,speed_rloo_16384)

Each speed section reports, over its timed steps: tokens per second of generation (new tokens / seconds in the
sampler or `generate`) and of the training pass (prompt + completion tokens / seconds in the forward and
backward passes with grad), seconds in the no-grad passes (the reference's log-probs) and the rest (rewards,
optimizer), torch.cuda.max_memory_allocated during the timed steps, and the training pass's model FLOPs
utilisation: (6 N per token through the decoder + 6 V H per completion token through the head + causal
attention) / seconds / the measured bf16 peak. N counts the decoder's matrix weights; recomputation under
gradient checkpointing is not counted (model FLOPs, not hardware FLOPs).

Tolerances (METHOD: fp32 arithmetic lands far under 1e-3, bf16 operands between 1e-3 and 1e-2): 1e-4 in fp32 and
2e-2 in bf16 for log-probs, entropies and the global gradient; the worst single parameter within 10x that. The
sampler check passes when every row draws the same tokens. The step check passes when the losses differ by at
most 1e-5 (the on-policy RLOO loss is near 0, so only an absolute bound means anything) and the gradient norms
by at most 1e-4 relative.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import gc
import importlib.util
import json
import math
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[2]

# Qwen/Qwen3-0.6B's config.json (transformers' Qwen3Config names): 28 layers of width 1024, 16 query and 8 KV
# heads of 128, a 3072-wide gated MLP, per-head RMSNorms on queries and keys (Qwen3's qk-norm, built into the
# class), a tied 151,936-word head, rope theta 1e6. Random weights: nothing is downloaded.
QWEN3_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                  max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                  bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)
# The dry run's model: the same class and structure, tiny.
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6,
            tie_word_embeddings=True, attention_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            bos_token_id=510, eos_token_id=511, pad_token_id=510)

TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}
WORST_PARAMETER_FACTOR = 10.0
STEP_LOSS_ATOL = 1e-5
STEP_GRAD_NORM_RTOL = 1e-4


@dataclass
class Plan:
    """Sizes of one run: the full check on a GPU, or the dry run on CPU."""

    device: str
    model: dict  # the speed sections' model config
    correctness_layers: int  # the correctness checks use `model` with this many layers (real widths and vocabulary)
    rows: tuple[int, int, int, int]  # correctness: prompts, K, prompt tokens, completion tokens
    prompts: int  # speed: prompts per step
    k: int  # speed: completions per prompt
    prompt_tokens: int
    completion_tokens: int
    micro_batch: int  # completions per micro-batch (per_device_train_batch_size)
    warmup_steps: int
    steps: int
    long_prompts: int
    long_completion_tokens: int
    long_micro_batch: int
    long_warmup_steps: int
    long_steps: int
    bf16: bool  # bf16 autocast in the speed sections
    peak_size: int  # side of the square matmul that measures the peak
    budget_s: float
    extra: dict = field(default_factory=dict)
    xl_prompts: int = 1  # speed_rloo_16384: prompts, new tokens, micro-batch (1 timed step, no warm-up)
    xl_completion_tokens: int = 16384
    xl_micro_batch: int = 1  # one row of 16.5k tokens: its saved activations take tens of GB


def gpu_plan(args) -> Plan:
    return Plan(device="cuda", model=QWEN3_0_6B, correctness_layers=2, rows=(2, 4, 48, 96), prompts=32, k=8,
                prompt_tokens=128, completion_tokens=512, micro_batch=16, warmup_steps=1, steps=3,
                long_prompts=8, long_completion_tokens=4096, long_micro_batch=8, long_warmup_steps=0, long_steps=1,
                bf16=True, peak_size=8192, budget_s=args.budget_s or 420.0)


def tiny_plan(args) -> Plan:
    return Plan(device="cpu", model=TINY, correctness_layers=2, rows=(2, 3, 7, 6), prompts=2, k=2,
                prompt_tokens=6, completion_tokens=8, micro_batch=2, warmup_steps=1, steps=1,
                long_prompts=1, long_completion_tokens=24, long_micro_batch=2, long_warmup_steps=0, long_steps=1,
                bf16=False, peak_size=256, budget_s=args.budget_s or 600.0, xl_completion_tokens=32)


# ---------------------------------------------------------------------------------------------
# Small tools: clock, budget, results file, relative errors
# ---------------------------------------------------------------------------------------------


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Budget:
    """The run's wall-clock allowance, counted from the script's start."""

    def __init__(self, seconds: float):
        self.seconds, self.start = seconds, time.perf_counter()

    def used(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.seconds - self.used()


class OutOfTime(Exception):
    """The budget's alarm: raised in whatever section is running when --budget-s is spent (`partial` holds what that
    section had measured by then)."""

    partial: dict = {}


def stop_at_budget_end(budget: "Budget") -> None:
    """Raise OutOfTime when the budget is spent. The hard limit's SIGTERM cannot do this: inside `train()` rloo's
    own handler takes it and stops only between rollouts, and one 4,096-token rollout outlasted the 20 s before
    the KILL (2026-11-27: the JSON then had no word of the section)."""
    def ring(signum, frame):
        raise OutOfTime(f"the time budget ({budget.seconds:.0f} s) ran out")

    signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(budget.left(), 0.001))


class Results:
    """The JSON report, rewritten whole after every section."""

    def __init__(self, out_dir: Path, header: dict):
        self.path = out_dir / "gpu_check.json"
        self.data = {**header, "sections": {}}
        self.write()

    def record(self, name: str, entry: dict) -> None:
        self.data["sections"][name] = entry
        self.write()

    def write(self) -> None:
        temporary = self.path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        temporary.replace(self.path)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64 (0 when both are 0)."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    norm = want.norm().item()
    difference = (got - want).norm().item()
    return difference / norm if norm > 0 else difference


def gradient_errors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict:
    """The global relative error over every parameter's gradient, and the worst single parameter's."""
    if got.keys() != want.keys():
        raise AssertionError(f"different parameters got gradients: {sorted(got.keys() ^ want.keys())[:5]}")
    squared_difference = sum((got[n].double() - want[n].double()).norm().item() ** 2 for n in want)
    squared_norm = sum(want[n].double().norm().item() ** 2 for n in want)
    worst_name, worst = max(((n, relative_error(got[n], want[n])) for n in want if want[n].norm() > 0),
                            key=lambda item: item[1])
    return {"grad_rel_err": math.sqrt(squared_difference / squared_norm), "grad_worst_rel_err": worst,
            "grad_worst_parameter": worst_name, "parameters": len(want)}


def judge(errors: dict, tolerance: float) -> bool:
    """Every relative error within the tolerance, the worst parameter within WORST_PARAMETER_FACTOR times it."""
    checks = [value <= tolerance for key, value in errors.items() if key.endswith("rel_err") and "worst" not in key]
    checks.append(errors.get("grad_worst_rel_err", 0.0) <= WORST_PARAMETER_FACTOR * tolerance)
    return all(checks) and not any(isinstance(v, float) and math.isnan(v) for v in errors.values())


# ---------------------------------------------------------------------------------------------
# Models, tokenizer, rows
# ---------------------------------------------------------------------------------------------


def build_model(config_values: dict, device: str, layers: int | None = None, seed: int = 0):
    """A Qwen3ForCausalLM with random weights built on `device` (fp32)."""
    import transformers

    values = dict(config_values)
    if layers is not None:
        values["num_hidden_layers"] = layers
    config = transformers.Qwen3Config(**values)
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.Qwen3ForCausalLM(config)
    return model.train()


def word_tokenizer(config_values: dict):
    """A word-level tokenizer with one word per model token ("w17" is token 17), so that any sampled id
    decodes and a prompt's text tokenizes back to exactly its ids; the model's BOS/pad and EOS ids are
    its special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pad_id, eos_id = config_values["pad_token_id"], config_values["eos_token_id"]
    vocab = {f"w{i}": i for i in range(config_values["vocab_size"])}
    del vocab[f"w{pad_id}"], vocab[f"w{eos_id}"]
    vocab["<|endoftext|>"], vocab["<|im_end|>"] = pad_id, eos_id
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                   unk_token="<|endoftext|>")


def ordinary_ids(config_values: dict, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Random token ids that are neither pad nor EOS: drawn from V - 2 values, then stepped over the two."""
    ids = torch.randint(0, config_values["vocab_size"] - 2, shape, generator=generator)
    for special in sorted((config_values["pad_token_id"], config_values["eos_token_id"])):
        ids = ids + (ids >= special).long()
    return ids


def prompt_texts(config_values: dict, count: int, length: int, seed: int) -> list[str]:
    ids = ordinary_ids(config_values, (count, length), torch.Generator().manual_seed(seed))
    return [" ".join(f"w{i}" for i in row.tolist()) for row in ids]


def correctness_rows(config_values: dict, plan: Plan, device: str, seed: int = 0) -> dict:
    """Groups of K rows sharing a left-padded prompt, with right-padded completions of varied lengths."""
    prompts, k, p, c = plan.rows
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.linspace(p, max(1, p // 2), prompts).round().long()  # (prompts,) real prompt tokens
    prompt_mask = (torch.arange(p)[None] >= p - lengths[:, None]).long()  # (prompts, P), left padding
    prompt_ids = ordinary_ids(config_values, (prompts, p), gen) * prompt_mask + config_values["pad_token_id"] * (
        1 - prompt_mask)
    completion_lengths = torch.randint(max(1, c // 3), c + 1, (prompts * k, 1), generator=gen)
    completion_lengths[0] = c  # one row uses every position
    completion_mask = (torch.arange(c)[None] < completion_lengths).long()  # (B, C)
    completion_ids = ordinary_ids(config_values, (prompts * k, c), gen) * completion_mask
    rows = dict(prompt_ids=prompt_ids.repeat_interleave(k, 0), prompt_mask=prompt_mask.repeat_interleave(k, 0),
                completion_ids=completion_ids, completion_mask=completion_mask,
                weights_logp=torch.randn(prompts * k, c, generator=gen), weights_entropy=torch.randn(prompts * k, c,
                                                                                                      generator=gen))
    return {name: tensor.to(device) for name, tensor in rows.items()}


# ---------------------------------------------------------------------------------------------
# Correctness checks
# ---------------------------------------------------------------------------------------------


def autocast(device: str, precision: str):
    if precision == "bf16":
        return torch.autocast(device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def training_pass(model, rows: dict, forward: Callable, device: str, precision: str, temperature: float = 0.7):
    """Log-probs, entropies and parameter gradients of one weighted training forward and backward."""
    model.zero_grad(set_to_none=True)
    with autocast(device, precision):
        logps, entropy = forward(model, rows, temperature)
    mask = rows["completion_mask"]
    ((logps * rows["weights_logp"] + 0.3 * entropy * rows["weights_entropy"]) * mask).sum().backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return (logps.detach() * mask).float(), (entropy.detach() * mask).float(), grads


def whole_rows(model, rows: dict, temperature: float):
    from rloo.passes.logprobs import completion_logprobs

    input_ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], dim=1)
    attention_mask = torch.cat([rows["prompt_mask"], rows["completion_mask"]], dim=1)
    return completion_logprobs(model, input_ids, attention_mask, rows["completion_ids"].shape[1], temperature,
                               with_entropy=True, entropy_grad=True)


def shared_prefix(model, rows: dict, temperature: float):
    from rloo.passes.prefix_logprobs import shared_prompt_logprobs

    return shared_prompt_logprobs(model, rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"],
                                  rows["completion_mask"], temperature, with_entropy=True, entropy_grad=True)


@contextlib.contextmanager
def plain_head():
    """The plain path: full logits from the model's own head (rloo's fallback when the head is out of reach)."""
    from rloo.passes import logprobs as logprobs_module

    original = logprobs_module.reachable_head
    logprobs_module.reachable_head = lambda model: None
    try:
        yield
    finally:
        logprobs_module.reachable_head = original


def compare(got, want, precision: str) -> dict:
    errors = {"logp_rel_err": relative_error(got[0], want[0]), "entropy_rel_err": relative_error(got[1], want[1]),
              **gradient_errors(got[2], want[2])}
    tolerance = TOLERANCE[precision]
    return {**errors, "tolerance": tolerance, "passed": judge(errors, tolerance)}


def check_tiled_head(plan: Plan, precision: str) -> dict:
    model = build_model(plan.model, plan.device, plan.correctness_layers)
    rows = correctness_rows(plan.model, plan, plan.device)
    got = training_pass(model, rows, whole_rows, plan.device, precision)
    with plain_head():
        want = training_pass(model, rows, whole_rows, plan.device, precision)
    return compare(got, want, precision)


def check_lean_activations(plan: Plan, precision: str) -> dict:
    from rloo.passes.lean_activations import lean_activations

    plain = build_model(plan.model, plan.device, plan.correctness_layers)
    lean = copy.deepcopy(plain)
    switched = lean_activations(lean)
    rows = correctness_rows(plan.model, plan, plan.device)
    result = compare(training_pass(lean, rows, whole_rows, plan.device, precision),
                     training_pass(plain, rows, whole_rows, plan.device, precision), precision)
    layers = plan.correctness_layers
    switched_all = switched.mlps == layers and switched.norms == 4 * layers + 1  # Qwen3: 2 norms + q/k norms a layer
    return {**result, "lean_mlps": switched.mlps, "lean_norms": switched.norms, "kept": list(switched.kept),
            "passed": result["passed"] and switched_all}


def check_shared_prefix(plan: Plan, precision: str) -> dict:
    model = build_model(plan.model, plan.device, plan.correctness_layers)
    rows = correctness_rows(plan.model, plan, plan.device)
    return compare(training_pass(model, rows, shared_prefix, plan.device, precision),
                   training_pass(model, rows, whole_rows, plan.device, precision), precision)


def check_sampler_draws(plan: Plan) -> dict:
    """FastSampler and `generate` (TRL's sampler: the prompt repeated K times) from the same seed draw the same
    tokens: the same filtered distribution and one multinomial call per position (tests/generation/test_decoding.py
    checks this on CPU). fp32: under bf16 the batch of 1 prefill and the batch of K differ in rounding."""
    from rloo.generation import completion_mask_from_eos
    from rloo.generation.fast import FastSampler

    model = build_model(plan.model, plan.device, plan.correctness_layers, seed=3).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(4.0)  # a peaked distribution, as the CPU test makes it
    pad, eos = plan.model["pad_token_id"], plan.model["eos_token_id"]
    prompt = ordinary_ids(plan.model, (plan.rows[2],), torch.Generator().manual_seed(5)).tolist()
    k, new_tokens = 8, max(8, plan.rows[3] // 3)
    settings = []
    for temperature, top_k, top_p in ((0.8, 0, 1.0), (1.0, 5, 0.9)):
        torch.manual_seed(7)
        fast = FastSampler(pad, [eos], new_tokens, temperature=temperature, top_k=top_k, top_p=top_p).sample(
            model, [prompt], k)
        torch.manual_seed(7)
        with torch.no_grad():
            generated = model.generate(torch.tensor([prompt] * k, device=plan.device),
                                       attention_mask=torch.ones(k, len(prompt), dtype=torch.long, device=plan.device),
                                       do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p,
                                       max_new_tokens=new_tokens, eos_token_id=eos, pad_token_id=pad)[:, len(prompt):]
        mask, _ = completion_mask_from_eos(generated, [eos])
        drawn = [ids[: int(m.sum())].tolist() for ids, m in zip(fast.completion_ids, fast.completion_mask)]
        expected = [ids[: int(m.sum())].tolist() for ids, m in zip(generated, mask)]
        same_tokens = sum(a == b for d, e in zip(drawn, expected) for a, b in zip(d, e))
        settings.append({"temperature": temperature, "top_k": top_k, "top_p": top_p,
                         "rows_identical": sum(d == e for d, e in zip(drawn, expected)), "rows": k,
                         "tokens_identical": same_tokens, "tokens": sum(len(e) for e in expected),
                         "distinct_rows": len({tuple(d) for d in drawn})})
    passed = all(s["rows_identical"] == s["rows"] and s["distinct_rows"] > 1 for s in settings)
    return {"settings": settings, "new_tokens": new_tokens, "passed": passed}


class ReplaySampler:
    """Returns fixed completions for each prompt (drawn once from a seeded generator), so that the same RLOO
    step can run on two devices: a sampler on each would draw different tokens."""

    def __init__(self, config_values: dict, completion_tokens: int, seed: int = 0):
        self.config_values, self.completion_tokens, self.seed = config_values, completion_tokens, seed

    def sample(self, model, prompts: list[list[int]], num_generations: int):
        from rloo.generation.base import SampledBatch, left_pad

        device = next(model.parameters()).device
        prompt_ids, prompt_mask = left_pad(prompts, self.config_values["pad_token_id"], device)
        rows = []
        for prompt in prompts:  # keyed by the prompt, so the data order cannot change what is drawn
            gen = torch.Generator().manual_seed(self.seed + sum(prompt) % 100_003)
            ids = ordinary_ids(self.config_values, (num_generations, self.completion_tokens), gen)
            lengths = torch.randint(1, self.completion_tokens + 1, (num_generations, 1), generator=gen)
            ids[torch.arange(self.completion_tokens)[None] == lengths - 1] = self.config_values["eos_token_id"]
            ids[torch.arange(self.completion_tokens)[None] >= lengths] = self.config_values["pad_token_id"]
            rows.append((ids, lengths))
        completion_ids = torch.cat([ids for ids, _ in rows]).to(device)
        lengths = torch.cat([length for _, length in rows]).to(device)
        completion_mask = (torch.arange(self.completion_tokens, device=device)[None] < lengths).long()
        return SampledBatch(prompt_ids.repeat_interleave(num_generations, 0),
                            prompt_mask.repeat_interleave(num_generations, 0), completion_ids, completion_mask,
                            torch.ones(completion_ids.shape[0], dtype=torch.bool, device=device))

    def on_optimizer_step(self, model) -> None:
        pass


def even_token_fraction(completions, completion_ids, **kwargs) -> list[float]:
    """A cheap reward with spread: the fraction of a completion's tokens with an even id."""
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def rloo_step(plan: Plan, device: str, model, tokenizer, dataset, output_dir: str) -> dict:
    from rloo import RLOOConfig, RLOOTrainer

    fresh_accelerate_state()
    prompts, k, _, c = plan.rows
    args = RLOOConfig(output_dir=output_dir, use_cpu=device == "cpu", bf16=False, num_generations=k,
                      per_device_train_batch_size=prompts * k, gradient_accumulation_steps=1,
                      max_completion_length=c, max_steps=1, save_steps=0, logging_steps=1, learning_rate=1e-5,
                      beta=0.05, seed=0)
    trainer = RLOOTrainer(model, even_token_fraction, args=args, train_dataset=dataset, processing_class=tokenizer,
                          sampler=ReplaySampler(plan.model, c))
    trainer.save_model = lambda *a, **kw: None  # the step is what is compared, not the saved files
    out = trainer.train()
    metrics = dict(out.metrics)
    del trainer
    return {"loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"]),
            "reward": float(metrics.get("reward", float("nan")))}


def check_rloo_step(plan: Plan) -> dict:
    """One RLOO step in fp32 on `plan.device` against the same step on CPU: same weights, prompts and completions.
    (In the dry run both sides are the CPU: the code path is exercised, the comparison is trivial.)"""
    from datasets import Dataset

    model = build_model(plan.model, "cpu", plan.correctness_layers, seed=11)
    tokenizer = word_tokenizer(plan.model)
    dataset = Dataset.from_list([{"prompt": text} for text in prompt_texts(plan.model, plan.rows[0], plan.rows[2], 1)])
    with tempfile.TemporaryDirectory() as tmp:
        on_device = rloo_step(plan, plan.device, copy.deepcopy(model).to(plan.device), tokenizer, dataset, f"{tmp}/d")
        on_cpu = rloo_step(plan, "cpu", model, tokenizer, dataset, f"{tmp}/c")
    fresh_accelerate_state()
    loss_difference = abs(on_device["loss"] - on_cpu["loss"])
    grad_norm_error = abs(on_device["grad_norm"] - on_cpu["grad_norm"]) / max(on_cpu["grad_norm"], 1e-30)
    return {"device": on_device, "cpu": on_cpu, "loss_abs_diff": loss_difference, "grad_norm_rel_err": grad_norm_error,
            "loss_atol": STEP_LOSS_ATOL, "grad_norm_rtol": STEP_GRAD_NORM_RTOL,
            "passed": loss_difference <= STEP_LOSS_ATOL and grad_norm_error <= STEP_GRAD_NORM_RTOL
            and on_cpu["grad_norm"] > 0}


def fresh_accelerate_state() -> None:
    """accelerate keeps one device and precision per process; each trainer here sets its own. (A private call in
    a benchmark script, not in the package: tests/distributed/test_accelerate_internals.py guards src/rloo only.)"""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


# ---------------------------------------------------------------------------------------------
# Peak and FLOP counts
# ---------------------------------------------------------------------------------------------


def matmul_peak(device: str, size: int, dtype: torch.dtype, repeats: int = 10, warmups: int = 3) -> dict:
    """Median FLOP/s of a size^3 matrix product on random data (CUDA events on a GPU, the wall clock on CPU)."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    seconds = []
    for index in range(warmups + repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.mm(a, b)
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1000
        else:
            begin = time.perf_counter()
            torch.mm(a, b)
            elapsed = time.perf_counter() - begin
        if index >= warmups:
            seconds.append(elapsed)
    median = statistics.median(seconds)
    return {"size": size, "dtype": str(dtype).replace("torch.", ""), "seconds_median": median,
            "tflops": 2 * size ** 3 / median / 1e12}


def decoder_matrix_parameters(config_values: dict) -> int:
    """Weights of the decoder's matrix products per token (attention projections and the MLP), all layers."""
    h, layers = config_values["hidden_size"], config_values["num_hidden_layers"]
    q = config_values["num_attention_heads"] * config_values["head_dim"]
    kv = config_values["num_key_value_heads"] * config_values["head_dim"]
    attention = h * q + 2 * h * kv + q * h
    mlp = 3 * h * config_values["intermediate_size"]
    return layers * (attention + mlp)


def forward_flops(config_values: dict, rows: int, prompt_tokens: int, completion_tokens: int) -> float:
    """Model FLOPs of one forward over `rows` prompt+completion rows: 2 N_decoder per token, 2 V H per completion
    token through the head (rloo and TRL 1.16 both run the head on completion positions only), and causal
    attention, 2 * 2 * heads * head_dim * (T (T + 1) / 2) per layer and row (QK^T and AV)."""
    total = prompt_tokens + completion_tokens
    decoder = 2 * decoder_matrix_parameters(config_values) * total
    head = 2 * config_values["vocab_size"] * config_values["hidden_size"] * completion_tokens
    width = config_values["num_attention_heads"] * config_values["head_dim"]
    attention = 4 * width * total * (total + 1) / 2 * config_values["num_hidden_layers"]
    return rows * (decoder + head + attention)


def training_flops(config_values: dict, rows: int, prompt_tokens: int, completion_tokens: int) -> float:
    """Forward and backward: 3x the forward."""
    return 3 * forward_flops(config_values, rows, prompt_tokens, completion_tokens)


# ---------------------------------------------------------------------------------------------
# Speed sections: the same workload through rloo and TRL, timed by phase
# ---------------------------------------------------------------------------------------------


class Phases:
    """Seconds spent inside wrapped methods, by phase, synchronising the device at both ends of each call; on CUDA
    also each phase's own peak allocation (`peak_<phase>_bytes`: the peak counter is reset when a phase starts,
    and what it held before is carried, so `peak()` is still the peak over everything since `reset_peak()`)."""

    def __init__(self, device: str):
        self.device, self.seconds, self.carried_peak = device, {}, 0

    def reset_peak(self) -> None:
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            self.carried_peak = 0

    def peak(self) -> int | None:
        return max(self.carried_peak, torch.cuda.max_memory_allocated()) if self.device == "cuda" else None

    def wrap(self, owner: Any, name: str, phase: str, only_without_grad: bool = False) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            if only_without_grad and torch.is_grad_enabled():
                return original(*args, **kwargs)
            synchronize(self.device)
            if self.device == "cuda":
                self.carried_peak = max(self.carried_peak, torch.cuda.max_memory_allocated())
                torch.cuda.reset_peak_memory_stats()
            begin = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                synchronize(self.device)
                self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - begin
                if self.device == "cuda":
                    key = f"peak_{phase}_bytes"
                    self.seconds[key] = max(self.seconds.get(key, 0), torch.cuda.max_memory_allocated())

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        taken, self.seconds = self.seconds, {}
        return taken


class CountingReward:
    """even_token_fraction, recording each call's completion count and tokens (both trainers pass completion_ids)."""

    __name__ = "even_token_fraction"

    def __init__(self):
        self.completions, self.tokens = 0, 0

    def __call__(self, completions, completion_ids, **kwargs) -> list[float]:
        self.completions += len(completion_ids)
        self.tokens += sum(len(ids) for ids in completion_ids)
        return even_token_fraction(completions, completion_ids)

    def take(self) -> tuple[int, int]:
        taken = (self.completions, self.tokens)
        self.completions, self.tokens = 0, 0
        return taken


def step_clock(device: str, phases: Phases, reward: CountingReward, warmup_steps: int, budget: Budget):
    """A TrainerCallback recording each optimizer step's seconds, phase seconds and tokens; it resets the peak
    memory counter when the warm-up ends and stops training once the budget is spent."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.steps, self.stopped_by_budget, self.memory_at_start = [], False, None
            self.last = None

        def on_train_begin(self, args, state, control, **kwargs):
            synchronize(device)
            self.last = time.perf_counter()
            phases.take()
            reward.take()
            if warmup_steps == 0:
                self.reset_memory()

        def reset_memory(self):
            if device == "cuda":
                phases.reset_peak()
                self.memory_at_start = torch.cuda.memory_allocated()

        def on_step_end(self, args, state, control, **kwargs):
            synchronize(device)
            now = time.perf_counter()
            completions, tokens = reward.take()
            self.steps.append({"seconds": now - self.last, **phases.take(), "completions": completions,
                               "completion_tokens": tokens})
            self.last = now
            if len(self.steps) == warmup_steps:
                self.reset_memory()
            if budget.left() <= 0:
                control.should_training_stop = True
                self.stopped_by_budget = True
            return control

    return StepClock()


def speed_dataset(plan: Plan, prompts: int, steps: int, seed: int):
    from datasets import Dataset

    texts = prompt_texts(plan.model, prompts * (steps + 1), plan.prompt_tokens, seed)
    return Dataset.from_list([{"prompt": text} for text in texts])


def rloo_trainer(plan: Plan, model, tokenizer, dataset, reward, callback, output_dir: str, completion_tokens: int,
                 micro_batch: int, prompts: int, max_steps: int, lean_activations: bool = True):
    from rloo import RLOOConfig, RLOOTrainer

    completions = prompts * plan.k
    args = RLOOConfig(output_dir=output_dir, num_generations=plan.k, per_device_train_batch_size=micro_batch,
                      gradient_accumulation_steps=completions // micro_batch, max_completion_length=completion_tokens,
                      max_prompt_length=max(512, plan.prompt_tokens), max_steps=max_steps, save_steps=0,
                      logging_steps=max_steps, seed=0, use_cpu=plan.device == "cpu", lean_activations=lean_activations,
                      **({} if plan.device == "cuda" else {"bf16": plan.bf16}))  # on a GPU: rloo's default (auto: on)
    trainer = RLOOTrainer(model, reward, args=args, train_dataset=dataset, processing_class=tokenizer,
                          callbacks=[callback])
    trainer.save_model = lambda *a, **kw: None  # no final save: TRL runs with save_strategy="no"
    return trainer


# TRL's variants: at its defaults, at rloo's settings, and at rloo's settings with each of its own speed switches.
TRL_SETTINGS = {"trl_defaults": {},
                "trl_ours": dict(gradient_checkpointing=False, disable_dropout=True, optim="adamw_torch"),
                "trl_cb": dict(gradient_checkpointing=False, disable_dropout=True, optim="adamw_torch",
                               use_transformers_continuous_batching=True),
                "trl_liger": dict(gradient_checkpointing=False, disable_dropout=True, optim="adamw_torch",
                                  use_liger_kernel=True)}


def trl_trainer(plan: Plan, model, tokenizer, dataset, reward, callback, output_dir: str, completion_tokens: int,
                micro_batch: int, prompts: int, max_steps: int, system: str):
    from trl import RLOOConfig, RLOOTrainer

    completions = prompts * plan.k
    ours_settings = TRL_SETTINGS[system]
    args = RLOOConfig(output_dir=output_dir, num_generations=plan.k, per_device_train_batch_size=micro_batch,
                      gradient_accumulation_steps=completions // micro_batch, max_completion_length=completion_tokens,
                      max_steps=max_steps, logging_steps=max_steps, seed=0, report_to="none", save_strategy="no",
                      disable_tqdm=True, dataloader_num_workers=0, use_cpu=plan.device == "cpu", bf16=plan.bf16,
                      **ours_settings)
    return RLOOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer,
                       callbacks=[callback])


def speed_section(plan: Plan, system: str, model_path: str, tokenizer, budget: Budget, long: bool | str = False
                  ) -> dict:
    """Train `system` ("rloo", "rloo_lean_off", or one of TRL_SETTINGS) for warm-up + timed steps and summarise
    the timed ones. `long`: True for the 4,096-token sizes, "xl" for the 16,384-token ones."""
    import transformers

    fresh_accelerate_state()
    prompts = plan.long_prompts if long else plan.prompts
    completion_tokens = plan.long_completion_tokens if long else plan.completion_tokens
    micro_batch = plan.long_micro_batch if long else plan.micro_batch
    warmup = plan.long_warmup_steps if long else plan.warmup_steps
    steps = plan.long_steps if long else plan.steps
    if long == "xl":
        prompts, completion_tokens, micro_batch = plan.xl_prompts, plan.xl_completion_tokens, plan.xl_micro_batch
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(plan.device)
    dataset = speed_dataset(plan, prompts, warmup + steps, seed=2)
    phases, reward = Phases(plan.device), CountingReward()
    clock = step_clock(plan.device, phases, reward, warmup, budget)
    with tempfile.TemporaryDirectory() as output_dir:
        build_args = (plan, model, tokenizer, dataset, reward, clock, output_dir, completion_tokens, micro_batch,
                      prompts, warmup + steps)
        if system.startswith("rloo"):
            trainer = rloo_trainer(*build_args, lean_activations=system != "rloo_lean_off")
            phases.wrap(trainer.sampler, "sample", "generation")
            phases.wrap(trainer.collector, "logprobs", "no_grad_passes")
            phases.wrap(trainer.learner, "accumulate_gradients", "training_pass")
        else:
            trainer = trl_trainer(*build_args, system=system)
            phases.wrap(trainer.model, "generate", "generation")  # unwrap_model_for_generation yields this object
            if system == "trl_cb":  # continuous batching: TRL calls the model's generate_batch instead
                phases.wrap(trainer.model, "generate_batch", "generation")
            phases.wrap(trainer, "_get_per_token_logps_and_entropies", "no_grad_passes", only_without_grad=True)
            phases.wrap(trainer, "compute_loss", "training_pass")
            phases.wrap(trainer.accelerator, "backward", "training_pass")
        memory_at_rest = torch.cuda.memory_allocated() if plan.device == "cuda" else None
        try:
            trainer.train()
        except OutOfTime as error:  # what the unfinished step had done: its phases' seconds so far
            error.partial = {"system": system, "prompts": prompts, "max_completion_tokens": completion_tokens,
                             "steps": clock.steps, "unfinished_step_phase_seconds": dict(phases.seconds),
                             "unfinished_step_seconds": time.perf_counter() - clock.last if clock.last else None,
                             **({"max_memory_allocated_bytes": phases.peak()} if plan.device == "cuda" else {})}
            raise
    timed = clock.steps[warmup:]
    entry = {"system": system, "prompts": prompts, "k": plan.k, "prompt_tokens": plan.prompt_tokens,
             "max_completion_tokens": completion_tokens, "micro_batch": micro_batch, "warmup_steps": warmup,
             "steps": clock.steps, "timed_steps": len(timed), "stopped_by_budget": clock.stopped_by_budget,
             "memory_at_rest_bytes": memory_at_rest, "settings": trainer_settings(trainer, system)}
    if plan.device == "cuda":
        entry["max_memory_allocated_bytes"] = phases.peak()
        entry["max_memory_reserved_bytes"] = torch.cuda.max_memory_reserved()
        entry["memory_at_timed_start_bytes"] = clock.memory_at_start
    del trainer, model
    release_memory(plan.device)
    if timed:
        entry.update(summarise(plan, timed))
    return entry


def trainer_settings(trainer, system: str) -> dict:
    args = trainer.args
    names = ("gradient_checkpointing", "bf16", "beta", "learning_rate", "optim", "disable_dropout", "temperature",
             "lean_activations", "shared_prefix_forward", "sampler", "use_transformers_continuous_batching",
             "use_liger_kernel")
    return {name: getattr(args, name) for name in names if hasattr(args, name)}


def summarise(plan: Plan, timed: list[dict]) -> dict:
    """Totals and rates over the timed steps."""
    total = {key: sum(step.get(key, 0.0) for step in timed)
             for key in ("seconds", "generation", "no_grad_passes", "training_pass", "completions", "completion_tokens")}
    rows, new_tokens = total["completions"], total["completion_tokens"]
    mean_completion = new_tokens / max(rows, 1)
    trained_tokens = rows * plan.prompt_tokens + new_tokens
    flops = training_flops(plan.model, rows, plan.prompt_tokens, mean_completion)
    other = total["seconds"] - total["generation"] - total["no_grad_passes"] - total["training_pass"]
    peak = PEAK.get("flops")
    return {
        "seconds_per_step": total["seconds"] / len(timed),
        "generation_s_per_step": total["generation"] / len(timed),
        "no_grad_passes_s_per_step": total["no_grad_passes"] / len(timed),
        "training_pass_s_per_step": total["training_pass"] / len(timed),
        "other_s_per_step": other / len(timed),
        "mean_completion_tokens": mean_completion,
        "generation_tokens_per_s": new_tokens / total["generation"] if total["generation"] else None,
        "training_tokens_per_s": trained_tokens / total["training_pass"] if total["training_pass"] else None,
        "step_completion_tokens_per_s": new_tokens / total["seconds"],
        "training_model_flops_per_step": flops / len(timed),
        "training_mfu": flops / total["training_pass"] / peak if peak and total["training_pass"] else None,
        # each phase's own peak allocation over the timed steps (CUDA; None on CPU)
        **{f"peak_{phase}_bytes": max((step.get(f"peak_{phase}_bytes") or 0 for step in timed), default=0) or None
           for phase in ("generation", "no_grad_passes", "training_pass")},
    }


PEAK: dict = {}  # the measured matmul peak (FLOP/s), set by the matmul_peak section


def release_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def estimate_seconds(name: str, plan: Plan, results: Results) -> float | None:
    """A section's expected seconds from the rloo 512-token run (None: no estimate, run it)."""
    base = results.data["sections"].get("speed_rloo_512", {})
    if "seconds_per_step" not in base:
        return None
    steps = plan.warmup_steps + plan.steps
    if name.startswith("speed_trl"):  # generate is slower per token than the fast sampler; allow 1.6x
        return 1.6 * base["seconds_per_step"] * steps + 15
    if name == "speed_rloo_lean_off_512":
        return 1.2 * base["seconds_per_step"] * steps + 15
    if name == "speed_rloo_4096":
        per_token = base["generation_s_per_step"] / plan.completion_tokens  # launch-bound: ~flat in batch size
        tokens = plan.long_prompts * (plan.prompt_tokens + plan.long_completion_tokens) / (
            plan.prompts * (plan.prompt_tokens + plan.completion_tokens))
        # 2.5x the 512-token decode step: at up to 4,224 cached positions attention and the GQA key/value expansion
        # grow, and the section has no warm-up step for its new shapes. With 1.2x (182 s) on an H100 on 2026-11-27
        # the section had not finished its one step after about 295 s (docs/benchmarks.md).
        per_step = 2.5 * per_token * plan.long_completion_tokens + 1.5 * tokens * (
            base["training_pass_s_per_step"] + base["no_grad_passes_s_per_step"]) + base["other_s_per_step"]
        return (plan.long_warmup_steps + plan.long_steps) * per_step + 15
    return None


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------


def environment(plan: Plan) -> dict:
    import importlib.metadata as metadata

    versions = {}
    for name in ("torch", "transformers", "accelerate", "datasets", "peft", "trl", "tokenizers", "safetensors",
                 "pyarrow", "rloo"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    import rloo

    entry = {"versions": versions, "python": platform.python_version(), "rloo_imported_from": str(Path(rloo.__file__)),
             "declared_requirements": declared_requirements_met(), "torch_threads": torch.get_num_threads(),
             "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
             "float32_matmul_precision": torch.get_float32_matmul_precision()}
    if plan.device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        entry["card"] = {"name": properties.name, "memory_bytes": properties.total_memory,
                         "multiprocessors": properties.multi_processor_count,
                         "capability": f"{properties.major}.{properties.minor}", "cuda": torch.version.cuda}
    else:
        entry["card"] = {"name": f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"}
    return entry


def declared_requirements_met() -> dict:
    """pyproject.toml's dependencies against the installed releases ({requirement: installed version or None,
    met})."""
    import importlib.metadata as metadata

    from packaging.requirements import Requirement

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        return {"note": "tomllib needs Python 3.11"}
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    report = {}
    for text in declared:
        requirement = Requirement(text)
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            installed = None
        report[text] = {"installed": installed,
                        "met": installed is not None and requirement.specifier.contains(installed, prereleases=True)}
    return report


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def run_section(results: Results, name: str, budget: Budget, function: Callable[[], dict],
                estimate: float | None = None, wanted: set[str] | None = None) -> dict | None:
    """Run one guarded section and record it: ok with its figures, failed with the error, or skipped."""
    if wanted and name not in wanted:
        return None
    if budget.left() <= 0 or (estimate is not None and estimate > budget.left()):
        entry = {"status": "skipped", "reason": f"time budget: {budget.left():.0f} s left"
                 + (f", about {estimate:.0f} s needed" if estimate is not None else "")}
        results.record(name, entry)
        print(f"[gpu_check] {name}: skipped ({entry['reason']})", flush=True)
        return entry
    print(f"[gpu_check] {name} ...", flush=True)
    # Recorded first, so that a run killed from outside still says which section it was in and since when.
    results.record(name, {"status": "running", "started_after_s": budget.used(),
                          **({"estimated_seconds": estimate} if estimate is not None else {})})
    begin = time.perf_counter()
    try:
        entry = {"status": "ok", **function()}
    except OutOfTime as error:
        entry = {"status": "stopped", "reason": str(error), **error.partial}
    except Exception as error:  # noqa: BLE001 - one failed section must not lose the others
        entry = {"status": "failed", "error": f"{type(error).__name__}: {error}"[:2000],
                 "traceback": traceback.format_exc()[-4000:]}
    entry["seconds"] = time.perf_counter() - begin
    if estimate is not None:
        entry["estimated_seconds"] = estimate
    results.record(name, entry)
    verdict = entry["status"] if "passed" not in entry else ("passed" if entry["passed"] else "FAILED CHECK")
    print(f"[gpu_check] {name}: {verdict} in {entry['seconds']:.1f} s"
          + (f" ({entry.get('error') or entry.get('reason')})" if entry["status"] in ("failed", "stopped") else ""),
          flush=True)
    if entry["status"] in ("failed", "stopped"):
        release_memory(results.data["device"])
    return entry


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--cpu-tiny", action="store_true", help="the dry run: tiny sizes on CPU")
    parser.add_argument("--budget-s", type=float, default=None, help="wall-clock budget (default 420 GPU, 600 CPU)")
    parser.add_argument("--sections", default="", help="comma-separated section names to run (default: all)")
    parser.add_argument("--timed-steps", type=int, default=None,
                        help="timed steps per 512-token speed section, after its warm-up (default 3)")
    args = parser.parse_args(argv)
    if not args.cpu_tiny and not torch.cuda.is_available():
        parser.error("no CUDA device: the check runs on a GPU; --cpu-tiny is the dry run on CPU")
    plan = tiny_plan(args) if args.cpu_tiny else gpu_plan(args)
    if args.timed_steps is not None:
        if args.timed_steps < 1:
            parser.error(f"--timed-steps must be >= 1, got {args.timed_steps}")
        plan = replace(plan, steps=args.timed_steps)
    budget = Budget(plan.budget_s)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted = {s.strip() for s in args.sections.split(",") if s.strip()} or None
    import transformers

    transformers.logging.set_verbosity_error()
    header = {"schema": 1, "mode": "cpu-tiny" if args.cpu_tiny else "gpu", "device": plan.device,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "plan": asdict(plan), "tolerances": {**TOLERANCE, "worst_parameter_factor": WORST_PARAMETER_FACTOR,
                                                   "step_loss_atol": STEP_LOSS_ATOL,
                                                   "step_grad_norm_rtol": STEP_GRAD_NORM_RTOL}}
    results = Results(out_dir, header)
    # `timeout` sends SIGTERM: end the way an error would, so the table of what finished is still written.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"stopped by signal {signum}"))
    stop_at_budget_end(budget)
    try:
        run_sections(plan, results, budget, wanted)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        results.data["total_seconds"] = budget.used()
        results.write()
        table = render_table(results.data)
        (out_dir / "gpu_check.md").write_text(table)
        print(table, flush=True)
    return results.data


def run_sections(plan: Plan, results: Results, budget: Budget, wanted: set[str] | None) -> None:
    run_section(results, "environment", budget, lambda: environment(plan), wanted=wanted)

    def peak() -> dict:
        measured = matmul_peak(plan.device, plan.peak_size, torch.bfloat16 if plan.device == "cuda" else torch.float32)
        PEAK["flops"] = measured["tflops"] * 1e12
        return measured

    run_section(results, "matmul_peak", budget, peak, wanted=wanted)
    for precision in ("fp32", "bf16"):
        run_section(results, f"tiled_head_{precision}", budget, lambda: check_tiled_head(plan, precision), wanted=wanted)
        run_section(results, f"lean_activations_{precision}", budget, lambda: check_lean_activations(plan, precision),
                    wanted=wanted)
        run_section(results, f"shared_prefix_{precision}", budget, lambda: check_shared_prefix(plan, precision),
                    wanted=wanted)
    run_section(results, "sampler_same_draws", budget, lambda: check_sampler_draws(plan), wanted=wanted)
    run_section(results, "rloo_step_cuda_vs_cpu", budget, lambda: check_rloo_step(plan), wanted=wanted)

    # In this order: TRL's own speed switches before its defaults, so that a short budget drops the defaults first.
    systems = {"speed_rloo_512": "rloo", "speed_trl_ours_512": "trl_ours", "speed_trl_cb_512": "trl_cb",
               "speed_trl_liger_512": "trl_liger", "speed_trl_defaults_512": "trl_defaults",
               "speed_rloo_16384": "rloo", "speed_rloo_4096": "rloo", "speed_rloo_lean_off_512": "rloo_lean_off"}
    if wanted is not None and not wanted & set(systems):
        return
    tokenizer = word_tokenizer(plan.model)
    with tempfile.TemporaryDirectory() as model_dir:
        run_section(results, "random_model", budget, lambda: save_random_model(plan, model_dir))
        for name, system in systems.items():
            if system.startswith("trl") and importlib.util.find_spec("trl") is None:
                results.record(name, {"status": "skipped", "reason": "trl is not installed"})
                continue
            if system == "trl_liger" and (wanted is None or name in wanted) and importlib.util.find_spec(
                    "liger_kernel") is None:
                results.record(name, {"status": "skipped", "reason": "liger_kernel is not installed"})
                continue
            if name == "speed_rloo_16384" and (wanted is None or name not in wanted):
                continue  # only when named: one step of 16,384 tokens takes minutes on a GPU
            size = "xl" if name.endswith("16384") else name.endswith("4096")
            run_section(results, name, budget,
                        lambda: speed_section(plan, system, model_dir, tokenizer, budget, long=size),
                        estimate=estimate_seconds(name, plan, results), wanted=wanted)


def save_random_model(plan: Plan, folder: str) -> dict:
    """The speed sections' model, built once on the device with random weights and saved (fp32), so that every
    trainer starts from the same weights and TRL can build its reference from the path."""
    model = build_model(plan.model, plan.device)
    model.save_pretrained(folder)
    parameters = sum(p.numel() for p in model.parameters())
    del model
    release_memory(plan.device)
    return {"parameters": parameters, "decoder_matrix_parameters": decoder_matrix_parameters(plan.model)}


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def render_table(data: dict) -> str:
    sections = data["sections"]
    environment_entry = sections.get("environment", {})
    card = environment_entry.get("card", {}).get("name", data["device"])
    versions = environment_entry.get("versions", {})
    lines = [f"# rloo GPU check ({data['mode']}): {card}, {data['date']}", "",
             "torch " + _fmt(versions.get("torch")) + ", transformers " + _fmt(versions.get("transformers"))
             + ", accelerate " + _fmt(versions.get("accelerate")) + ", trl " + _fmt(versions.get("trl"))
             + f"; {_fmt(data.get('total_seconds'), 4)} s in all", ""]
    peak = sections.get("matmul_peak", {})
    if "tflops" in peak:
        lines += [f"Measured {peak['dtype']} matmul peak: {peak['tflops']:.1f} TFLOP/s ({peak['size']}^3)", ""]
    lines += ["| check | status | log-prob err | entropy err | grad err (worst) | tolerance |", "|---|---|---|---|---|---|"]
    for name, entry in sections.items():
        if name.startswith(("tiled_head", "lean_activations", "shared_prefix")):
            status = entry["status"] if "passed" not in entry else ("pass" if entry["passed"] else "FAIL")
            lines.append(f"| {name} | {status} | {_fmt(entry.get('logp_rel_err'))} | {_fmt(entry.get('entropy_rel_err'))} "
                         f"| {_fmt(entry.get('grad_rel_err'))} ({_fmt(entry.get('grad_worst_rel_err'))}) "
                         f"| {_fmt(entry.get('tolerance'))} |")
    sampler = sections.get("sampler_same_draws", {})
    if sampler:
        same = ", ".join(f"{s['rows_identical']}/{s['rows']}" for s in sampler.get("settings", []))
        lines.append(f"| sampler_same_draws | {_status(sampler)} | rows identical: {same or '-'} | | | all |")
    step = sections.get("rloo_step_cuda_vs_cpu", {})
    if step:
        lines.append(f"| rloo_step_cuda_vs_cpu | {_status(step)} | loss diff {_fmt(step.get('loss_abs_diff'))} | "
                     f"| grad-norm err {_fmt(step.get('grad_norm_rel_err'))} | {STEP_LOSS_ATOL:g} / {STEP_GRAD_NORM_RTOL:g} |")
    lines += ["", "| run | status | new tokens | s/step | generation tok/s | training tok/s | no-grad s/step "
              "| max allocated GB | training MFU | own peak GB: generation / no-grad / training |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, entry in sections.items():
        if not name.startswith("speed_"):
            continue
        memory = entry.get("max_memory_allocated_bytes")
        lines.append(f"| {name} | {_status(entry)} | {_fmt(entry.get('max_completion_tokens'))} "
                     f"| {_fmt(entry.get('seconds_per_step'))} | {_fmt(entry.get('generation_tokens_per_s'), 4)} "
                     f"| {_fmt(entry.get('training_tokens_per_s'), 4)} | {_fmt(entry.get('no_grad_passes_s_per_step'))} "
                     f"| {_fmt(memory / 1e9 if memory else None)} | {_fmt(entry.get('training_mfu'))} | "
                     + " / ".join(_fmt(entry[key] / 1e9 if entry.get(key) else None) for key in (
                         "peak_generation_bytes", "peak_no_grad_passes_bytes", "peak_training_pass_bytes")) + " |")
    by_status = {status: [name for name, entry in sections.items() if entry.get("status") == status]
                 for status in ("failed", "stopped", "running", "skipped")}
    if any(by_status.values()):
        lines += ["", "; ".join(f"{status}: {', '.join(names) or '-'}" for status, names in by_status.items())]
    for name in by_status["stopped"]:
        entry = sections[name]
        unfinished = entry.get("unfinished_step_phase_seconds") or {}
        lines.append(f"\n{name}: {entry.get('reason')} after {_fmt(entry.get('seconds'))} s, "
                     f"{len(entry.get('steps', []))} step(s) finished; the unfinished step had run "
                     f"{_fmt(entry.get('unfinished_step_seconds'))} s ("
                     + ", ".join(f"{phase} {_fmt(seconds)} s" for phase, seconds in unfinished.items()) + ")")
    return "\n".join(lines) + "\n"


def _status(entry: dict) -> str:
    if entry.get("status") != "ok":
        return entry.get("status", "-")
    if "passed" in entry:
        return "pass" if entry["passed"] else "FAIL"
    return "ok" + (" (budget cut)" if entry.get("stopped_by_budget") else "")


if __name__ == "__main__":
    main()

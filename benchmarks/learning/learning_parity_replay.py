"""The same completions through both trainers for a whole run: do rloo and TRL update alike over 128 steps?

    python benchmarks/learning/learning_parity_replay.py --instance A --seed 0                 # rloo samples, TRL replays
    python benchmarks/learning/learning_parity_replay.py --instance A --seed 0 --sampler trl   # TRL samples, rloo replays
    python benchmarks/learning/learning_parity_replay.py --instance B --draws 128              # the two samplers' draws

`learning_parity.py`'s run, twice from the same warm start: first one trainer samples and trains as
usual while every completion it draws is recorded (token ids up to and including EOS, or all 8 when
truncated); then the other trainer trains on exactly those completions, step by step (its generation
replaced, the prompts of each step checked equal). Everything else is each library's own: prompt order,
tokenisation, rewards, advantages, the loss over short and truncated completions, clipping, the
learning rate at each step and AdamW's state. If both update alike, the two runs stay together: the
per-step gradient norms agree, the weights end equal up to rounding, and so do the held-out
accuracies. Prints the comparison and writes it to --out.

`--draws N` compares the samplers instead: from the warm start and the same random state, N steps' worth
of prompts (8 a step, K=4, the run's prompt order for --seed) sampled by rloo's sampler and by
`generate` as TRL calls it (each prompt's K copies in a row, TRL's generation settings); counts the
completions drawn the same and each side's reward.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "src"))

import learning_parity as parity  # noqa: E402 (settings, data, warm start, evaluation, both trainers)


class RecordingSampler:
    """rloo's side when it samples: its own sampler, with every step's prompts and completions recorded."""

    def __init__(self, inner, steps: list):
        self.inner, self.steps = inner, steps

    def sample(self, model, prompts, num_generations, **kwargs):
        batch = self.inner.sample(model, prompts, num_generations, **kwargs)
        completions = [ids[mask.bool()].tolist() for ids, mask in zip(batch.completion_ids, batch.completion_mask)]
        self.steps.append({"prompts": [list(p) for p in prompts for _ in range(num_generations)],
                           "completions": completions})
        return batch

    def on_optimizer_step(self, model):
        self.inner.on_optimizer_step(model)


class ReplaySampler:
    """rloo's side when TRL sampled: each step's recorded completions (rloo.generation's SampledBatch)."""

    def __init__(self, steps: list, pad_id: int, eos_ids: list[int]):
        self.steps, self.pad_id, self.eos_ids, self.calls = steps, pad_id, eos_ids, 0

    def sample(self, model, prompts, num_generations, **kwargs):
        from rloo.generation import SampledBatch, completion_mask_from_eos, left_pad

        step = self.steps[self.calls]
        self.calls += 1
        repeated = [list(p) for p in prompts for _ in range(num_generations)]
        if repeated != step["prompts"]:
            raise RuntimeError(f"step {self.calls}: rloo's prompts differ from the recorded ones")
        width = max(map(len, step["completions"]))
        ids = torch.tensor([c + [self.pad_id] * (width - len(c)) for c in step["completions"]])
        mask, has_eos = completion_mask_from_eos(ids, self.eos_ids)
        mask = torch.minimum(mask, torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in step["completions"]]))
        prompt_ids, prompt_mask = left_pad(repeated, self.pad_id)
        return SampledBatch(prompt_ids, prompt_mask, ids, mask, has_eos)

    def on_optimizer_step(self, model):
        pass


def trl_recording(trainer, steps: list):
    """TRL's side when it samples: its own `_generate_single_turn`, recorded."""
    inner = trainer._generate_single_turn

    def generate(prompt_ids, images, multimodal_fields):
        completions = inner(prompt_ids, images, multimodal_fields)
        steps.append({"prompts": [list(p) for p in prompt_ids], "completions": [list(c) for c in completions]})
        return completions

    return generate


def trl_replay(steps: list):
    """TRL's side when rloo sampled: each step's recorded completions, in TRL's row order (checked)."""
    calls = [0]

    def generate(prompt_ids, images, multimodal_fields):
        step = steps[calls[0]]
        calls[0] += 1
        if [list(p) for p in prompt_ids] != step["prompts"]:
            raise RuntimeError(f"step {calls[0]}: TRL's prompts differ from the recorded ones")
        return [list(c) for c in step["completions"]]

    return generate


def train(system: str, role: str, model_dir: str, seed: int, steps: list) -> dict:
    """One run of `system`, sampling and recording (role "sample") or replaying `steps` (role "replay")."""
    import transformers

    from rloo.model_loading import load_tokenizer

    tokenizer = load_tokenizer(model_dir, "warm start")
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    train_set, held_out = parity.parity_split()
    reward = parity.Recorder(tokenizer.eos_token_id, parity.RL["max_new_tokens"])
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = parity.build_trainer(system, model, tokenizer, train_set, reward, output_dir, seed)
        if system == "trl":
            trainer._generate_single_turn = trl_recording(trainer, steps) if role == "sample" else trl_replay(steps)
        else:
            sampler = (RecordingSampler(trainer.sampler, steps) if role == "sample"
                       else ReplaySampler(steps, tokenizer.pad_token_id, trainer.sampler.eos_token_ids))
            trainer.sampler = trainer.collector.sampler = sampler
        trainer.train()
        history = list(trainer.state.log_history)
    return {"model": model, "grad_norms": [float(e["grad_norm"]) for e in history if "grad_norm" in e],
            "step_rewards": [c["reward"] for c in reward.calls],
            "held_out_after": parity.held_out_accuracy(model, tokenizer, held_out)}


def compare_draws(model_dir: str, seed: int, steps: int) -> dict:
    """rloo's FastSampler against TRL's `generate` call on the same prompts from the same random state."""
    import transformers
    from transformers import GenerationConfig

    from rloo.data.prompts import tokenize_prompts
    from rloo.data.schedule import PromptSchedule
    from rloo.generation import FastSampler
    from rloo.model_loading import load_tokenizer
    from rloo.rewards import exact_match

    tokenizer = load_tokenizer(model_dir, "warm start")
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    train_set, _ = parity.parity_split()
    k, eos, pad = parity.RL["num_generations"], tokenizer.eos_token_id, tokenizer.pad_token_id
    fast = FastSampler(pad_token_id=pad, eos_token_ids=[eos], max_new_tokens=parity.RL["max_new_tokens"],
                       temperature=1.0, top_k=0, top_p=1.0)
    config = GenerationConfig(max_new_tokens=parity.RL["max_new_tokens"], do_sample=True, pad_token_id=pad,
                              bos_token_id=tokenizer.bos_token_id, eos_token_id=[eos], temperature=1.0, top_p=1.0,
                              top_k=0, min_p=None, repetition_penalty=1.0, disable_compile=True)  # TRL's
    schedule = PromptSchedule(len(train_set), parity.RL["prompts_per_step"], 1, seed)
    same = total = 0
    rewards = {"rloo": [], "trl": []}
    for step in range(steps):
        rows = [train_set[i] for i in schedule.rows(step, 0)]
        prompt_ids = tokenize_prompts([r["prompt"] for r in rows], tokenizer, tokenizer.model_max_length)
        answers = [r["answer"] for r in rows for _ in range(k)]
        torch.manual_seed(seed * 100_000 + step)
        batch = fast.sample(model, prompt_ids, k)
        ours = [ids[mask.bool()].tolist() for ids, mask in zip(batch.completion_ids, batch.completion_mask)]
        torch.manual_seed(seed * 100_000 + step)
        repeated = torch.tensor([p for p in prompt_ids for _ in range(k)])  # equal lengths here: no padding
        with torch.no_grad():
            out = model.generate(input_ids=repeated, attention_mask=torch.ones_like(repeated), generation_config=config)
        theirs = []
        for row in out[:, repeated.shape[1]:].tolist():
            theirs.append(row[: row.index(eos) + 1] if eos in row else row)
        same += sum(a == b for a, b in zip(ours, theirs))
        total += len(ours)
        for name, drawn in (("rloo", ours), ("trl", theirs)):
            rewards[name] += exact_match(tokenizer.batch_decode(drawn, skip_special_tokens=True), answers)
    return {"seed": seed, "steps": steps, "completions": total, "same_completions": same,
            "reward": {name: sum(r) / len(r) for name, r in rewards.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instance", default="A", choices=list(parity.INSTANCES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sampler", default="rloo", choices=["rloo", "trl"], help="which trainer samples")
    parser.add_argument("--draws", type=int, default=0, help="compare the samplers' draws over this many steps instead")
    parser.add_argument("--cache-dir", type=Path, default=HERE.parent / ".cache")
    parser.add_argument("--out", type=Path, default=None)
    options = parser.parse_args()

    torch.set_num_threads(1)
    import transformers

    transformers.logging.set_verbosity_error()
    model_dir = str(parity.warm_start(options.instance, options.cache_dir))
    if options.draws:
        result = {"instance": options.instance, **compare_draws(model_dir, options.seed, options.draws)}
        print(json.dumps(result))
        out = options.out or HERE.parent / "results" / f"learning_parity_draws_{options.instance}{options.seed}.json"
        out.write_text(json.dumps(result, indent=1))
        return
    replayer = "trl" if options.sampler == "rloo" else "rloo"
    steps: list = []
    first = train(options.sampler, "sample", model_dir, options.seed, steps)
    second = train(replayer, "replay", model_dir, options.seed, steps)
    start = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.set_grad_enabled(False)
    moved = sum(float((p - q).pow(2).sum()) for p, q in zip(first["model"].parameters(), start.parameters())) ** 0.5
    apart = sum(float((p - q).pow(2).sum()) for p, q in zip(first["model"].parameters(),
                                                             second["model"].parameters())) ** 0.5
    norm_ratio = [b / a for a, b in zip(first["grad_norms"], second["grad_norms"]) if a > 0]
    eos_id = start.generation_config.eos_token_id
    truncated = sum(sum(len(c) == parity.RL["max_new_tokens"] and c[-1] != eos_id for c in s["completions"])
                    for s in steps)
    result = {
        "instance": options.instance, "seed": options.seed, "sampler": options.sampler, "replayer": replayer,
        "steps": len(steps), "completions": sum(len(s["completions"]) for s in steps), "truncated_completions": truncated,
        "lengths": sorted({len(c) for s in steps for c in s["completions"]}),
        "rewards_equal": first["step_rewards"] == second["step_rewards"],
        "grad_norm_ratio_min": min(norm_ratio), "grad_norm_ratio_max": max(norm_ratio),
        "grad_norms": {options.sampler: first["grad_norms"], replayer: second["grad_norms"]},
        "parameter_distance_moved": moved, "parameter_distance_between": apart,
        "held_out_after": {options.sampler: first["held_out_after"], replayer: second["held_out_after"]},
    }
    print(json.dumps({k: v for k, v in result.items() if k != "grad_norms"}, indent=1))
    name = f"learning_parity_replay_{options.instance}{options.seed}_{options.sampler}.json"
    out = options.out or HERE.parent / "results" / name
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

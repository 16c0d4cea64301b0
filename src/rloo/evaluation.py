"""Eval: sample `num_generations_eval` completions of every eval prompt and score them.

Metrics (prefix `eval/`, TRL's names where TRL has one): `reward`, `reward_std` (within a prompt's
group), `rewards/{name}/mean` and `/std`, `completions/mean_length`, `/min_length`, `/max_length`,
`completions/clipped_ratio` (truncated: no EOS or stop), `completions/mean_terminated_length`,
`/min_terminated_length`, `/max_terminated_length` (of the completions that ended), and for
rewards that are all 0 or 1 (correct or not) `pass@k` for k in 1, 2, 4, ... up to n = num_generations_eval,
from the unbiased estimator of Chen et al. (2021): pass@k = 1 - C(n - c, k) / C(n, k) for c correct of n samples, averaged
over prompts. `pass@k` is the weighted reward's; `rewards/{name}/pass@k` each binary function's.
With tools or environments, `tools/call_frequency` and `tools/failure_frequency` as in training.

Given a `samples` list, `evaluate` also fills it with one row per scored sample, in the eval set's order:
its row `index`, prompt, completion (a trajectory as its messages, then its `turns` records), each reward function's
value and the weighted `score` (eval_completions.jsonl from `RLOOTrainer.evaluate` with log_completions;
eval_samples.jsonl from `rloo eval`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch
from accelerate.utils import gather_object
from tqdm.auto import tqdm

from rloo.data.schedule import select_rows
from rloo.generation.base import SampledBatch, model_token_mask
from rloo.rewards.scoring import reward_function_metrics
from rloo.run.metrics import length_metrics, reward_cells, with_turns


def pass_at_k(num_samples: int, num_correct: torch.Tensor, k: int) -> torch.Tensor:
    """Unbiased pass@k per problem: the chance that k of the n samples, drawn without replacement,
    hold at least one correct one: 1 - C(n - c, k) / C(n, k).

    num_correct: (P,) correct samples of each problem, 0 <= c <= n. Returns (P,) float64.
    """
    if not 1 <= k <= num_samples:
        raise ValueError(f"pass@k needs 1 <= k <= n; got k={k}, n={num_samples}.")
    c = num_correct.to(torch.float64)
    n = torch.full_like(c, float(num_samples))
    # log C(n - c, k) - log C(n, k) through lgamma; C(n - c, k) = 0 (certain pass) when n - c < k.
    def log_choose(a: torch.Tensor, b: float) -> torch.Tensor:
        return torch.lgamma(a + 1) - torch.lgamma(torch.full_like(a, b + 1)) - torch.lgamma(a - b + 1)

    fail = torch.exp(log_choose((n - c).clamp(min=k), k) - log_choose(n, k))
    return torch.where(n - c < k, torch.ones_like(c), 1.0 - fail)


def pass_at_k_values(n: int) -> list[int]:
    """The k reported for n samples: 1, 2, 4, ... below n, and n."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def is_binary(values: torch.Tensor) -> bool:
    """All scored values (NaN: not scored) are 0 or 1, and some are scored."""
    scored = values[~values.isnan()]
    return scored.numel() > 0 and bool(((scored == 0) | (scored == 1)).all())


def policy_loss_at_ratio_one(scores: torch.Tensor, valid: torch.Tensor, lengths: torch.Tensor, estimator: str,
                             loss_agg_mode: str, max_completion_length: int) -> float:
    """The policy-gradient loss an optimizer step on this batch would start from (ratio 1, no KL term):
    TRL's `eval_loss`. Advantages within each prompt's group, -A per completion token, aggregated as in training.

    scores: (P, n) rewards; valid: (P, n) bool, some function scored the sample; lengths: (P, n) tokens.
    """
    from rloo.algo.advantages import compute_advantages
    from rloo.algo.loss import loss_denominator, reduce_to_sequences

    advantages = compute_advantages(scores.float(), estimator, valid).flatten()  # (B,)
    lengths = lengths.flatten()
    width = max(int(lengths.max()), 1)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float() * valid.flatten()[:, None]  # (B, T)
    numerators = reduce_to_sequences(-advantages[:, None].expand(-1, width), mask, loss_agg_mode, max_completion_length)
    return (numerators.sum() / loss_denominator(loss_agg_mode, mask).clamp(min=1e-8)).item()


def eval_metrics(scores: torch.Tensor, per_function: torch.Tensor, names: Sequence[str], lengths: torch.Tensor,
                 truncated: torch.Tensor, prefix: str = "eval/") -> dict[str, float]:
    """Eval metrics of P prompts with n samples each.

    scores: (P, n) weighted reward; per_function: (P, n, F) each function's value, NaN where it did not
    apply; lengths: (P, n) completion tokens; truncated: (P, n) bool, no EOS or stop.
    """
    n = scores.shape[1]
    metrics = {
        "reward": scores.mean().item(),
        "reward_std": (scores.std(dim=1) if n > 1 else torch.zeros(scores.shape[0])).mean().item(),
        **length_metrics(lengths.flatten(), truncated.flatten()),
    }
    per_name = reward_function_metrics(list(names), per_function.flatten(0, 1))  # mean and std of what each scored
    metrics.update({key: value for key, value in per_name.items() if key != "rewards/unscored_frac"})
    # pass@k of the weighted reward and of each function; is_binary skips a function that scored nothing.
    columns = [("", scores), *((f"rewards/{name}/", per_function[..., i]) for i, name in enumerate(names))]
    for label, column in columns:
        if not is_binary(column):
            continue
        correct = (column == 1).sum(dim=1)  # (P,) NaN (not scored) counts as not correct
        for k in pass_at_k_values(n):
            metrics[f"{label}pass@{k}"] = pass_at_k(n, correct, k).mean().item()
    return {prefix + key: value for key, value in metrics.items()}


def sample_rows(indices: Sequence[int], num_generations: int, prompts: Sequence[Any], completions: Sequence[Any],
                reward_names: Sequence[str], scored: Any, label: dict[str, Any],
                turns: Sequence[Any] | None = None) -> list[dict[str, Any]]:
    """One row per sample of the prompts at dataset `indices` (K samples each, contiguous): `label`'s fields, index,
    sample number, prompt, completion, a trajectory's `turns` (`Samples.turn_records`: each turn's text, tool calls
    and results), each function's value (None where it did not apply) and the weighted score."""
    rows = []
    for b, (prompt, completion) in enumerate(zip(prompts, completions)):
        rows.append({**label, "index": indices[b // num_generations], "sample": b % num_generations, "prompt": prompt,
                     "completion": completion, **with_turns(turns, b), **reward_cells(reward_names, scored.per_function[b]),
                     "score": float(scored.scores[b])})
    return rows


def first_prompts(sampled: SampledBatch, num_prompts: int, num_generations: int) -> SampledBatch:
    """The groups of the first `num_prompts` prompts of a batch (rows b*K + k of prompt b)."""
    rows = num_prompts * num_generations
    return dataclasses.replace(sampled, **{
        field.name: value[:rows] for field in dataclasses.fields(sampled)
        if isinstance(value := getattr(sampled, field.name), torch.Tensor)})


@torch.no_grad()
def evaluate(collector: Any, dataset: Any, reward_names: Sequence[str], num_generations: int,
             prompts_per_batch: int, global_step: int, prefix: str = "eval/",
             samples: list[dict[str, Any]] | None = None, eval_set: str | None = None) -> dict[str, float]:
    """Sample `num_generations` completions of every prompt of `dataset` (split over processes),
    score them with the collector's reward functions (`RolloutCollector.score`, unshaped) and return
    `eval_metrics` on every process.

    Every process makes the same number of `sample` calls: under sharding (FSDP2, ZeRO-3) each call
    gathers the weights, a collective. Where the split is uneven, a process whose share ran out
    fills its batch with a copy of a row, samples it and drops it unscored, so each prompt is
    counted exactly once. `samples`, when given, receives every scored sample's row (`sample_rows`, labelled with
    the step and, for one of several eval sets, `eval_set`) on every process."""
    acc = collector.accelerator
    rows_scored: list[dict[str, Any]] = []
    indices = list(range(acc.process_index, len(dataset), acc.num_processes))
    per_process = -(-len(dataset) // acc.num_processes)  # the largest share
    parts: dict[str, list[torch.Tensor]] = {"scores": [], "per_function": [], "lengths": [], "truncated": [],
                                            "tool_counts": []}
    was_training = collector.model.training
    collector.model.eval()
    # One tick per batch of prompts, on the main process; it counts every process's prompts. At position 0
    # (over the training bar, which redraws at its next step): a nested bar would move the cursor with escapes.
    progress = tqdm(total=len(dataset), unit="prompt", desc=f"eval ({num_generations} completions each)",
                    disable=acc.process_index != 0, dynamic_ncols=True, leave=False, position=0)
    for start in range(0, per_process, prompts_per_batch):
        rows = select_rows(dataset, indices[start : start + prompts_per_batch])
        batch_size = min(prompts_per_batch, per_process - start)  # the same on every process
        filler = rows[-1:] or select_rows(dataset, [0])  # a copy of a row: no extra prompt padding
        # With tools, environments or a rollout_func, each completion is a trajectory (rollout.multi_turn).
        sampled, episodes = collector.sample_rows(rows + filler * (batch_size - len(rows)), num_generations)
        progress.update(min(batch_size * acc.num_processes, len(dataset) - progress.n))
        if episodes is not None:  # (trajectories, calls, failed calls) of the batch sampled, a filler copy's included
            parts["tool_counts"].append(torch.tensor([[batch_size * num_generations, episodes.tool_calls,
                                                       episodes.tool_failures]], dtype=torch.float64))
        if not rows:
            continue
        sampled = first_prompts(sampled, len(rows), num_generations)
        episodes = None if episodes is None else episodes.first(len(rows) * num_generations)
        scored, texts = collector.score(rows, sampled, num_generations, global_step, episodes=episodes)
        if samples is not None:
            label = {"step": global_step, **({} if eval_set is None else {"eval_set": eval_set})}
            rows_scored += sample_rows(indices[start : start + len(rows)], num_generations, texts.prompts,
                                       texts.shown(), reward_names, scored, label, texts.turn_records())
        shape = (len(rows), num_generations)
        parts["scores"].append(scored.scores.float().cpu().view(shape))
        parts["per_function"].append(scored.per_function.float().cpu().view(*shape, -1))
        parts["lengths"].append(model_token_mask(sampled.completion_mask, sampled.tool_mask).sum(dim=1).cpu().view(shape))
        parts["truncated"].append((~sampled.has_eos).cpu().view(shape))
    progress.close()
    collector.model.train(was_training)
    if samples is not None:  # every process's rows, back in the eval set's order
        samples += sorted((row for part in gather_object([rows_scored]) for row in part), key=lambda r: r["index"])
    return gathered_metrics(collector.args, parts, reward_names, prefix)


def gathered_metrics(args: Any, parts: dict[str, list[torch.Tensor]], reward_names: Sequence[str],
                     prefix: str) -> dict[str, float]:
    """`eval_metrics`, TRL's eval_loss and the tools/ figures of every process's `parts` (gathered here)."""
    local = {key: torch.cat(values) for key, values in parts.items() if values}
    gathered = [part for part in gather_object([local]) if part]  # one dict per process
    merged = {key: torch.cat([part[key] for part in gathered if key in part]) for key in parts
              if any(key in part for part in gathered)}
    metrics = eval_metrics(merged["scores"], merged["per_function"], reward_names, merged["lengths"],
                           merged["truncated"], prefix)
    # TRL's eval_loss: the RLOO loss at ratio 1 on these samples
    valid = ~merged["per_function"].isnan().all(dim=-1) if merged["per_function"].shape[-1] else \
        torch.ones_like(merged["scores"], dtype=torch.bool)
    metrics[f"{prefix}loss"] = policy_loss_at_ratio_one(merged["scores"], valid, merged["lengths"],
                                                        args.advantage_estimator, args.loss_agg_mode,
                                                        args.max_completion_length)
    if "tool_counts" in merged:  # the training rollout's tools/ metrics, on the eval trajectories
        trajectories, calls, failures = merged["tool_counts"].sum(dim=0).tolist()
        metrics[f"{prefix}tools/call_frequency"] = calls / max(trajectories, 1.0)
        metrics[f"{prefix}tools/failure_frequency"] = failures / calls if calls else 0.0
    return metrics

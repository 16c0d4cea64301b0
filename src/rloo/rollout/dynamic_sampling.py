"""Dynamic sampling (DAPO, Yu et al., 2025): fill each rollout with groups that teach something.

A group whose K completions all got the same (shaped) score has a leave-one-out advantage of 0 for
every completion (`algo.group_filter`). With `dynamic_sampling` the rollout keeps only the groups
whose scores differ, and generates more groups from freshly drawn prompts until it has
`prompts_per_rollout` of them on every process, for at most `dynamic_sampling_max_rounds` rounds of
generation; if the cap is reached first, zero-spread groups of the first round fill the rest, so every
optimizer step keeps its size. Each round's advantages are computed within that round (a group's
RLOO baseline needs only its own group; whitening options whiten each round over itself).
With images in the prompts, every round encodes its own prompts' images, its pi_old and pi_ref run with them,
and the kept rows take their prompts' vision inputs along (`data.images.VisionInputs.concat`), row for row.

The extra prompts of round r of rollout n are a pure function of (seed, n, r, process), so a
resumed run draws the same ones. Logged, summed over processes: `dynamic_sampling/dropped_frac`
(zero-spread groups among those generated), `dynamic_sampling/extra_prompts` (prompts generated
beyond the rollout's), `dynamic_sampling/rounds`, `dynamic_sampling/zero_spread_kept` (zero-spread
groups that had to fill a rollout at the cap).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
from accelerate import Accelerator

from rloo.algo.group_filter import informative_groups
from rloo.config import RLOOConfig
from rloo.data.images import VisionInputs, completion_image_files
from rloo.data.schedule import select_rows
from rloo.rollout import Rollout, RolloutCollector, Samples

LEFT_PADDED = ("prompt_ids", "prompt_mask")
PAD_VALUES = {"is_weights": 1.0}  # every other padded position holds 0 (or the pad token id for ids)


def _pad_cat(tensors: list[torch.Tensor], left: bool, value: float) -> torch.Tensor:
    """(B_i, L_i) tensors -> (sum B_i, max L_i), padded on the left or the right with `value`."""
    width = max(t.shape[1] for t in tensors)
    padded = []
    for tensor in tensors:
        pad = (width - tensor.shape[1], 0) if left else (0, width - tensor.shape[1])
        padded.append(torch.nn.functional.pad(tensor, pad, value=value))
    return torch.cat(padded)


def concat_rollouts(parts: list[Rollout], pad_token_id: int) -> Rollout:
    """The rows of several rollouts as one, prompts left-padded and completions right-padded to the widest."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(Rollout):
        tensors = [getattr(part, field.name) for part in parts]
        if field.name == "mismatch":
            values[field.name] = None if tensors[0] is None else _combine_mismatch(torch.stack(tensors))
        elif field.name == "vision":  # each row keeps its own prompt's images (data.images.VisionInputs.concat)
            values[field.name] = None if tensors[0] is None else VisionInputs.concat(tensors)
        elif tensors[0] is None:
            values[field.name] = None
        elif tensors[0].dim() == 1:
            values[field.name] = torch.cat(tensors)
        else:
            fill = pad_token_id if field.name in ("prompt_ids", "completion_ids") else PAD_VALUES.get(field.name, 0.0)
            values[field.name] = _pad_cat(tensors, field.name in LEFT_PADDED, fill)
    return Rollout(**values)


def _combine_mismatch(sums: torch.Tensor) -> torch.Tensor:
    """(N, 4) `algo.importance.mismatch_sums` rows -> (4,): sums of the first three, max of the last."""
    return torch.cat([sums[:, :3].sum(dim=0), sums[:, 3].max().reshape(1)])


def select_rows_of(rollout: Rollout, rows: torch.Tensor) -> Rollout:
    """Rollout rows `rows` ((n,) indices), every per-row tensor indexed the same way."""
    values = {}
    for field in dataclasses.fields(Rollout):
        value = getattr(rollout, field.name)
        if value is None or field.name == "mismatch":
            values[field.name] = value
        elif field.name == "vision":
            values[field.name] = value.select(rows.tolist())
        else:
            values[field.name] = value[rows.to(value.device)]
    return Rollout(**values)


def select_samples(samples: list[Samples], picks: list[tuple[int, int]]) -> Samples:
    """The text side of the picked (round, row) completions; reward-logged metrics of the first round."""
    def cell(key: str, r: int, i: int) -> Any:
        values = samples[r].extra.get(key, [])
        return values[i] if i < len(values) else None

    extra = {key: [cell(key, r, i) for r, i in picks] for key in samples[0].extra}
    return Samples(prompts=[samples[r].prompts[i] for r, i in picks],
                   completions=[samples[r].completions[i] for r, i in picks], extra=extra,
                   metrics=dict(samples[0].metrics),
                   messages=None if samples[0].messages is None else [samples[r].messages[i] for r, i in picks],
                   turns=None if samples[0].turns is None else [samples[r].turns[i] for r, i in picks],
                   images=None if samples[0].images is None else [samples[r].images[i] for r, i in picks])


@dataclass
class DynamicSampler:
    """Collects a rollout of informative groups, generating extra rounds up to the cap."""

    args: RLOOConfig
    accelerator: Accelerator
    collector: RolloutCollector
    dataset: Any
    pad_token_id: int
    rows_of: Callable[[int], list[dict[str, Any]]] | None = None  # rollout index -> its rows (`sources.RowsOf`)

    def start(self) -> None:
        """Nothing runs beside the loop (`sources.RolloutSource`)."""

    def next(self, rollout_index: int, global_step: int, episode: int) -> tuple[Rollout, Samples, dict[str, float]]:
        """`collect` on the rollout's own rows (`sources.RolloutSource`)."""
        return self.collect(self.rows_of(rollout_index), rollout_index, global_step, episode)

    def close(self) -> None:
        """Nothing to stop."""

    def state(self) -> None:
        """Nothing beside the trainer's state (extra rounds' rows are fixed by seed and rollout)."""

    def restore(self, state: dict[str, Any] | None) -> None:
        """Nothing to restore."""

    def extra_rows(self, rollout_index: int, round_index: int) -> list[dict[str, Any]]:
        """prompts_per_rollout dataset rows for an extra round, fixed by (seed, rollout, round, process)."""
        key = (self.args.seed, rollout_index, round_index, self.accelerator.process_index)
        generator = torch.Generator().manual_seed(hash(key) % (2 ** 62))
        count, size = self.args.prompts_per_rollout, len(self.dataset)
        indices = torch.randperm(size, generator=generator)[:count] if size >= count else \
            torch.randint(size, (count,), generator=generator)
        return select_rows(self.dataset, indices.tolist())

    def collect(self, rows: list[dict[str, Any]], rollout_index: int, global_step: int,
                episode: int) -> tuple[Rollout, Samples, dict[str, float]]:
        """A rollout of prompts_per_rollout groups, informative ones first; and the dynamic_sampling/* metrics."""
        args, acc, k, need = self.args, self.accelerator, self.args.num_generations, self.args.prompts_per_rollout
        rounds: list[tuple[Rollout, Samples, torch.Tensor]] = []
        kept = 0
        for round_index in range(args.dynamic_sampling_max_rounds):
            round_rows = rows if round_index == 0 else self.extra_rows(rollout_index, round_index)
            rollout, samples = self.collector.collect(round_rows, global_step, episode)
            valid = ~torch.isnan(rollout.reward_columns).all(dim=1)  # (B,) scored by some function
            informative = informative_groups(rollout.scores.view(-1, k), valid.view(-1, k)).cpu()  # (P,)
            rounds.append((rollout, samples, informative))
            kept += int(informative.sum())
            # Every process collects together (whitening gathers), so all go on while any is short.
            if int(acc.gather(torch.tensor([kept], device=acc.device)).min()) >= need:
                break
        return self.assemble(rounds, need)

    def assemble(self, rounds: list[tuple[Rollout, Samples, torch.Tensor]],
                 need: int) -> tuple[Rollout, Samples, dict[str, float]]:
        """Informative groups in order of generation, then zero-spread groups of the earliest rounds."""
        k = self.args.num_generations
        order = [(r, g) for r, (_, _, inf) in enumerate(rounds) for g in range(len(inf)) if inf[g]]
        order += [(r, g) for r, (_, _, inf) in enumerate(rounds) for g in range(len(inf)) if not inf[g]]
        picked = order[:need]
        parts, picks = [], []
        for r, (rollout, _, _) in enumerate(rounds):
            groups = [g for (pr, g) in picked if pr == r]
            if groups:
                rows = torch.tensor([g * k + i for g in groups for i in range(k)])
                parts.append(select_rows_of(rollout, rows))
                picks += [(r, int(i)) for i in rows]
        generated = sum(len(inf) for _, _, inf in rounds)
        informative = sum(int(inf.sum()) for _, _, inf in rounds)
        totals = torch.tensor([generated - informative, generated, generated - need, len(rounds),
                               max(0, need - informative)], dtype=torch.float32, device=self.accelerator.device)
        dropped, total, extra, num_rounds, zero_kept = self.accelerator.reduce(totals, "sum").tolist()
        stats = {"dynamic_sampling/dropped_frac": dropped / max(total, 1.0), "dynamic_sampling/extra_prompts": extra,
                 "dynamic_sampling/rounds": num_rounds / self.accelerator.num_processes,
                 "dynamic_sampling/zero_spread_kept": zero_kept}
        samples = select_samples([s for _, s, _ in rounds], picks)
        self.relog_image_files(samples)
        return concat_rollouts(parts, self.pad_token_id), samples, stats

    def relog_image_files(self, samples: Samples) -> None:
        """log_multimodal: the "image" column's files for the kept rows the completions table shows. Each round wrote
        those of its own first rows, so a kept row from further down a round would have none."""
        args = self.args
        if samples.images is not None and args.log_completions and self.accelerator.is_main_process:
            samples.extra["image"] = completion_image_files(samples.images, args.num_completions_to_print,
                                                            args.output_dir)


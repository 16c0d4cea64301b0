"""A multi-turn rollout's turns on the fast sampler, each trajectory's KV cache kept across its tool calls.

The re-prefill path (any sampler) samples each later turn with the whole trajectory as a new prompt: its prompt
and earlier turns run through the model again every turn. `KeptCacheTurns` (`FastSampler.turn_session`) keeps
the cache of every trajectory that goes on:

  start(model, prompts, k)                  turn 1, as `FastSampler.sample` (one prefill per prompt, shared head,
                                            K rows each), the cache kept with the tokens each row's columns hold;
  resume(model, rows, sequences, budget)    the next turn of trajectories `rows` (indices into turn 1's rows),
                                            given as the whole token lists the re-prefill path would sample from.
                                            The cache holds a prefix of each, so only the rest (the tool
                                            message's tokens) runs; the rows not named leave the batch for good.

Between turns the rows that go on are packed: each row's held columns are gathered right-aligned (a row that
ended early leaves masked padding), then the new tokens are appended left-padded, as the shared head's tails
are (`FastSampler._prefill_shared_head`): a row reads padding, its held tokens, padding, its new tokens.
Positions count real tokens only (`position_ids_from_mask`), so rotary and absolute-position models see every
token at the position of a whole-row prefill and the mask hides the padding: tokens and log-probs are the
re-prefill path's, to float tolerance (tests/generation/test_kept_turns.py).

What a row's cache holds is compared with the trajectory token by token: tokens the rollout did not keep (cut
at a stop string or at the budget; the padding a row is fed after its end) leave the row and are not attended.

The session decodes its rows in one wave: when the fast sampler would decode in waves (CUDA, a cache over its
share of the free memory), or the cache has layers other than full attention (sliding windows, linear
attention), every turn re-prefills, as with other samplers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rloo.generation.base import SampledBatch, completion_mask_from_eos, left_pad
from rloo.generation.kv_cache import AppendInPlaceLayer, append_in_place_cache, cache_from_states, filled_states
from rloo.passes.logprobs import cache_argument, position_ids_from_mask


def common_prefix_length(held: list[int], sequence: list[int]) -> int:
    """How many leading tokens `held` and `sequence` share."""
    length = 0
    for a, b in zip(held, sequence):
        if a != b:
            break
        length += 1
    return length


def packing_index(mask: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each row's first `keep` held columns go when packed right-aligned into max(keep) columns.

    Args:
        mask: (R, T) 1 at the columns holding a real token, in order.
        keep: (R,) how many of each row's real tokens stay (at most its count of them).

    Returns:
        (R, W) the source column of each packed column (0 at padding) and its (R, W) mask, W = max(keep).
    """
    rows, length = mask.shape
    width = int(keep.max())
    rank = mask.long().cumsum(dim=1)  # (R, T) 1-based rank of each real token
    kept = mask.bool() & (rank <= keep.unsqueeze(1))
    target = torch.where(kept, width - keep.unsqueeze(1) + rank - 1, width)  # (R, T); width: a column thrown away
    source = torch.zeros(rows, width + 1, dtype=torch.long, device=mask.device)
    source.scatter_(1, target, torch.arange(length, device=mask.device).expand(rows, length).contiguous())
    packed_mask = (torch.arange(width, device=mask.device).unsqueeze(0) >= width - keep.unsqueeze(1)).long()
    return source[:, :width] * packed_mask, packed_mask


@dataclass
class KeptCacheTurns:
    """One multi-turn rollout's turns on a `FastSampler`, its rows' KV cache kept between them."""

    sampler: Any  # the FastSampler
    rows: list[int] = field(default_factory=list)  # the trajectory (turn 1's row) of each cache row
    held: list[list[int]] = field(default_factory=list)  # the tokens each cache row holds, in order
    mask: torch.Tensor | None = None  # (R, T) 1 at the columns holding them
    states: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # per layer (R, H, T, D) keys, values
    reprefill: bool = False  # the cache is not kept (waves, or layers other than full attention): re-prefill

    def start(self, model: torch.nn.Module, prompts: list[list[int]], num_generations: int,
              max_new_tokens: int | None = None) -> SampledBatch:
        """Turn 1: `num_generations` completions of each prompt (`FastSampler.sample`), row p*K + k."""
        sampler, k = self.sampler, num_generations
        limit = min(max_new_tokens or sampler.max_new_tokens, sampler.max_new_tokens)
        with torch.no_grad():
            decoder = sampler.sampling_model(model)
        width = max(len(p) for p in prompts)
        waves = sampler.rows_per_wave(decoder, width, k, limit)
        full_attention = all(type(layer) is AppendInPlaceLayer
                             for layer in append_in_place_cache(decoder.config, 0).layers)
        self.reprefill = (waves is not None and waves < len(prompts) * k) or not full_attention
        if self.reprefill:
            return sampler.sample(model, prompts, k, max_new_tokens=max_new_tokens)

        def first_turn(decoder: torch.nn.Module) -> SampledBatch:
            ids, mask = left_pad(prompts, sampler.pad_token_id, next(decoder.parameters()).device)  # (N, P)
            cache, cache_name, logits, attention_mask, _ = sampler.prefill_rows(decoder, prompts, ids, mask, k, None,
                                                                                limit)
            held = [list(p) for p in prompts for _ in range(k)]
            tokens, logprobs = self._decode(decoder, cache, cache_name, logits, attention_mask, held,
                                            list(range(len(held))), limit)
            return sampler.as_batch(ids, mask, tokens, logprobs, k)

        return self._in_eval_mode(model, first_turn)

    def resume(self, model: torch.nn.Module, rows: list[int], sequences: list[list[int]],
               max_new_tokens: int | None = None) -> SampledBatch:
        """The next turn of trajectories `rows`, one completion each of `sequences` (each trajectory's whole token
        list: prompt, turns so far, the tool messages' tokens); the other rows leave the cache."""
        sampler = self.sampler
        if self.reprefill:
            return sampler.sample(model, sequences, 1, max_new_tokens=max_new_tokens)
        limit = min(max_new_tokens or sampler.max_new_tokens, sampler.max_new_tokens)
        position = {row: i for i, row in enumerate(self.rows)}
        missing = [row for row in rows if row not in position]
        if missing:
            raise RuntimeError(f"trajectories {missing} left the kept cache at an earlier turn; they cannot resume.")
        index = [position[row] for row in rows]
        # Keep each row's longest held prefix of its sequence, at least one token short of it: the last token's
        # logits start the turn.
        keep = [min(common_prefix_length(self.held[i], seq), len(seq) - 1) for i, seq in zip(index, sequences)]

        def next_turn(decoder: torch.nn.Module) -> SampledBatch:
            device = self.mask.device
            chosen = torch.tensor(index, device=device)
            source, packed_mask = packing_index(self.mask.index_select(0, chosen), torch.tensor(keep, device=device))
            states = []
            for keys, values in self.states:
                gather = source[:, None, :, None].expand(len(index), keys.shape[1], source.shape[1], keys.shape[3])
                states.append((keys.index_select(0, chosen).gather(2, gather),
                               values.index_select(0, chosen).gather(2, gather)))
            tails = [seq[n:] for seq, n in zip(sequences, keep)]
            tail_ids, tail_mask = left_pad(tails, sampler.pad_token_id, device)  # (R, S)
            cache = cache_from_states(decoder.config, states, room=tail_ids.shape[1] + limit)
            del states
            self.states = []  # the old rows' cache is free from here
            attention_mask = torch.cat([packed_mask, tail_mask], dim=1)  # (R, W + S)
            positions = position_ids_from_mask(attention_mask)[:, packed_mask.shape[1]:]  # after each held prefix
            cache_name = cache_argument(decoder)
            prefill = decoder(input_ids=tail_ids, attention_mask=attention_mask, position_ids=positions,
                              **{cache_name: cache}, use_cache=True, logits_to_keep=1)
            held = [self.held[i][:n] + tail for i, n, tail in zip(index, keep, tails)]
            tokens, logprobs = self._decode(decoder, cache, cache_name, prefill.logits[:, -1], attention_mask, held,
                                            list(rows), limit)
            ids, mask = left_pad(sequences, sampler.pad_token_id, device)
            return sampler.as_batch(ids, mask, tokens, logprobs, 1)

        return self._in_eval_mode(model, next_turn)

    def _in_eval_mode(self, model: torch.nn.Module, turn: Callable[[torch.nn.Module], SampledBatch]) -> SampledBatch:
        """`turn` run without grad on the model the sampler decodes with, `model` in eval mode meanwhile."""
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return turn(self.sampler.sampling_model(model))
        finally:
            model.train(was_training)

    def _decode(self, model: torch.nn.Module, cache: Any, cache_name: str, logits: torch.Tensor,
                attention_mask: torch.Tensor, held: list[list[int]], rows: list[int],
                limit: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode loop from the prefilled `cache`; keeps the cache, its rows and the tokens each row holds (its
        own decoded tokens up to its end: the columns fed after it are masked). (R, C) tokens and log-probs."""
        tokens, logprobs, fed = self.sampler._decode_from(model, cache, cache_name, logits, attention_mask, None,
                                                          None, limit)
        ends = completion_mask_from_eos(tokens, self.sampler.eos_token_ids)[0].sum(dim=1).clamp(max=fed)  # (R,)
        own = (torch.arange(fed, device=ends.device).unsqueeze(0) < ends.unsqueeze(1)).to(attention_mask.dtype)
        self.mask = torch.cat([attention_mask, own], dim=1)  # (R, T + fed)
        self.states = filled_states(cache, self.mask.shape[1])
        self.held = [h + tokens[r, :end].tolist() for r, (h, end) in enumerate(zip(held, ends.tolist()))]
        self.rows = rows
        return tokens, logprobs

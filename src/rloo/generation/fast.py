"""A lean sampler: prefill each prompt once, share its KV cache across its K samples, decode by hand.

`generate` is general and therefore slow per step on small batches: it validates, builds logits
processors and stopping criteria, and runs the prompt through the model once per sample. RLOO
samples K completions of the same prompt, so `FastSampler`

  1. runs the N distinct prompts through the model once (prefill), keeping the KV cache in
     buffers with room for the completion (`kv_cache.AppendInPlaceLayer`: no copy per step);
  2. repeats that cache K times along the batch (N -> N*K rows, groups contiguous);
  3. decodes one token per step with `model(...)` on the cache, stopping as soon as every row
     has produced an end token or `max_new_tokens` is reached.

Prompts that begin alike (a system message, a tool schema, a worked example; a multi-turn rollout's later
turns) share more than their group: when the N distinct prompts have a common head of at least
`MIN_SHARED_HEAD` tokens, the head runs once (one row), its cache is copied to the N rows, and only each
prompt's tail runs after it (`_prefill_shared_head`). The tails are left-padded after the head, so a
row's cache reads head, padding, tail; the padding is masked and positions count real tokens only, so
attention sees what it sees in a whole-row prefill (full-attention caches only; sliding windows, images and
other cache layers keep the whole-row prefill).

Prompts with images (`vision`, a `data.images.VisionInputs`, one row per completion): the prefill runs
each distinct prompt's images once (N rows, the vision tower's work is not repeated K times), the cache
holds the image features from then on, and decoding is text-only. The image token is never sampled (as
`generate` is told with `suppress_tokens`): a sampled image token would have no features in later passes.
Models with 3-D rotary positions (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5's mrope, `image_grid_thw`) get the model's
own positions: the prefill's from `get_rope_index`, and each decoded token n + rope_delta on all three axes
(`mrope.decode_positions`, the deltas repeated K times with the cache). Other models with 3-D positions are
refused by name (`refuse_3d_positions`).

On CUDA (issue #46) the decode loop is built for the card, each part switchable by a field:
  - `weights_dtype`: under 16-bit autocast the sampler decodes with a 16-bit copy of the weights, refreshed after
    each optimizer step, instead of autocast's casts on every call; its norms are 16-bit too, so the KV cache is
    (Qwen3's fp32 k-norm weight made keys fp32 under autocast: 28 GB of a 40 GB peak at 256 rows x 640 tokens);
  - `decode_step`: static buffers and shapes (`static_decode`), captured in a CUDA graph and replayed;
  - `eos_check_every`: the host looks for every row's end every N steps, not every step (the columns decoded
    past the last end are dropped, so the result is the same);
  - `wave_rows`: the rows decode in waves of whole groups whose KV cache fits the free memory.
On CPU each defaults to the eager loop of before (the same draws from the same random state).

The distribution is the one `generate` samples from: logits / temperature, then top-k, then
top-p (nucleus), in that order, then a multinomial draw. tests/generation/test_decoding.py checks greedy
outputs against `generate` and sampled token statistics against the exact model probabilities.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from rloo.config_checks import ConfigError
from rloo.generation.base import SampledBatch, SamplingSettings, completion_mask_from_eos, left_pad
from rloo.generation.half_weights import autocast_would_cast, copyable, half_copy, rows_fitting_memory
from rloo.generation.kv_cache import AppendInPlaceLayer, append_in_place_cache
from rloo.generation.logits_filter import filter_logits
from rloo.generation.static_decode import make_step, static_refusal
from rloo.passes import mrope
from rloo.passes.logprobs import cache_argument, position_ids_from_mask
from rloo.passes.logprobs import computes_own_positions as positions_are_3d  # Qwen-VL's mrope: get_rope_index

logger = logging.getLogger(__name__)

# The common head of the prompts runs once when it is at least this long: below it the extra model call
# costs more than the prefill it saves.
MIN_SHARED_HEAD = 16
DECODE_STEPS = ("auto", "eager", "static", "graph")
WEIGHTS_DTYPES = ("auto", "model")
# On CUDA: the host checks for the end of every row this often (steps), and the KV cache of one wave may take
# this share of the free memory.
CUDA_EOS_CHECK_EVERY = 16
CUDA_CACHE_SHARE = 0.5


def can_repeat_rows(cache: Any) -> bool:
    """Whether every layer of `cache` can copy its rows (`batch_repeat_interleave`)."""
    return all(hasattr(layer, "batch_repeat_interleave") for layer in getattr(cache, "layers", []))


def refuse_3d_positions(model: torch.nn.Module) -> None:
    """Raise a ConfigError naming sampler='generate' for a model with 3-D rotary positions (`positions_are_3d`)
    whose decode positions the fast sampler has not been verified on (`mrope.VERIFIED_MODEL_TYPES`)."""
    if positions_are_3d(model) and mrope.model_type(model) not in mrope.VERIFIED_MODEL_TYPES:
        raise ConfigError(f"{type(getattr(model, 'module', model)).__name__} (model_type "
                          f"{mrope.model_type(model)!r}) places image prompts with 3-D rotary positions (mrope), which "
                          f"the fast sampler computes for {', '.join(mrope.VERIFIED_MODEL_TYPES)} only; set "
                          f"sampler='generate' for this model (docs/vision.md).")


def shared_head_length(prompts: list[list[int]]) -> int:
    """The length of the longest common prefix of `prompts`, leaving every prompt at least one token of its own
    (its last token's logits start the decode)."""
    shortest = min(len(p) for p in prompts)
    length = 0
    while length < shortest - 1 and all(p[length] == prompts[0][length] for p in prompts):
        length += 1
    return length


def per_prompt_rows(vision: Any, k: int) -> Any:
    """The `VisionInputs` of one row per distinct prompt, from one row per completion (groups of k contiguous)."""
    if any(vision.rows[i] != vision.rows[i - i % k] for i in range(len(vision.rows))):
        raise RuntimeError(f"vision rows {vision.rows} are not in contiguous groups of {k}.")
    return vision.select(range(0, len(vision.rows), k))


_noted: set[tuple[str, ...]] = set()


def _note_once(message: str) -> None:
    if (message,) not in _noted:
        _noted.add((message,))
        logger.info(message)


def _note_prefill_per_sample(cache: Any) -> None:
    kinds = sorted({type(layer).__name__ for layer in cache.layers if not hasattr(layer, "batch_repeat_interleave")})
    if tuple(kinds) not in _noted:
        _noted.add(tuple(kinds))
        logger.info("fast sampler: cache layers %s cannot copy rows; each of the num_generations samples of a prompt "
                    "gets its own prefill (slower prefill, same samples).", kinds)


@dataclass
class FastSampler(SamplingSettings):
    """K completions per prompt from one prefill per prompt and a hand-written decode loop.

    Same protocol and fields as `GenerateSampler`; `do_sample=False` decodes greedily (for tests
    and evaluation). Works on any device: tensors follow the model's parameters.
    """

    do_sample: bool = True
    # "auto": a 16-bit copy of the weights when sampling runs on CUDA under 16-bit autocast (and the model is a
    # plain module on one device: no adapters, no sharding); "model": always the model itself.
    weights_dtype: str = "auto"
    # "eager": one forward a token on growing cache views; "static": fixed buffers and shapes; "graph": static,
    # replayed as a CUDA graph (CUDA only); "auto": graph on CUDA, eager elsewhere.
    decode_step: str = "auto"
    # Steps between the host's checks for the end of every row; 0: 1 on CPU, CUDA_EOS_CHECK_EVERY on CUDA.
    eos_check_every: int = 0
    # Completion rows decoded at once (whole groups of K); 0: all on CPU, on CUDA as many as a KV cache within
    # CUDA_CACHE_SHARE of the free memory holds.
    wave_rows: int = 0
    # Multi-turn rollouts: each trajectory's KV cache is kept across its tool calls, the tool's tokens appended to
    # it (`turn_session`); False: every later turn samples the whole trajectory again as a new prompt.
    keep_turn_cache: bool = True
    _copy: Any = field(default=None, init=False, repr=False)  # (source model, its 16-bit copy, stale)

    def __post_init__(self) -> None:
        if self.weights_dtype not in WEIGHTS_DTYPES:
            raise ConfigError(f"FastSampler weights_dtype={self.weights_dtype!r}: choose one of {WEIGHTS_DTYPES}.")
        if self.decode_step not in DECODE_STEPS:
            raise ConfigError(f"FastSampler decode_step={self.decode_step!r}: choose one of {DECODE_STEPS}.")
        if self.eos_check_every < 0 or self.wave_rows < 0:
            raise ConfigError(f"FastSampler eos_check_every={self.eos_check_every} and wave_rows={self.wave_rows} "
                              f"must be >= 0 (0 picks by device).")

    def on_optimizer_step(self, model: torch.nn.Module) -> None:
        """The 16-bit copy, if any, is refreshed from the new weights before the next sample."""
        if self._copy is not None:
            self._copy = (self._copy[0], self._copy[1], True)

    def sampling_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model the decode runs: `model`, or its 16-bit copy (made once, refreshed when stale)."""
        device = next(model.parameters()).device
        half = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
        if (self.weights_dtype == "model" or device.type != "cuda" or half not in (torch.bfloat16, torch.float16)
                or not copyable(model)):
            return model
        return self.half_weights(model, half)

    def half_weights(self, model: torch.nn.Module, half: torch.dtype) -> torch.nn.Module:
        """`model`'s copy in `half`, made on first use and refreshed in place after an optimizer step."""
        source, weights, stale = self._copy if self._copy is not None else (None, None, True)
        if source is not model or weights is None or next(weights.parameters()).dtype != half:
            weights, stale = half_copy(model, half), False
        elif stale:
            with torch.no_grad():
                torch._foreach_copy_(list(weights.parameters()), list(model.parameters()))
        self._copy = (model, weights, False)
        return weights

    @torch.no_grad()
    def sample(self, model: torch.nn.Module, prompts: list[list[int]], num_generations: int,
               vision: Any = None, max_new_tokens: int | None = None) -> SampledBatch:
        """`vision`: the rows' image inputs (`data.images.VisionInputs`, one row per completion); the prefill runs one
        row per distinct prompt. `max_new_tokens`: this call's length limit (`Sampler.sample`), else the configured one."""
        if vision is not None:
            refuse_3d_positions(model)  # before any work: models with 3-D positions not verified here
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        decoder = self.sampling_model(model) if vision is None else model
        unique_ids, unique_mask = left_pad(prompts, self.pad_token_id, device)  # (N, P)
        completion_ids, logprobs = self._decode_in_waves(decoder, prompts, unique_ids, unique_mask, num_generations,
                                                         vision, max_new_tokens or self.max_new_tokens)  # (N*K, C)
        model.train(was_training)
        return self.as_batch(unique_ids, unique_mask, completion_ids, logprobs, num_generations)

    def as_batch(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                 logprobs: torch.Tensor, k: int) -> SampledBatch:
        """(N, P) prompts and the (N*K, C) decoded tokens and log-probs as a `SampledBatch` (pad after each end)."""
        completion_mask, has_eos = completion_mask_from_eos(completion_ids, self.eos_token_ids)
        completion_ids = completion_ids.masked_fill(completion_mask == 0, self.pad_token_id)
        logprobs = logprobs.masked_fill(completion_mask == 0, 0.0)
        return SampledBatch(prompt_ids.repeat_interleave(k, dim=0), prompt_mask.repeat_interleave(k, dim=0),
                            completion_ids, completion_mask, has_eos, logprobs, logprobs_from_policy=True)

    def turn_session(self) -> Any:
        """A multi-turn rollout's sampler that keeps each trajectory's KV cache across its turns
        (`kept_turns.KeptCacheTurns`), or None with keep_turn_cache=False (every turn re-prefills)."""
        from rloo.generation.kept_turns import KeptCacheTurns  # it builds on this module

        return KeptCacheTurns(self) if self.keep_turn_cache else None

    def rows_per_wave(self, model: torch.nn.Module, prompt_length: int, k: int, max_new_tokens: int | None = None) -> int | None:
        """Completion rows decoded at once (a multiple of k), or None for all."""
        if self.wave_rows:
            return max(k, self.wave_rows // k * k)
        return rows_fitting_memory(model, prompt_length + (max_new_tokens or self.max_new_tokens), k, CUDA_CACHE_SHARE)

    def _decode_in_waves(self, model: torch.nn.Module, prompts: list[list[int]], prompt_ids: torch.Tensor,
                         prompt_mask: torch.Tensor, k: int, vision: Any,
                         max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`_decode` over waves of whole groups (all at once when they fit): (N*K, C) tokens and log-probs, C the
        longest wave's, the shorter waves padded."""
        rows = self.rows_per_wave(model, prompt_ids.shape[1], k, max_new_tokens) if vision is None else None
        if rows is None or rows >= len(prompts) * k:
            return self._decode(model, prompts, prompt_ids, prompt_mask, k, vision, max_new_tokens)
        per_wave = rows // k  # prompts a wave
        waves = [self._decode(model, prompts[i : i + per_wave], prompt_ids[i : i + per_wave],
                              prompt_mask[i : i + per_wave], k, None, max_new_tokens)
                 for i in range(0, len(prompts), per_wave)]
        length = max(tokens.shape[1] for tokens, _ in waves)
        tokens = torch.cat([torch.nn.functional.pad(t, (0, length - t.shape[1]), value=self.pad_token_id)
                            for t, _ in waves])
        logprobs = torch.cat([torch.nn.functional.pad(lp, (0, length - lp.shape[1])) for _, lp in waves])
        return tokens, logprobs

    def _prefill(self, model: torch.nn.Module, cache: Any, cache_name: str, prompt_ids: torch.Tensor,
                 prompt_mask: torch.Tensor, k: int, vision: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the (N, P) prompts into `cache`, left holding N*K rows; returns the (N*K, V) next-token logits
        and, for a model with 3-D positions and images, the (N*K, 1) rope deltas of the rows (else None).
        With images, each distinct prompt's vision tensors run once (every K-th row of `vision`)."""
        if can_repeat_rows(cache):  # one prefill per prompt; every sample continues from a copy of it
            images = {} if vision is None else per_prompt_rows(vision, k).model_kwargs(prompt_ids)
            positions, rope_deltas = mrope.prefill_positions(model, prompt_ids, prompt_mask, images)
            prefill = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                            **{cache_name: cache}, use_cache=True, logits_to_keep=1, **images)
            cache.batch_repeat_interleave(k)
            rope_deltas = None if rope_deltas is None else rope_deltas.repeat_interleave(k, dim=0)  # as the cache
            return prefill.logits[:, -1].repeat_interleave(k, dim=0), rope_deltas  # (B, V), B = N*K
        # e.g. linear-attention / state-space layers (NemotronH): prefill each sample's own copy
        _note_prefill_per_sample(cache)
        repeated_ids, repeated_mask = prompt_ids.repeat_interleave(k, dim=0), prompt_mask.repeat_interleave(k, dim=0)
        images = {} if vision is None else vision.model_kwargs(repeated_ids)
        positions, rope_deltas = mrope.prefill_positions(model, repeated_ids, repeated_mask, images)
        prefill = model(input_ids=repeated_ids, attention_mask=repeated_mask, position_ids=positions,
                        **{cache_name: cache}, use_cache=True, logits_to_keep=1, **images)
        return prefill.logits[:, -1], rope_deltas  # (B, V), (B, 1) or None

    def _decode(self, model: torch.nn.Module, prompts: list[list[int]], prompt_ids: torch.Tensor,
                prompt_mask: torch.Tensor, k: int, vision: Any, max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """N prompts, also as (N, P) left-padded ids -> (N*K, C) sampled tokens, C <= max_new_tokens (pad after the end),
        and their (N*K, C) fp32 log-probs under softmax(logits / temperature), unfiltered (as the
        trainer computes them). The image token, with `vision`, is never drawn."""
        cache, cache_name, next_logits, attention_mask, rope_deltas = self.prefill_rows(
            model, prompts, prompt_ids, prompt_mask, k, vision, max_new_tokens)
        suppressed = None if vision is None or vision.image_token_id is None else vision.image_token_id
        return self._decode_from(model, cache, cache_name, next_logits, attention_mask, rope_deltas, suppressed,
                                 max_new_tokens)[:2]

    def prefill_rows(self, model: torch.nn.Module, prompts: list[list[int]], prompt_ids: torch.Tensor,
                     prompt_mask: torch.Tensor, k: int, vision: Any, max_new_tokens: int) -> tuple:
        """The prompts into a new cache of N*K rows with room for `max_new_tokens`, through the shared head when
        they have one: (cache, its argument name, (N*K, V) next logits, (N*K, T) mask over the cache, rope deltas)."""
        cache_name = cache_argument(model)  # "cache" or "past_key_values", looked up once, not per token
        head = 0 if vision is not None or len(prompts) < 2 else shared_head_length(prompts)
        if head >= MIN_SHARED_HEAD:
            tails, tail_mask = left_pad([p[head:] for p in prompts], self.pad_token_id, prompt_ids.device)  # (N, S)
            cache = append_in_place_cache(model.config, room=tails.shape[1] + max_new_tokens)
            if all(type(layer) is AppendInPlaceLayer for layer in cache.layers):
                next_logits, attention_mask = self._prefill_shared_head(
                    model, cache, cache_name, torch.tensor(prompts[0][:head], device=prompt_ids.device), tails,
                    tail_mask, k)
                return cache, cache_name, next_logits, attention_mask, None
        cache = append_in_place_cache(model.config, room=max_new_tokens)
        next_logits, rope_deltas = self._prefill(model, cache, cache_name, prompt_ids, prompt_mask, k, vision)
        return cache, cache_name, next_logits, prompt_mask.repeat_interleave(k, dim=0), rope_deltas

    def _prefill_shared_head(self, model: torch.nn.Module, cache: Any, cache_name: str, head_ids: torch.Tensor,
                             tail_ids: torch.Tensor, tail_mask: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (H,) common head once, its cache copied to the N rows, then the (N, S) left-padded tails after it,
        the cache left holding N*K rows. Returns the (N*K, V) next-token logits and the (N*K, H + S) attention
        mask over the cache (head, then each tail's padding and tokens)."""
        model(input_ids=head_ids.unsqueeze(0), attention_mask=torch.ones_like(head_ids).unsqueeze(0),
              position_ids=torch.arange(len(head_ids), device=head_ids.device).unsqueeze(0),
              **{cache_name: cache}, use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(tail_ids.shape[0])
        attention_mask = torch.cat([tail_mask.new_ones(tail_ids.shape[0], len(head_ids)), tail_mask], dim=1)
        positions = position_ids_from_mask(attention_mask)[:, len(head_ids):]  # head positions, then real tokens
        prefill = model(input_ids=tail_ids, attention_mask=attention_mask, position_ids=positions,
                        **{cache_name: cache}, use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(k)
        return prefill.logits[:, -1].repeat_interleave(k, dim=0), attention_mask.repeat_interleave(k, dim=0)

    def _decode_from(self, model: torch.nn.Module, cache: Any, cache_name: str, next_logits: torch.Tensor,
                     attention_mask: torch.Tensor, rope_deltas: torch.Tensor | None,
                     suppressed: int | None, max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The decode loop from a prefilled `cache` of B rows: (B, V) first logits and the (B, T) mask over the
        cache, which grows by one column a step. Returns the (B, C) tokens and log-probs, and how many steps fed
        their token into the cache (its first columns after T: a row's own tokens up to its end, then padding)."""
        device = next_logits.device
        eos_ids = torch.tensor(self.eos_token_ids, device=device)
        finished = torch.zeros(attention_mask.shape[0], dtype=torch.bool, device=device)  # (B,)
        every = self.eos_check_every or (CUDA_EOS_CHECK_EVERY if device.type == "cuda" else 1)
        step_forward = self._step_function(model, cache, cache_name, attention_mask, rope_deltas)

        tokens, logprobs, all_ended = [], [], []
        for step in range(max_new_tokens):
            token, logprob = self._next_token(next_logits, suppressed)  # (B,), (B,)
            token = token.masked_fill(finished, self.pad_token_id)  # rows already ended only pad
            tokens.append(token)
            logprobs.append(logprob)
            finished |= torch.isin(token, eos_ids)
            all_ended.append(finished.all())
            # A host sync every `every` steps: it saves the remaining steps once every row has ended.
            if step == max_new_tokens - 1 or ((step + 1) % every == 0 and bool(all_ended[-1])):
                break
            next_logits = step_forward(token)
        length = fed = len(tokens)
        if every > 1:  # the steps decoded after every row had ended are dropped: the eager loop's length
            length = int(torch.stack(all_ended).long().argmax()) + 1 if bool(all_ended[-1]) else length
        return torch.stack(tokens[:length], dim=1), torch.stack(logprobs[:length], dim=1), fed - 1

    def _step_function(self, model: torch.nn.Module, cache: Any, cache_name: str, attention_mask: torch.Tensor,
                       rope_deltas: torch.Tensor | None):
        """(B,) tokens -> (B, V) next logits: the static (or graphed) step when it can run, else the eager one."""
        mode = self.decode_step
        if mode == "auto":
            mode = "graph" if attention_mask.is_cuda and not autocast_would_cast(model) else "eager"
        if mode in ("static", "graph"):
            refusal = static_refusal(model, cache, rope_deltas)
            if refusal is None:
                return make_step(model, cache, cache_name, attention_mask, graphed=mode == "graph")
            _note_once(f"fast sampler: decode_step={self.decode_step!r} runs the eager loop for {refusal}.")
        state = {"mask": attention_mask, "position": attention_mask.sum(dim=1, keepdim=True)}  # (B, T), (B, 1)

        def eager_step(token: torch.Tensor) -> torch.Tensor:
            state["mask"] = torch.cat([state["mask"], torch.ones_like(state["mask"][:, :1])], dim=1)
            position = state["position"]
            positions = position if rope_deltas is None else mrope.decode_positions(position, rope_deltas)
            output = model(input_ids=token.unsqueeze(1), attention_mask=state["mask"], position_ids=positions,
                           **{cache_name: cache}, use_cache=True)
            state["position"] = position + 1
            return output.logits[:, -1]

        return eager_step

    def _next_token(self, logits: torch.Tensor, suppressed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, V) scores -> (B,) tokens (argmax when greedy, else a draw from the filtered softmax; never
        `suppressed`) and (B,) their fp32 log-probs under the unfiltered softmax(logits / temperature)."""
        log_probs = torch.log_softmax(logits.float() / self.temperature, dim=-1)  # (B, V)
        suppress = suppressed is not None and 0 <= suppressed < logits.shape[-1]
        if suppress:  # as generate's suppress_tokens: the token's score is -inf before any other filter
            logits = logits.clone()
            logits[:, suppressed] = float("-inf")
        if not self.do_sample:
            token = logits.argmax(dim=-1)
        elif self.top_k == 0 and self.top_p >= 1.0 and not self.min_p and not suppress:  # the softmax already computed
            token = torch.multinomial(log_probs.exp(), num_samples=1).squeeze(1)
        else:
            scores = filter_logits(logits, self.temperature, self.top_k, self.top_p, self.min_p)
            token = torch.multinomial(scores.softmax(dim=-1), num_samples=1).squeeze(1)
        return token, log_probs.gather(1, token.unsqueeze(1)).squeeze(1)

"""The fast sampler's decode step with static shapes, so that on CUDA it can be captured in a graph.

The eager loop (`FastSampler._decode_from`) hands attention a cache view that grows by one position a step and
a mask that grows by one column: new shapes every step, a Python-driven forward per token, about 1,750 kernel
launches a step for a 28-layer model. Here

  1. the prefill's append-in-place buffers (`kv_cache.AppendInPlaceLayer`, (B, H, T + room, D)) are adopted
     whole by `StaticRowsLayer`s, which write each step's keys and values at a device-side slot
     (`index_copy_`) and hand attention all T + room positions;
  2. the mask is a (B, T + room) buffer of allowed positions, the prompt's real tokens and the decoded ones,
     one more column switched on a step at the same device-side slot; it reaches the model as a prepared
     4-D mask (`{"full_attention": mask}`, the form `generate` hands models that take one), so transformers
     builds none;
  3. the token, the positions and the slot are static buffers updated in place.

Every step then has the same shapes and the same tensor addresses, so on CUDA the forward is captured once per
`sample` call in a `torch.cuda.CUDAGraph` and replayed (`GraphedStep`): one launch a step. Positions no row has
reached are masked, so attention sees what the eager loop's views show it, and in fp32 the draws are the eager
loop's (tests/generation/test_static_decode.py; on CUDA the graphed ones too, a `cuda` test).

Models qualify when their decoder takes prepared masks (`takes_prepared_masks`), attends with sdpa or eager,
has only full-attention layers and 1-D positions, and the cache is all `AppendInPlaceLayer`s; others keep the
eager loop.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any, Callable

import torch
from transformers.cache_utils import DynamicLayer

from rloo.generation.kv_cache import AppendInPlaceLayer

logger = logging.getLogger(__name__)

MASKED_IMPLEMENTATIONS = ("sdpa", "eager")


class StaticRowsLayer(DynamicLayer):
    """One layer's (B, H, L, D) key and value buffers, written at `slot` (a (1,) device tensor shared by all
    layers); attention reads all L positions, the mask hides those not reached."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int, slot: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.slot, self.filled = keys, values, slot, filled
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, H, 1, D) states at the slot; return the whole (B, H, L, D) buffers."""
        self.keys.index_copy_(2, self.slot, key_states)
        self.values.index_copy_(2, self.slot, value_states)
        return self.keys, self.values

    def get_seq_length(self, *args, **kwargs) -> int:
        # A constant (the prefill's length): a value that moved every step would make a compiler re-trace. The
        # model is given positions and a prepared mask, so nothing reads a position from it.
        return self.filled

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
        return self.keys.shape[-2], 0


@functools.cache
def _forward_takes_prepared_masks(model_class: type) -> bool:
    try:
        source = inspect.getsource(model_class.forward)
    except (OSError, TypeError):
        return False
    return "isinstance(causal_mask_mapping := attention_mask, dict)" in source


def takes_prepared_masks(model: torch.nn.Module) -> bool:
    """Whether `model`'s decoder uses an attention-mask dict as given (`{"full_attention": 4-D mask}`), as
    transformers' decoders do for masks `generate` prepared."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    return decoder is not None and _forward_takes_prepared_masks(type(decoder))


def static_refusal(model: torch.nn.Module, cache: Any, rope_deltas: Any) -> str | None:
    """Why the static step cannot run this model and cache (None when it can)."""
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in MASKED_IMPLEMENTATIONS:
        return f"attention implementation {implementation!r} (static decode: {MASKED_IMPLEMENTATIONS})"
    if any(kind != "full_attention" for kind in (getattr(config, "layer_types", None) or [])):
        return "layers other than full attention"
    if rope_deltas is not None:
        return "3-D positions"
    if not all(type(layer) is AppendInPlaceLayer and layer.is_initialized for layer in cache.layers):
        return "cache layers other than AppendInPlaceLayer"
    if not takes_prepared_masks(model):
        return f"{type(model).__name__}'s decoder builds its own masks"
    return None


class StaticStep:
    """The decode step over fixed buffers: `__call__(token)` runs the (B,) tokens at the current slot and returns
    the (B, V) next-token logits, then moves the slot and positions on (all on the device)."""

    def __init__(self, model: torch.nn.Module, cache: Any, cache_name: str, attention_mask: torch.Tensor) -> None:
        rows, filled = attention_mask.shape
        device = attention_mask.device
        layers = cache.layers
        length = layers[0]._key_buffer.shape[-2]  # T + room
        self.slot = torch.full((1,), filled, dtype=torch.long, device=device)
        for layer in layers:  # the room was allocated empty: masked weights are 0, but 0 * NaN is not
            layer._key_buffer[:, :, filled:].zero_()
            layer._value_buffer[:, :, filled:].zero_()
        cache.layers = [StaticRowsLayer(layer._key_buffer, layer._value_buffer, filled, self.slot) for layer in layers]
        allowed = torch.zeros(rows, length, dtype=torch.bool, device=device)
        allowed[:, :filled] = attention_mask.bool()
        if model.config._attn_implementation == "sdpa":  # boolean: True takes part
            self.mask, self.fill = allowed[:, None, None, :], True
        else:  # eager: added to the scores
            self.mask = torch.zeros(rows, 1, 1, length, device=device).masked_fill_(~allowed[:, None, None, :],
                                                                                     torch.finfo(torch.float32).min)
            self.fill = 0.0
        self.positions = attention_mask.long().sum(dim=1, keepdim=True)  # (B, 1) the next token's position
        self.token = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.model, self.cache, self.cache_name = model, cache, cache_name

    def forward(self) -> torch.Tensor:
        """One step on the static buffers: (B, V) logits. No host sync, no new shapes: capturable."""
        self.mask.index_fill_(3, self.slot, self.fill)
        output = self.model(input_ids=self.token, attention_mask={"full_attention": self.mask},
                            position_ids=self.positions, **{self.cache_name: self.cache}, use_cache=True)
        return output.logits[:, -1]

    def advance(self) -> None:
        self.slot.add_(1)
        self.positions.add_(1)

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        self.token.copy_(token.unsqueeze(1))
        logits = self.forward()
        self.advance()
        return logits


class GraphedStep(StaticStep):
    """`StaticStep` whose forward and position update run as one CUDA graph after its first (eager) step."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.graph, self.logits = None, None

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        self.token.copy_(token.unsqueeze(1))
        if self.graph is None:
            logits = self._first_step_then_capture()
        else:
            self.graph.replay()
            logits = self.logits
        return logits.clone()  # the graph's output is overwritten by the next replay

    def _first_step_then_capture(self) -> torch.Tensor:
        # The first step runs eagerly on a side stream (it warms up cuBLAS and the allocator, as capture needs);
        # the capture that follows records the next step without running it.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            logits = self.forward()
            self.advance()
        torch.cuda.current_stream().wait_stream(stream)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.logits = self.forward()
                self.advance()
            self.graph = graph
        except Exception as error:  # noqa: BLE001 - any capture failure: keep decoding eagerly, say so once
            logger.warning("fast sampler: CUDA graph capture failed (%s); decoding without a graph.", error)
            self.__class__ = StaticStep
        return logits


def make_step(model: torch.nn.Module, cache: Any, cache_name: str, attention_mask: torch.Tensor,
              graphed: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """The static step, graphed on CUDA when asked."""
    kind = GraphedStep if graphed and attention_mask.is_cuda else StaticStep
    return kind(model, cache, cache_name, attention_mask)

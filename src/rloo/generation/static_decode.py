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

Attention reads the cache up to the end of the current block of 256 positions. Within a block every step has the
same shapes and the same tensor addresses, so on CUDA the forward is captured once per block and `sample` call
in a `torch.cuda.CUDAGraph` and replayed (`GraphedStep`): one launch a step. Positions no row has
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
# Cache positions attention reads grow in blocks of this many: one graph per block.
ATTENTION_BLOCK = 256


class StaticRowsLayer(DynamicLayer):
    """One layer's (B, H, L, D) key and value buffers, written at `slot` (a (1,) device tensor shared by all
    layers); attention reads all L positions, the mask hides those not reached."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int, slot: torch.Tensor) -> None:
        super().__init__()
        self.keys_buffer, self.values_buffer, self.slot, self.filled = keys, values, slot, filled
        self.keys, self.values = keys, values  # the views attention reads (`StaticStep.show` narrows them)
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, H, 1, D) states at the slot; return the (B, H, visible, D) views attention reads."""
        self.keys_buffer.index_copy_(2, self.slot, key_states)
        self.values_buffer.index_copy_(2, self.slot, value_states)
        return self.keys, self.values

    def get_seq_length(self, *args, **kwargs) -> int:
        # A constant (the prefill's length): a value that moved every step would make a compiler re-trace. The
        # model is given positions and a prepared mask, so nothing reads a position from it.
        return self.filled

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
        return self.keys.shape[-2], 0  # the visible length


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
    the (B, V) next-token logits, then moves the slot and positions on (on the device; the host keeps a count).

    Attention reads the cache up to the end of the current block of `bucket` positions, not all T + room of it:
    the shapes change once a block (one graph per block when graphed), and a long completion's early steps do
    not read the whole buffer (at 16,384 new tokens that halves the cache reads)."""

    def __init__(self, model: torch.nn.Module, cache: Any, cache_name: str, attention_mask: torch.Tensor,
                 bucket: int = 256) -> None:
        rows, filled = attention_mask.shape
        device = attention_mask.device
        layers = cache.layers
        self.length, self.bucket, self.next_slot = layers[0]._key_buffer.shape[-2], bucket, filled  # T + room
        self.slot = torch.full((1,), filled, dtype=torch.long, device=device)
        for layer in layers:  # the room was allocated empty: masked weights are 0, but 0 * NaN is not
            layer._key_buffer[:, :, filled:].zero_()
            layer._value_buffer[:, :, filled:].zero_()
        cache.layers = [StaticRowsLayer(layer._key_buffer, layer._value_buffer, filled, self.slot) for layer in layers]
        allowed = torch.zeros(rows, self.length, dtype=torch.bool, device=device)
        allowed[:, :filled] = attention_mask.bool()
        if model.config._attn_implementation == "sdpa":  # boolean: True takes part
            self.full_mask, self.fill = allowed[:, None, None, :], True
        else:  # eager: added to the scores
            self.full_mask = torch.zeros(rows, 1, 1, self.length, device=device).masked_fill_(
                ~allowed[:, None, None, :], torch.finfo(torch.float32).min)
            self.fill = 0.0
        self.positions = attention_mask.long().sum(dim=1, keepdim=True)  # (B, 1) the next token's position
        self.token = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.model, self.cache, self.cache_name = model, cache, cache_name
        self.show(self.visible_now())

    def visible_now(self) -> int:
        """Cache positions attention reads at the next step: up to the end of the slot's block."""
        return min(self.length, -(-(self.next_slot + 1) // self.bucket) * self.bucket)

    def show(self, visible: int) -> None:
        """Attention reads positions [0, visible) of the buffers and the mask (views: fixed addresses)."""
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys_buffer[:, :, :visible], layer.values_buffer[:, :, :visible]
        self.mask = self.full_mask[..., :visible]

    def forward(self) -> torch.Tensor:
        """One step on the static buffers: (B, V) logits. No host sync, no new shapes: capturable."""
        self.full_mask.index_fill_(3, self.slot, self.fill)
        output = self.model(input_ids=self.token, attention_mask={"full_attention": self.mask},
                            position_ids=self.positions, **{self.cache_name: self.cache}, use_cache=True)
        return output.logits[:, -1]

    def advance(self) -> None:
        self.slot.add_(1)
        self.positions.add_(1)

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        self.token.copy_(token.unsqueeze(1))
        self.show(self.visible_now())
        logits = self.forward()
        self.advance()
        self.next_slot += 1
        return logits


class GraphedStep(StaticStep):
    """`StaticStep` whose forward and slot update run as a CUDA graph: one per block of positions, captured after
    the block's first (eager) step, all in one memory pool (they replay in the order they were captured)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.graphs, self.outputs, self.pool, self.capture_failed = {}, {}, None, False

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        visible = self.visible_now()
        if self.capture_failed:
            return super().__call__(token)
        self.token.copy_(token.unsqueeze(1))
        self.show(visible)
        if visible in self.graphs:
            self.graphs[visible].replay()
            logits = self.outputs[visible].clone()  # the graph's output is overwritten by the next replay
        else:
            logits = self._eager_step_then_capture(visible)
        self.next_slot += 1
        return logits

    def _eager_step_then_capture(self, visible: int) -> torch.Tensor:
        # The block's first step runs eagerly on a side stream (it warms up cuBLAS and the allocator, as capture
        # needs); the capture that follows records the block's next steps without running them.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            logits = self.forward()
            self.advance()
        torch.cuda.current_stream().wait_stream(stream)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs[visible] = self.forward()
                self.advance()
            self.graphs[visible], self.pool = graph, self.pool or graph.pool()
        except Exception as error:  # noqa: BLE001 - any capture failure: keep decoding eagerly, say so once
            logger.warning("fast sampler: CUDA graph capture failed (%s); decoding without a graph.", error)
            self.capture_failed = True
        return logits


def make_step(model: torch.nn.Module, cache: Any, cache_name: str, attention_mask: torch.Tensor,
              graphed: bool, bucket: int | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The static step, graphed on CUDA when asked; attention reads blocks of `bucket` (ATTENTION_BLOCK) positions."""
    kind = GraphedStep if graphed and attention_mask.is_cuda else StaticStep
    return kind(model, cache, cache_name, attention_mask, bucket or ATTENTION_BLOCK)

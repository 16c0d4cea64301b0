"""A KV cache that appends in place: the decode loop's memory traffic stays linear in length.

transformers' `DynamicLayer` appends a step's keys and values with `torch.cat`, which copies the
whole past every step (quadratic traffic; 40% of a decode step at 100 cached positions on CPU).
`AppendInPlaceLayer` keeps the keys and values in a buffer with room for the completion, writes
each step into the next free slots and hands attention a view of the filled prefix, so attention
still sees only real positions. It is a `DynamicLayer` in every other respect.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class AppendInPlaceLayer(DynamicLayer):
    """One layer's keys and values, (B, H, T, D) views into (B, H, T + room, D) buffers."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room  # positions to reserve beyond the prefill

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, H, n, D) states; return the (B, H, T + n, D) keys and values so far."""
        if not self.is_initialized or self.keys.numel() == 0:
            self.lazy_initialization(key_states, value_states)
            self._key_buffer = self._allocate(key_states)
            self._value_buffer = self._allocate(value_states)
        length, new = self.get_seq_length(), key_states.shape[-2]
        if length + new > self._key_buffer.shape[-2]:  # out of room: behave like DynamicLayer
            return super().update(key_states, value_states)
        self._key_buffer[:, :, length : length + new] = key_states
        self._value_buffer[:, :, length : length + new] = value_states
        self.keys = self._key_buffer[:, :, : length + new]
        self.values = self._value_buffer[:, :, : length + new]
        return self.keys, self.values

    def _allocate(self, states: torch.Tensor) -> torch.Tensor:
        batch, heads, length, dim = states.shape
        return states.new_empty(batch, heads, length + self.room, dim)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every row `repeats` times, room included (the K samples of one prompt)."""
        if self.get_seq_length() > 0:
            length = self.get_seq_length()
            self._key_buffer = self._key_buffer.repeat_interleave(repeats, dim=0)
            self._value_buffer = self._value_buffer.repeat_interleave(repeats, dim=0)
            self.keys = self._key_buffer[:, :, :length]
            self.values = self._value_buffer[:, :, :length]


def append_in_place_cache(config, room: int) -> DynamicCache:
    """A DynamicCache for `config` whose full-attention layers append in place with `room` spare slots.

    Sliding-window or other special layers keep transformers' own implementation.
    """
    cache = DynamicCache(config=config)
    cache.layers = [AppendInPlaceLayer(room) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def filled_states(cache: DynamicCache, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (B, H, length, D) keys and values: the first `length` positions of its append-in-place views,
    or of the static decode step's buffers (`static_decode.StaticRowsLayer`, which replaces the layers it ran on)."""
    states = []
    for layer in cache.layers:
        keys, values = getattr(layer, "keys_buffer", layer.keys), getattr(layer, "values_buffer", layer.values)
        states.append((keys[:, :, :length], values[:, :, :length]))
    return states


def cache_from_states(config, states: list[tuple[torch.Tensor, torch.Tensor]], room: int) -> DynamicCache:
    """A new append-in-place cache holding `states` ((B, H, T, D) keys and values per layer) with `room` spare slots."""
    cache = append_in_place_cache(config, room)
    for layer, (keys, values) in zip(cache.layers, states, strict=True):
        layer.update(keys, values)  # copied into a (B, H, T + room, D) buffer
    return cache

"""Stop strings: cut sampled completions after the first stop string, after sampling.

Stop *tokens* are handled by the sampler (they join EOS in `eos_token_ids`). A stop *string* can
span several tokens and a token can hold more than one character, so it is matched on decoded text:
the completion keeps the shortest prefix of tokens whose text contains a stop string (the string
included, as `generate(stop_strings=...)` does) and is then treated as ended, like one that emitted
EOS. Containing a stop string is monotone in the prefix length, so a binary search needs
O(log C) decodes per completion.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch


def stop_string_length(token_ids: Sequence[int], decode: Callable[[list[int]], str], stop_strings: Sequence[str]) -> int | None:
    """Length in tokens of the shortest prefix of `token_ids` whose text contains a stop string.

    Args:
        token_ids: the completion's real tokens (no padding).
        decode: token ids -> text.
        stop_strings: strings that end a completion.

    Returns:
        The prefix length (>= 1), or None when the whole text contains no stop string.
    """
    token_ids = list(token_ids)

    def contains(length: int) -> bool:
        text = decode(token_ids[:length])
        return any(stop in text for stop in stop_strings)

    if not token_ids or not contains(len(token_ids)):
        return None
    low, high = 1, len(token_ids)  # the answer lies in [low, high]
    while low < high:
        middle = (low + high) // 2
        if contains(middle):
            high = middle
        else:
            low = middle + 1
    return low


def cut_at_stop_strings(
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    has_eos: torch.Tensor,
    decode: Callable[[list[int]], str],
    stop_strings: Sequence[str],
    pad_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cut every completion after its first stop string and mark it as ended.

    Args:
        completion_ids: (B, C) sampled tokens, padded after the end.
        completion_mask: (B, C) 1 for real tokens (up to and including EOS).
        has_eos: (B,) bool, the completion ended (EOS or a stop token).
        decode: token ids -> text, e.g. `lambda ids: tokenizer.decode(ids, skip_special_tokens=True)`.
        stop_strings: strings that end a completion.
        pad_token_id: written after the cut.

    Returns:
        New (B, C) ids, (B, C) mask and (B,) ended flags; rows without a stop string are unchanged.
    """
    ids, mask, ended = completion_ids.clone(), completion_mask.clone(), has_eos.clone()
    for row in range(ids.shape[0]):
        real = ids[row][mask[row].bool()].tolist()
        length = stop_string_length(real, decode, stop_strings)
        if length is None:
            continue
        mask[row, length:] = 0
        ids[row, length:] = pad_token_id
        ended[row] = True
    return ids, mask, ended

"""Log-probs and entropies of target tokens straight from the final hidden states, a tile at a time.

The (N, V) logits of N tokens over a V-word vocabulary are never built: each tile of
`tile_rows(V)` tokens is pushed through the LM head, reduced to a log-prob (and an entropy when
asked), and dropped. Backward recomputes each tile's logits and accumulates the gradients of the
hidden states and of the head weight (and bias), so memory grows with the tile, not with N * V.
A tied head gets its gradient like any other use of the shared weight.

Per tile, with z = softcap(h W^T + b) / temperature, p = softmax(z), lp = log p:
    logprob_i = lp_{i, y_i}
    entropy_i = -sum_j p_ij lp_ij
    d logprob_i / d z_ij = onehot(y_i)_j - p_ij
    d entropy_i / d z_ij = -p_ij (lp_ij + entropy_i)
"""

from __future__ import annotations

import torch

# Logit elements of one tile: 2^24 fp32 values (64 MiB); a few such buffers live at once per tile.
TILE_ELEMENTS = 1 << 24


def tile_rows(vocab_size: int) -> int:
    """Tokens per tile, so that one tile's fp32 logits hold at most TILE_ELEMENTS values (at least 1 row)."""
    return max(1, TILE_ELEMENTS // max(1, vocab_size))


def _tile_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float,
                 softcap: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(n, H) hidden -> (n, V) fp32 scaled logits z, and tanh(l / cap) when soft-capped (for backward).

    One (n, V) buffer (two when soft-capped; one more, in the head's dtype, for a bf16 head): the scaling
    is done in place on the fresh logits."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float()  # (n, V), in the head's dtype then fp32
    tanh = None
    if softcap is not None:
        tanh = torch.tanh(logits.div_(softcap))
        logits = torch.mul(tanh, softcap, out=logits)
    return (logits if temperature == 1.0 else logits.div_(temperature)), tanh


class TiledHeadLogprobs(torch.autograd.Function):
    """(N, H) hidden, (V, H) weight, (V,) bias or None, (N,) targets -> (N,) log-probs, (N,) entropies.

    The entropies are zeros unless `with_entropy`; their gradient is used only when they are. Each tile
    works in place on at most two (n, V) fp32 buffers, forward and backward (the tile's size is what a
    step's memory pays for the head, on top of the activations it keeps).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, softcap, with_entropy, rows):
        logps = hidden.new_empty(hidden.shape[0], dtype=torch.float32)  # (N,)
        entropy = torch.zeros_like(logps)  # (N,)
        log_normalizer = torch.empty_like(logps)  # (N,)
        for start in range(0, hidden.shape[0], rows):
            tile = slice(start, start + rows)
            z, _ = _tile_logits(hidden[tile], weight, bias, temperature, softcap)  # (n, V)
            lse = torch.logsumexp(z, dim=-1)  # (n,)
            log_normalizer[tile] = lse
            logps[tile] = z.gather(-1, targets[tile].unsqueeze(-1)).squeeze(-1) - lse
            if with_entropy:  # H = lse - sum_j p_j z_j
                entropy[tile] = lse - torch.softmax(z, dim=-1).mul_(z).sum(dim=-1)
            del z
        ctx.save_for_backward(hidden, weight, bias, targets, log_normalizer, entropy)
        ctx.settings = (temperature, softcap, with_entropy, rows)
        ctx.autocast = autocast_state(hidden.device.type)
        ctx.set_materialize_grads(False)
        return logps, entropy

    @staticmethod
    def backward(ctx, grad_logps, grad_entropy):
        hidden, weight, bias, targets, log_normalizer, entropy = ctx.saved_tensors
        temperature, softcap, with_entropy, rows = ctx.settings
        if not with_entropy:
            grad_entropy = None
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_bias else None
        # Backward runs outside the forward's autocast: re-enter it, so that each tile's recomputed logits are the
        # forward's (bf16 products under bf16 autocast) and the softmax they give matches the saved normaliser.
        with torch.autocast(**ctx.autocast):
            return TiledHeadLogprobs._backward_tiles(hidden, weight, bias, targets, log_normalizer, entropy,
                                                     grad_logps, grad_entropy, grad_hidden, grad_weight, grad_bias,
                                                     temperature, softcap, rows)

    @staticmethod
    def _backward_tiles(hidden, weight, bias, targets, log_normalizer, entropy, grad_logps, grad_entropy,
                        grad_hidden, grad_weight, grad_bias, temperature, softcap, rows):
        need_hidden, need_weight, need_bias = grad_hidden is not None, grad_weight is not None, grad_bias is not None
        for start in range(0, hidden.shape[0], rows):
            tile = slice(start, start + rows)
            grad_logits = _tile_grad_logits(hidden[tile], weight, bias, targets[tile], log_normalizer[tile],
                                            entropy[tile], None if grad_logps is None else grad_logps[tile],
                                            None if grad_entropy is None else grad_entropy[tile], temperature, softcap)
            if need_hidden:
                grad_hidden[tile] = (grad_logits.to(weight.dtype) @ weight).to(hidden.dtype)
            if need_weight:
                grad_weight.addmm_(grad_logits.t(), hidden[tile].float())  # no (V, H) temporary per tile
            if need_bias:
                grad_bias += grad_logits.sum(dim=0)
            del grad_logits  # before the next tile's buffers are made, not after
        grad_weight = None if grad_weight is None else grad_weight.to(weight.dtype)
        grad_bias = None if grad_bias is None else grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def autocast_state(device_type: str) -> dict:
    """torch.autocast's arguments for the autocast in force on `device_type` now (enabled or not)."""
    return {"device_type": device_type, "enabled": torch.is_autocast_enabled(device_type),
            "dtype": torch.get_autocast_dtype(device_type)}


def _tile_grad_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                      log_normalizer: torch.Tensor, entropy: torch.Tensor, grad_logps: torch.Tensor | None,
                      grad_entropy: torch.Tensor | None, temperature: float, softcap: float | None) -> torch.Tensor:
    """One tile's (n, V) gradient with respect to the head's output h W^T + b, in two (n, V) buffers.

    d/dz of sum_i g_i logprob_i + e_i entropy_i = g_i (onehot(y_i) - p_i) - e_i p_i (lp_i + H_i), where
    g = grad_logps (n,), e = grad_entropy (n,), either None when that output got no gradient.
    """
    z, tanh = _tile_logits(hidden, weight, bias, temperature, softcap)  # (n, V)
    logp = z.sub_(log_normalizer.unsqueeze(-1))  # (n, V), in z's buffer
    grad_z = logp.exp()  # p (n, V), the second buffer, which becomes the result
    if grad_entropy is not None:
        scale = logp.add_(entropy.unsqueeze(-1)).mul_(grad_entropy.unsqueeze(-1))  # e (lp + H), in z's buffer
        grad_z.mul_(scale if grad_logps is None else scale.add_(grad_logps.unsqueeze(-1))).neg_()
    elif grad_logps is not None:
        grad_z.mul_(grad_logps.unsqueeze(-1)).neg_()
    else:
        grad_z.zero_()
    del z, logp
    if grad_logps is not None:
        grad_z.scatter_add_(-1, targets.unsqueeze(-1), grad_logps.unsqueeze(-1).float())
    if temperature != 1.0:
        grad_z.div_(temperature)  # now d/dl of the unscaled logits l = (soft-capped) h W^T + b
    if tanh is not None:
        grad_z.mul_(tanh.square_().neg_().add_(1))  # d(cap tanh(l / cap)) / dl = 1 - tanh^2
    return grad_z


def tiled_head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float = 1.0,
    softcap: float | None = None,
    with_entropy: bool = False,
    rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `targets` (and entropies) under softmax(softcap(hidden W^T + b) / temperature).

    Args:
        hidden: (B, C, H) final hidden states, position t predicting targets[:, t].
        weight: (V, H) LM-head weight (the embedding matrix when tied).
        bias: (V,) LM-head bias or None.
        targets: (B, C) token ids.
        temperature: the logits are divided by it after soft-capping, as sampling does.
        softcap: Gemma-2's final_logit_softcapping (logits -> cap * tanh(logits / cap)), or None.
        with_entropy: also return entropies (extra work on the same tiles, no extra pass).
        rows: tokens per tile; defaults to tile_rows(V).

    Returns:
        (B, C) fp32 log-probs, and (B, C) fp32 entropies or None.
    """
    batch, length, width = hidden.shape
    rows = rows or tile_rows(weight.shape[0])
    logps, entropy = TiledHeadLogprobs.apply(hidden.reshape(-1, width), weight, bias, targets.reshape(-1),
                                             float(temperature), softcap, with_entropy, rows)
    return logps.view(batch, length), entropy.view(batch, length) if with_entropy else None

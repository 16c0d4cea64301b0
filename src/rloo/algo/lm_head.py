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

Precision. Under autocast to a 16-bit type (bf16 on CUDA), or with 16-bit head weights, every product of the
head, the weight-gradient product included, runs with 16-bit operands and fp32 accumulation
(`head_compute_dtype`): the weight and the hidden states are cast once per call, not once per tile (autocast
caches casts only of leaf weights that require grad, so a frozen reference's head was re-cast every tile), the
logits come out in fp32 (`out_dtype` matmuls on CUDA, whose tensor cores accumulate in fp32), and the weight
gradient is accumulated in fp32 by an out-of-place product: an in-place `addmm_` is invisible to autocast and
ran fp32 on CUDA cores. In fp32 (no autocast, fp32 weights) the products stay fp32, as before.

Tiles. On CPU a tile holds TILE_ELEMENTS logits (64 MiB in fp32); on CUDA up to CUDA_TILE_ELEMENTS (1 GiB),
bounded by the free device memory (`tile_rows`): a few hundred to a couple of thousand tokens a tile, so a
step's launches and its rewrites of the fp32 weight gradient fall by 16x. Each tile's log-sum-exp and
entropy come from one pass over exp(z - max z): sum_j e_j and sum_j e_j z_j (a batched dot product, no
(n, V) temporary).
"""

from __future__ import annotations

import contextlib

import torch

# Logit elements of one tile on CPU: 2^24 fp32 values (64 MiB); a few such buffers live at once per tile.
TILE_ELEMENTS = 1 << 24
# On CUDA: up to 2^28 (1 GiB in fp32), and at most 1/CUDA_FREE_SHARE of the free memory per buffer.
CUDA_TILE_ELEMENTS = 1 << 28
CUDA_FREE_SHARE = 8
HALF_TYPES = (torch.bfloat16, torch.float16)


def tile_rows(vocab_size: int, device: torch.device | str | None = None) -> int:
    """Tokens per tile (at least 1): one tile's fp32 logits hold at most TILE_ELEMENTS values on CPU, and on
    CUDA at most CUDA_TILE_ELEMENTS and 1/CUDA_FREE_SHARE of the memory free there (the driver's free memory
    plus what PyTorch holds unallocated)."""
    elements = TILE_ELEMENTS
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        elements = max(TILE_ELEMENTS, min(CUDA_TILE_ELEMENTS, free // (4 * CUDA_FREE_SHARE)))
    return max(1, elements // max(1, vocab_size))


def head_compute_dtype(device_type: str, weight: torch.Tensor) -> torch.dtype | None:
    """The 16-bit operand type of the head's products (fp32 accumulation), or None for fp32 products: the
    autocast type in force on `device_type`, else the weight's own type when it is 16-bit."""
    if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) in HALF_TYPES:
        return torch.get_autocast_dtype(device_type)
    return weight.dtype if weight.dtype in HALF_TYPES else None


def mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(m, k) @ (k, n) -> (m, n) fp32 from 16-bit operands: one tensor-core product with fp32 output on CUDA;
    elsewhere the product in the operands' type (fp32 accumulation on CPU), then fp32."""
    if a.is_cuda and _OUT_DTYPE_PRODUCTS["cuda"]:
        try:
            return torch.mm(a, b, out_dtype=torch.float32)
        except (TypeError, RuntimeError, NotImplementedError):  # a torch or card without it: 16-bit output
            _OUT_DTYPE_PRODUCTS["cuda"] = False
    return torch.mm(a, b).float()


_OUT_DTYPE_PRODUCTS = {"cuda": True}  # whether `torch.mm(..., out_dtype=torch.float32)` ran here (first call says)


def _tile_logits_cast(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float,
                      softcap: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As `_tile_logits`, from operands already in the compute type: (n, H) hidden, (V, H) weight -> (n, V) fp32."""
    logits = mm_fp32(hidden, weight.t())  # (n, V)
    if bias is not None:
        logits.add_(bias.float())
    return _scale(logits, temperature, softcap)


def _tile_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float,
                 softcap: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(n, H) hidden -> (n, V) fp32 scaled logits z, and tanh(l / cap) when soft-capped (for backward).

    One (n, V) buffer (two when soft-capped; one more, in the head's dtype, for a bf16 head): the scaling
    is done in place on the fresh logits."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float()  # (n, V), in the head's dtype then fp32
    return _scale(logits, temperature, softcap)


def _scale(logits: torch.Tensor, temperature: float, softcap: float | None
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Soft-cap and temperature, in place on fresh (n, V) fp32 logits; tanh(l / cap) too when soft-capped."""
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
    def forward(ctx, hidden, weight, bias, targets, temperature, softcap, with_entropy, rows, cast):
        logps = hidden.new_empty(hidden.shape[0], dtype=torch.float32)  # (N,)
        entropy = torch.zeros_like(logps)  # (N,)
        log_normalizer = torch.empty_like(logps)  # (N,)
        compute = head_compute_dtype(hidden.device.type, weight) if cast else None
        with _explicit_casts(hidden.device.type, compute):
            tile_logits, operands = _tile_function(hidden, weight, compute)
            for start in range(0, hidden.shape[0], rows):
                tile = slice(start, start + rows)
                z, _ = tile_logits(operands[0][tile], operands[1], bias, temperature, softcap)  # (n, V)
                lse, entropy_tile = _normalizer_and_entropy(z, with_entropy)  # (n,), (n,) or None
                log_normalizer[tile] = lse
                logps[tile] = z.gather(-1, targets[tile].unsqueeze(-1)).squeeze(-1) - lse
                if with_entropy:
                    entropy[tile] = entropy_tile
                del z
        ctx.save_for_backward(hidden, weight, bias, targets, log_normalizer, entropy)
        ctx.settings = (temperature, softcap, with_entropy, rows, compute)
        ctx.autocast = autocast_state(hidden.device.type)
        ctx.set_materialize_grads(False)
        return logps, entropy

    @staticmethod
    def backward(ctx, grad_logps, grad_entropy):
        hidden, weight, bias, targets, log_normalizer, entropy = ctx.saved_tensors
        temperature, softcap, with_entropy, rows, compute = ctx.settings
        if not with_entropy:
            grad_entropy = None
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_bias else None
        if compute is not None:  # the forward's explicit casts: the same logits, whatever autocast says now
            with _explicit_casts(hidden.device.type, compute):
                return TiledHeadLogprobs._backward_tiles_cast(hidden, weight, bias, targets, log_normalizer, entropy,
                                                              grad_logps, grad_entropy, grad_hidden, grad_weight,
                                                              grad_bias, temperature, softcap, rows, compute)
        # Backward runs outside the forward's autocast: re-enter it, so that each tile's recomputed logits are the
        # forward's (bf16 products under bf16 autocast) and the softmax they give matches the saved normaliser.
        with torch.autocast(**ctx.autocast):
            return TiledHeadLogprobs._backward_tiles(hidden, weight, bias, targets, log_normalizer, entropy,
                                                     grad_logps, grad_entropy, grad_hidden, grad_weight, grad_bias,
                                                     temperature, softcap, rows)

    @staticmethod
    def _backward_tiles_cast(hidden, weight, bias, targets, log_normalizer, entropy, grad_logps, grad_entropy,
                             grad_hidden, grad_weight, grad_bias, temperature, softcap, rows, compute):
        """The backward with 16-bit operands cast once and fp32 accumulation: (n, V) fp32 gradient of the logits
        per tile, cast to `compute` once and used by both products."""
        weight_c, hidden_c = weight.to(compute), hidden.to(compute)  # (V, H), (N, H): one cast per call
        for start in range(0, hidden.shape[0], rows):
            tile = slice(start, start + rows)
            grad_logits = _tile_grad_logits(hidden_c[tile], weight_c, bias, targets[tile], log_normalizer[tile],
                                            entropy[tile], None if grad_logps is None else grad_logps[tile],
                                            None if grad_entropy is None else grad_entropy[tile], temperature,
                                            softcap, tile_logits=_tile_logits_cast)  # (n, V) fp32
            if grad_bias is not None:
                grad_bias += grad_logits.sum(dim=0)
            grad_c = grad_logits.to(compute)  # (n, V)
            del grad_logits
            if grad_hidden is not None:
                grad_hidden[tile] = mm_fp32(grad_c, weight_c).to(hidden.dtype)  # (n, H)
            if grad_weight is not None:
                grad_weight += mm_fp32(grad_c.t(), hidden_c[tile])  # (V, H), fp32 accumulation, seen by no autocast
            del grad_c
        grad_weight = None if grad_weight is None else grad_weight.to(weight.dtype)
        grad_bias = None if grad_bias is None else grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None

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
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None


def _explicit_casts(device_type: str, compute: torch.dtype | None):
    """Autocast off while the explicit-cast path runs (it casts its own operands); a no-op for the fp32 path."""
    if compute is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def _tile_function(hidden: torch.Tensor, weight: torch.Tensor, compute: torch.dtype | None):
    """The tile-logits function and its (hidden, weight) operands: cast once to `compute` when given."""
    if compute is None:
        return _tile_logits, (hidden, weight)
    return _tile_logits_cast, (hidden.to(compute), weight.to(compute))


def _normalizer_and_entropy(z: torch.Tensor, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(n, V) fp32 scaled logits -> (n,) log-sum-exp and (n,) entropy (None unless asked), from one second
    (n, V) buffer e = exp(z - max z): lse = max + log sum e, H = lse - sum_j e_j z_j / sum e."""
    peak = z.amax(dim=-1, keepdim=True)  # (n, 1)
    e = torch.sub(z, peak).exp_()  # (n, V)
    total = e.sum(dim=-1)  # (n,)
    lse = peak.squeeze(-1) + total.log()
    if not with_entropy:
        return lse, None
    weighted = torch.bmm(e.unsqueeze(1), z.unsqueeze(2)).view(-1)  # (n,) sum_j e_j z_j, no (n, V) temporary
    return lse, lse - weighted / total


def autocast_state(device_type: str) -> dict:
    """torch.autocast's arguments for the autocast in force on `device_type` now (enabled or not)."""
    return {"device_type": device_type, "enabled": torch.is_autocast_enabled(device_type),
            "dtype": torch.get_autocast_dtype(device_type)}


def _tile_grad_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                      log_normalizer: torch.Tensor, entropy: torch.Tensor, grad_logps: torch.Tensor | None,
                      grad_entropy: torch.Tensor | None, temperature: float, softcap: float | None,
                      tile_logits=None) -> torch.Tensor:
    """One tile's (n, V) gradient with respect to the head's output h W^T + b, in two (n, V) buffers.

    d/dz of sum_i g_i logprob_i + e_i entropy_i = g_i (onehot(y_i) - p_i) - e_i p_i (lp_i + H_i), where
    g = grad_logps (n,), e = grad_entropy (n,), either None when that output got no gradient.
    """
    z, tanh = (tile_logits or _tile_logits)(hidden, weight, bias, temperature, softcap)  # (n, V)
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
    cast: bool = True,
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
        rows: tokens per tile; defaults to tile_rows(V, device).
        cast: 16-bit products with fp32 accumulation and one cast per call when autocast or the weight asks for
            16 bits (`head_compute_dtype`); False runs each tile's products as the autocast in force casts them
            (the path before issue #46, kept for gpu_micro's comparison).

    Returns:
        (B, C) fp32 log-probs, and (B, C) fp32 entropies or None.
    """
    batch, length, width = hidden.shape
    rows = rows or tile_rows(weight.shape[0], hidden.device)
    logps, entropy = TiledHeadLogprobs.apply(hidden.reshape(-1, width), weight, bias, targets.reshape(-1),
                                             float(temperature), softcap, with_entropy, rows, cast)
    return logps.view(batch, length), entropy.view(batch, length) if with_entropy else None

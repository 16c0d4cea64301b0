"""Fewer activations kept for backward by the policy's gated-SiLU MLPs and RMSNorms; the same gradients.

Autograd keeps what each small op needs for its own backward. A SwiGLU MLP, down(silu(gate(x)) * up(x)),
then keeps four tensors of the intermediate width per token: gate (for silu), silu(gate) and up (for
the product) and the product (for down's weight gradient). Only gate and up are needed: the rest is
elementwise and cheap to redo. `SwiGLUDown` runs silu, product and down_proj as one
autograd node that keeps gate and up; where down_proj is not a plain Linear (LoRA, ZeRO-3's gathered
weights, a hook on it), `SiluMul` does the same for silu and product and down_proj runs as itself.
Llama's RMSNorm keeps its input and the normalised input; `RMSNormFunction` keeps the input and one
reciprocal RMS per token. Both recompute in backward only what autograd had stored.

On SmolLM2-135M (hidden 576, MLP 1,536), one prompt of 135 tokens and 4 completions of 128, this cuts
the tensors kept for backward from 957 to 645 MB (benchmarks/memory/saved_activations.py, docs/memory.md).
Each module class is checked once against its own forward on a random input before it is switched;
one that does something else (a Gemma norm's 1 + weight, a GELU MLP, another signature) keeps its
forward. Outside training mode or without grad the modules run their own forward.

    RMSNorm, with r = (mean_j x_j^2 + eps)^(-1/2), n = x r, y = w * n:
        dL/dw = sum over tokens of g * n
        dL/dx = r * (g w - n * mean_j(g_j w_j n_j))
    SwiGLU tail, with a = silu(gate), out = (a * up) W^T + b:
        dL/dW = g^T (a * up),  dL/db = sum over tokens of g,  dL/d(a * up) = g W
        dL/dup = (g W) * a,    dL/dgate = silu'(gate) * (g W) * up
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


class SwiGLUDown(torch.autograd.Function):
    """(..., I) gate, (..., I) up, (H, I) weight, (H,) bias or None -> (..., H) = down(silu(gate) * up).

    Keeps gate and up (and the weight, as a Linear does); the product is rebuilt in backward. Under
    autocast the product and the matrix products run in the dtype the forward's linear used."""

    @staticmethod
    def forward(ctx, gate, up, weight, bias):
        out = F.linear(F.silu(gate) * up, weight, bias)  # (..., H)
        ctx.save_for_backward(gate, up, weight)
        ctx.has_bias, ctx.dtype = bias is not None, out.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        gate, up, weight = ctx.saved_tensors
        grad_out = grad_out.to(ctx.dtype).reshape(-1, grad_out.shape[-1])  # (T, H)
        act = F.silu(gate).reshape(-1, gate.shape[-1])  # (T, I)
        up = up.reshape(-1, up.shape[-1])
        need_weight, need_bias = ctx.needs_input_grad[2:]  # False for a frozen down_proj (LoRA elsewhere)
        grad_weight = (grad_out.t() @ (act * up).to(ctx.dtype)).to(weight.dtype) if need_weight else None  # (H, I)
        grad_product = (grad_out @ weight.to(ctx.dtype)).to(gate.dtype)  # (T, I)
        grad_up = grad_product * act
        grad_gate = torch.ops.aten.silu_backward(grad_product.mul_(up), gate.reshape(-1, gate.shape[-1]))
        grad_bias = grad_out.sum(0).to(weight.dtype) if ctx.has_bias and need_bias else None
        return grad_gate.view(gate.shape), grad_up.view(gate.shape), grad_weight, grad_bias


class SiluMul(torch.autograd.Function):
    """(..., I) gate, (..., I) up -> (..., I) silu(gate) * up, keeping gate and up only."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        return torch.ops.aten.silu_backward(grad * up, gate), grad * F.silu(gate)


class RMSNormFunction(torch.autograd.Function):
    """(..., H) x, (H,) weight, eps -> (..., H) weight * (x / RMS(x)), as Llama's RMSNorm computes it
    (statistics in fp32, or fp64 for fp64 x; the normalised input cast back to x's dtype before the weight).

    Keeps x and the (..., 1) reciprocal RMS; the normalised input is rebuilt in backward."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        rstd = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1)
        ctx.save_for_backward(x, rstd, weight)
        return weight * (wide * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        normed = x.to(rstd.dtype) * rstd  # (..., H)
        grad_weight = None
        if ctx.needs_input_grad[1]:  # False for a frozen norm (LoRA)
            grad_weight = (grad * normed.to(x.dtype)).reshape(-1, grad.shape[-1]).sum(0).to(weight.dtype)
        grad_normed = (grad * weight).to(rstd.dtype)
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None


class LeanSwiGLU(torch.nn.Module):
    """Mixed into a gated-SiLU MLP's class (gate_proj, up_proj, down_proj): its forward, keeping gate
    and up only when training."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) != 1 or kwargs or not (self.training and torch.is_grad_enabled()):
            return super().forward(*args, **kwargs)
        return swiglu(self, args[0])


class LeanRMSNorm(torch.nn.Module):
    """Mixed into an RMSNorm's class: its forward, keeping the input and the reciprocal RMS when training."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) != 1 or kwargs or not (self.training and torch.is_grad_enabled()):
            return super().forward(*args, **kwargs)
        return rms_norm(self, args[0])


def swiglu(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    gate, up, down = mlp.gate_proj(x), mlp.up_proj(x), mlp.down_proj
    if _plain_linear(down):
        return SwiGLUDown.apply(gate, up, down.weight, down.bias)
    return down(SiluMul.apply(gate, up))


def rms_norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return RMSNormFunction.apply(x, norm.weight, _epsilon(norm))


def _plain_linear(module: torch.nn.Module) -> bool:
    """A Linear whose weight can be used outside its own call: no hooks (accelerate's offload, ZeRO-3's
    gathering) and no partitioned weight."""
    return (type(module) is torch.nn.Linear and not module._forward_pre_hooks and not module._forward_hooks
            and not hasattr(module, "_hf_hook") and not hasattr(module.weight, "ds_id"))


def _epsilon(norm: torch.nn.Module) -> float:
    return norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps


@dataclass
class LeanModules:
    """What `lean_activations` switched: module counts, and the classes left as they were."""

    mlps: int = 0
    norms: int = 0
    kept: tuple[str, ...] = ()


def lean_activations(model: torch.nn.Module) -> LeanModules:
    """Switch every gated-SiLU MLP and Llama-style RMSNorm of `model` whose class passes the check to its
    lean form (in place, by class, so that a deep copy runs its own weights). Idempotent."""
    result, kept, verdicts = LeanModules(), set(), {}
    for module in model.modules():
        if isinstance(module, (LeanSwiGLU, LeanRMSNorm)):
            result.mlps += isinstance(module, LeanSwiGLU)
            result.norms += isinstance(module, LeanRMSNorm)
            continue
        kind = _kind(module)
        if kind is None:
            continue
        key = (type(module), type(getattr(module, "act_fn", None)))
        if key not in verdicts:
            verdicts[key] = _same_as_own_forward(module, kind)
        if not verdicts[key]:
            kept.add(type(module).__name__)
            continue
        module.__class__ = _lean_class(type(module), kind)
        result.mlps += kind == "mlp"
        result.norms += kind == "norm"
    result.kept = tuple(sorted(kept))
    return result


def _kind(module: torch.nn.Module) -> str | None:
    if all(isinstance(getattr(module, name, None), torch.nn.Module) for name in ("gate_proj", "up_proj", "down_proj")):
        return "mlp" if hasattr(module, "act_fn") else None
    weight = getattr(module, "weight", None)
    if (type(module).__name__.endswith("RMSNorm") and isinstance(weight, torch.nn.Parameter) and weight.dim() == 1
            and (hasattr(module, "variance_epsilon") or hasattr(module, "eps"))):
        return "norm"
    return None


@torch.no_grad()
def _same_as_own_forward(module: torch.nn.Module, kind: str) -> bool:
    """The lean computation gives the module's own output on a random input (in its weights' dtype)."""
    try:
        if kind == "norm":
            width, dtype = module.weight.shape[0], module.weight.dtype
        else:
            width = module.gate_proj.in_features
            dtype = next(p.dtype for p in module.parameters() if p.is_floating_point())
        device = next(module.parameters()).device
        x = torch.randn(2, 3, width, generator=torch.Generator().manual_seed(0)).to(device, dtype)
        want = type(module).forward(module, x)
        got = rms_norm(module, x) if kind == "norm" else swiglu(module, x)
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        return isinstance(want, torch.Tensor) and torch.allclose(got, want, rtol=tolerance, atol=tolerance)
    except Exception:  # meta or partitioned weights, another signature: leave the module as it is
        return False


@functools.cache
def _lean_class(module_class: type, kind: str) -> type:
    mixin = LeanSwiGLU if kind == "mlp" else LeanRMSNorm
    return type(f"Lean{module_class.__name__}", (mixin, module_class), {})

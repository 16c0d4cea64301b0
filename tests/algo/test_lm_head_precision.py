"""The tiled head's 16-bit path (issue #46): 16-bit products with fp32 accumulation, the weight cast once per call.

On CPU the path runs in bf16 under CPU autocast (the same code as on CUDA but the `out_dtype` product); its
log-probs, entropies and gradients must stay within bf16's tolerance of the fp32 plain path, every product must
take 16-bit operands (the weight gradient's too: an in-place fp32 `addmm_` is invisible to autocast), and the
weight must be cast once per call, not once per tile. The `cuda` tests run the same on a GPU (scripts/gpu_lease.sh).
"""

import pytest
import torch

from rloo.algo import lm_head
from rloo.algo.lm_head import head_compute_dtype, tile_rows, tiled_head_logprobs

BF16_TOLERANCE = 2e-2  # relative error, as benchmarks/gpu/gpu_check.py judges bf16 paths


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()


def plain(hidden, weight, bias, targets, temperature):
    """fp32 reference: whole logits, autograd's gradients."""
    logp = torch.log_softmax(torch.nn.functional.linear(hidden, weight, bias) / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def inputs(device="cpu", vocab=3000, width=64, tokens=96, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = (2 * torch.randn(2, tokens // 2, width, generator=gen)).to(device).requires_grad_()
    weight = (0.3 * torch.randn(vocab, width, generator=gen)).to(device).requires_grad_()
    bias = (0.1 * torch.randn(vocab, generator=gen)).to(device).requires_grad_()
    targets = torch.randint(0, vocab, (2, tokens // 2), generator=gen).to(device)
    mix = torch.randn(2, tokens // 2, generator=gen).to(device)
    return hidden, weight, bias, targets, mix


def run(hidden, weight, bias, targets, mix, temperature, head, **autocast):
    parameters = (hidden, weight, bias)
    with torch.autocast(**autocast) if autocast else torch.autocast("cpu", enabled=False):
        logps, entropy = head(hidden, weight, bias, targets, temperature)
    grads = torch.autograd.grad((logps * mix).sum() + 0.3 * (entropy * mix).sum(), parameters)
    return logps.detach().float(), entropy.detach().float(), [g.float() for g in grads]


def tiled(rows, cast=True):
    return lambda h, w, b, y, t: tiled_head_logprobs(h, w, b, y, t, None, True, rows, cast)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_bf16_path_within_tolerance_of_fp32_plain(temperature):
    """Log-probs, entropies and the three gradients of the bf16 path (CPU autocast) against the fp32 plain path."""
    data = inputs()
    want = run(*data, temperature, plain)
    got = run(*data, temperature, tiled(rows=7), device_type="cpu", dtype=torch.bfloat16)
    assert relative_error(got[0], want[0]) < BF16_TOLERANCE
    assert relative_error(got[1], want[1]) < BF16_TOLERANCE
    for name, g, w in zip(("hidden", "weight", "bias"), got[2], want[2]):
        assert relative_error(g, w) < BF16_TOLERANCE, name
    # and it is a bf16 result, not fp32 in disguise: the errors are those of 8-bit mantissas
    assert relative_error(got[2][1], want[2][1]) > 1e-5


def test_bf16_weights_without_autocast_take_the_same_path():
    hidden, weight, bias, targets, mix = inputs()
    assert head_compute_dtype("cpu", weight) is None
    assert head_compute_dtype("cpu", weight.to(torch.bfloat16)) is torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert head_compute_dtype("cpu", weight) is torch.bfloat16
    want = run(hidden, weight, bias, targets, mix, 1.0, plain)
    got = run(hidden.detach().bfloat16().requires_grad_(), weight.detach().bfloat16().requires_grad_(),
              bias.detach().bfloat16().requires_grad_(), targets, mix, 1.0, tiled(rows=5))
    for g, w in zip(got[2], want[2]):
        assert relative_error(g, w) < BF16_TOLERANCE


class Products(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the operand types of every matrix product and how often the weight itself is cast."""

    PRODUCTS = {"mm", "addmm", "addmm_", "bmm", "matmul", "linear"}

    def __init__(self, weight):
        super().__init__()
        self.weight_storage, self.operand_types, self.weight_casts = weight.untyped_storage().data_ptr(), [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.PRODUCTS:
            matrices = [a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2]
            if not (name == "bmm" and matrices[0].shape[1] == 1):  # the entropy's per-row dot product
                self.operand_types.append(tuple(m.dtype for m in matrices[-2:]))
        if name == "_to_copy" and args[0].untyped_storage().data_ptr() == self.weight_storage:
            self.weight_casts += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("frozen_weight", [False, True])
def test_every_product_has_bf16_operands_and_the_weight_is_cast_once(frozen_weight):
    """12 tiles forward and backward: every product (the weight gradient's included) takes bf16 operands, and the
    (V, H) weight is cast once in forward and once in backward, not once per tile (a frozen reference's weight,
    which autocast does not cache, was cast 24 times). Fails with `cast=False` (today's path before #46)."""
    hidden, weight, bias, targets, mix = inputs(tokens=96)
    if frozen_weight:
        weight = weight.detach()
    with Products(weight) as seen:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logps, entropy = tiled_head_logprobs(hidden, weight, bias, targets, 1.0, None, True, 8)
        ((logps * mix).sum() + (entropy * mix).sum()).backward()
    assert seen.operand_types and all(t == (torch.bfloat16, torch.bfloat16) for t in seen.operand_types), \
        seen.operand_types
    assert seen.weight_casts <= 2, seen.weight_casts


def test_tile_rows_on_cpu_unchanged_and_larger_budget_on_cuda(monkeypatch):
    assert tile_rows(151936) == tile_rows(151936, "cpu") == (1 << 24) // 151936
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (60 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    assert tile_rows(151936, "cuda") == lm_head.CUDA_TILE_ELEMENTS // 151936  # 1 GiB per buffer: 1,766 rows
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 30, 80 << 30))
    assert tile_rows(151936, "cuda") == (1 << 30) // (4 * lm_head.CUDA_FREE_SHARE) // 151936  # bounded by free memory


@pytest.mark.cuda
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_cuda_bf16_path_within_tolerance_of_fp32_plain(temperature):
    """On the card: tensor-core products with fp32 output (`out_dtype`), at Qwen3's vocabulary."""
    data = inputs("cuda", vocab=151936, width=1024, tokens=512)
    want = run(*data, temperature, plain)
    got = run(*data, temperature, tiled(rows=None), device_type="cuda", dtype=torch.bfloat16)
    assert lm_head._OUT_DTYPE_PRODUCTS["cuda"], "torch.mm(..., out_dtype=torch.float32) is not available here"
    for g, w in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
        assert relative_error(g, w) < BF16_TOLERANCE

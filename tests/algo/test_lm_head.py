"""The tiled LM-head log-probs (algo.lm_head) against hand values and against the plain logits path."""

import math
import weakref

import pytest
import torch
import transformers

from rloo.algo.lm_head import tiled_head_logprobs
from rloo.passes import logprobs as logprobs_module
from rloo.passes.logprobs import completion_logprobs, reachable_head


def test_hand_values():
    # V = 3, H = 2: logits of the one token are h W^T + b = [1, 2, 0] + [0, 0, 1] = [1, 2, 1].
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    bias = torch.tensor([0.0, 0.0, 1.0])
    hidden = torch.tensor([[[1.0, 2.0]]])
    logps, entropy = tiled_head_logprobs(hidden, weight, bias, torch.tensor([[1]]), with_entropy=True)
    normalizer = math.log(2 * math.e + math.e ** 2)
    assert logps.item() == pytest.approx(2 - normalizer, abs=1e-6)
    probs = [math.exp(v - normalizer) for v in (1, 2, 1)]
    assert entropy.item() == pytest.approx(-sum(p * math.log(p) for p in probs), abs=1e-6)
    # Temperature 2 halves the logits: [0.5, 1, 0.5].
    logps, _ = tiled_head_logprobs(hidden, weight, bias, torch.tensor([[0]]), temperature=2.0)
    assert logps.item() == pytest.approx(0.5 - math.log(2 * math.exp(0.5) + math.e), abs=1e-6)


def test_backward_under_autocast_recomputes_the_forward_logits():
    """Under bf16 autocast the forward's logits are bf16 products; backward must recompute the same ones.

    d logprob_i / d b_j = onehot(y_i)_j - p_ij sums to 1 - sum_j p_ij = 0 over the vocabulary only when the p
    recomputed in backward is the softmax whose normaliser the forward saved. Recomputed in fp32 (backward
    outside the forward's autocast), it missed by 0.5% per token here."""
    gen = torch.Generator().manual_seed(0)
    hidden = (3 * torch.randn(64, 64, generator=gen)).requires_grad_()
    weight = (0.5 * torch.randn(3000, 64, generator=gen)).requires_grad_()
    bias = torch.zeros(3000, requires_grad=True)
    targets = torch.randint(0, 3000, (1, 64), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logps, _ = tiled_head_logprobs(hidden[None], weight, bias, targets, rows=16)
        want = torch.log_softmax(torch.nn.functional.linear(hidden, weight, bias).float(), dim=-1)
    torch.testing.assert_close(logps[0], want.gather(-1, targets[0, :, None])[:, 0], atol=1e-5, rtol=1e-5)
    logps.sum().backward()
    assert abs(bias.grad.sum().item()) / 64 < 1e-6


def plain(hidden, weight, bias, targets, temperature, softcap):
    logits = torch.nn.functional.linear(hidden, weight, bias)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("temperature,softcap,rows", [(1.0, None, 4), (0.7, None, 3), (1.3, 5.0, 5), (0.9, None, 64)])
@pytest.mark.parametrize("wrt", ["both", "logps", "entropy"])
def test_function_matches_plain_with_gradients(temperature, softcap, rows, wrt):
    """Each gradient the backward builds in place (log-prob terms, entropy terms, both) against autograd."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, 8, generator=gen, dtype=torch.float64).requires_grad_()
    weight = torch.randn(11, 8, generator=gen, dtype=torch.float64).requires_grad_()
    bias = torch.randn(11, generator=gen, dtype=torch.float64).requires_grad_()
    targets = torch.randint(0, 11, (3, 7), generator=gen)
    mix_lp, mix_h = torch.randn(3, 7, generator=gen), torch.randn(3, 7, generator=gen)
    use_lp, use_h = wrt in ("both", "logps"), wrt in ("both", "entropy")

    def objective(lp, h):
        # An output left out is not in the graph, so its gradient reaches the tiled backward as None.
        return sum(([(lp * mix_lp).sum()] if use_lp else []) + ([(h * mix_h).sum()] if use_h else []))

    want_lp, want_h = plain(hidden, weight, bias, targets, temperature, softcap)
    want = torch.autograd.grad(objective(want_lp, want_h), (hidden, weight, bias))
    got_lp, got_h = tiled_head_logprobs(hidden, weight, bias, targets, temperature, softcap, True, rows)
    got = torch.autograd.grad(objective(got_lp, got_h), (hidden, weight, bias))
    torch.testing.assert_close(got_lp, want_lp.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_h, want_h.float(), atol=1e-5, rtol=1e-5)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


class TileBuffers(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the (n, V) buffers alive at once among those the ops under it allocate (an op writing in place
    allocates none)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.storages, self.most = vocab, set(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if not (isinstance(tensor, torch.Tensor) and tensor.dim() == 2 and tensor.shape[-1] == self.vocab):
                continue
            key = tensor.untyped_storage().data_ptr()
            if key not in inputs and key not in self.storages:  # a new buffer, not a view or an in-place result
                self.storages.add(key)
                self.most = max(self.most, len(self.storages))
                weakref.finalize(tensor.untyped_storage(), self.storages.discard, key)
        return out


@pytest.mark.parametrize("temperature,entropy_grad", [(1.0, False), (0.7, False), (0.7, True)])
def test_a_tile_holds_at_most_two_logit_buffers(temperature, entropy_grad):
    """Forward and backward of a tile keep at most two (n, V) buffers alive: the head's share of a step's
    peak memory. The plain ops (z, z / T, log p, p, p * g, ...) held five or more."""
    rows, vocab = 6, 1000
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 9, 16, generator=gen).requires_grad_()
    weight = torch.randn(vocab, 16, generator=gen).requires_grad_()
    targets = torch.randint(0, vocab, (2, 9), generator=gen)
    with TileBuffers(vocab) as counter:
        logps, entropy = tiled_head_logprobs(hidden, weight, None, targets, temperature, None, True, rows)
        forward_most = counter.most
        (logps.sum() + (entropy.sum() if entropy_grad else 0)).backward()
    assert forward_most <= 2 and counter.most <= 2, (forward_most, counter.most)


def run_both(model, monkeypatch, temperature, entropy_grad=True):
    """(log-probs, entropies, grads) from the tiled path and from the plain path on the same rows."""
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, model.config.vocab_size, (3, 9), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0  # left padding in one row
    results = []
    for tiled in (True, False):
        if not tiled:
            monkeypatch.setattr(logprobs_module, "reachable_head", lambda m: None)
        model.zero_grad(set_to_none=True)
        logps, entropy = completion_logprobs(model, input_ids, attention_mask, 5, temperature, with_entropy=True,
                                             entropy_grad=entropy_grad)
        (logps.sum() + (0.3 * entropy.sum() if entropy_grad else 0)).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logps.detach(), entropy.detach(), grads))
    monkeypatch.undo()
    return results


def assert_same(results):
    (lp_t, h_t, g_t), (lp_p, h_p, g_p) = results
    torch.testing.assert_close(lp_t, lp_p, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h_t, h_p, atol=1e-5, rtol=1e-5)
    assert g_t.keys() == g_p.keys() and g_t
    for name in g_t:
        torch.testing.assert_close(g_t[name], g_p[name], atol=1e-5, rtol=1e-4, msg=name)


def test_tied_model_matches_plain(make_model, monkeypatch):
    model = make_model()
    assert model.config.tie_word_embeddings and reachable_head(model) is model.lm_head
    assert_same(run_both(model, monkeypatch, temperature=0.7))


def untied_qwen2(**extra):
    config = transformers.Qwen2Config(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=64, tie_word_embeddings=False, **extra)
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config)


def test_untied_model_matches_plain(monkeypatch):
    model = untied_qwen2()
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert_same(run_both(model, monkeypatch, temperature=1.0))
    assert_same(run_both(model, monkeypatch, temperature=1.5, entropy_grad=False))


def test_lora_on_attention_matches_plain(make_model, monkeypatch):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(make_model(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    assert reachable_head(model) is not None
    results = run_both(model, monkeypatch, temperature=0.8)
    assert all("lora" in name for name in results[0][2])
    assert_same(results)


def test_lora_on_head_falls_back_to_plain_path(make_model):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(make_model(), LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    assert reachable_head(model) is None
    logps, _ = completion_logprobs(model, torch.randint(3, 20, (2, 6)), torch.ones(2, 6, dtype=torch.long), 3)
    assert logps.shape == (2, 3) and torch.isfinite(logps).all()


def test_gemma2_soft_capping_matches_plain(monkeypatch):
    config = transformers.Gemma2Config(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=16, intermediate_size=64,
                                       final_logit_softcapping=2.0, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config)
    assert reachable_head(model) is not None
    assert_same(run_both(model, monkeypatch, temperature=0.9))


def test_head_builds_no_logits(make_model):
    """The head runs on an empty slice: the output logits have no positions."""
    model = make_model()
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    completion_logprobs(model, torch.randint(3, 20, (2, 6)), torch.ones(2, 6, dtype=torch.long), 3)
    assert seen == [torch.Size([2, 0, model.config.vocab_size])]

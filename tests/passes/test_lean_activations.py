"""The lean MLPs and norms (`lean_activations`): their backward against finite differences, whole models
(Qwen2, Llama, LoRA, bf16 autocast) giving the plain forward's log-probs and gradients while keeping fewer
tensors, and classes that compute something else (Gemma's norm and GELU MLP, GPT-2) left alone."""

import copy

import pytest
import torch
import transformers

from conftest import gpt2_model
from rloo.passes.lean_activations import (
    LeanRMSNorm,
    LeanSwiGLU,
    RMSNormFunction,
    SiluMul,
    SwiGLUDown,
    lean_activations,
)


def float64(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_down_gradients_match_finite_differences(bias):
    gate, up, weight = float64(2, 3, 5, seed=0), float64(2, 3, 5, seed=1), float64(4, 5, seed=2)
    assert torch.autograd.gradcheck(SwiGLUDown.apply, (gate, up, weight, float64(4, seed=3) if bias else None))


def test_silu_mul_gradients_match_finite_differences():
    assert torch.autograd.gradcheck(SiluMul.apply, (float64(3, 5, seed=0), float64(3, 5, seed=1)))


def test_rms_norm_gradients_match_finite_differences():
    x, weight = float64(2, 3, 6, seed=0), float64(6, seed=1)
    assert torch.autograd.gradcheck(lambda x, w: RMSNormFunction.apply(x, w, 1e-6), (x, weight))


def test_rms_norm_by_hand():
    """x = (3, 4): mean square 12.5, r = 1 / sqrt(12.5), n = (0.6, 0.8) * sqrt(2); with w = (1, 2) and an upstream
    gradient of (1, 0), dL/dw = (n_1, 0) and dL/dx = r * ((1, 0) - n * n_1 / 2)."""
    x = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
    weight = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    out = RMSNormFunction.apply(x, weight, 0.0)
    r = 12.5 ** -0.5
    torch.testing.assert_close(out.detach(), torch.tensor([3 * r, 8 * r], dtype=torch.float64))
    out[0].backward()
    n = torch.tensor([3 * r, 4 * r], dtype=torch.float64)
    torch.testing.assert_close(weight.grad, torch.tensor([3 * r, 0.0], dtype=torch.float64))
    torch.testing.assert_close(x.grad, r * (torch.tensor([1.0, 0.0], dtype=torch.float64) - n * n[0] / 2))


def llama_model(tokenizer, seed=0, family="llama"):
    """A tiny Llama (SmolLM2's architecture) or Qwen3 (the GPU gsm8k recipe's: RMSNorms on queries and keys too)."""
    config_class, model_class = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                                 "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[family]
    config = config_class(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return model_class(config)


def saved_widths(model, ids, mask):
    """The last-dimension sizes of the distinct tensors autograd keeps in a training forward (parameters aside)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    widths = {}

    def pack(tensor):
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in params:
            widths[pointer] = tensor.shape[-1] if tensor.dim() else 0
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = model(input_ids=ids, attention_mask=mask).logits
    return list(widths.values()), out


def train_step(model, ids, mask, autocast=False):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        widths, logits = saved_widths(model, ids, mask)
    torch.log_softmax(logits.float(), -1)[..., 5].mul(torch.linspace(-1, 1, ids.shape[1])).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return widths, logits.detach(), grads


@pytest.mark.parametrize("architecture", ["qwen2", "llama", "qwen3"])
def test_models_give_the_same_logits_and_gradients_and_keep_half_the_mlp_tensors(make_model, tokenizer, architecture):
    plain = make_model(seed=1) if architecture == "qwen2" else llama_model(tokenizer, seed=1, family=architecture)
    plain.train()
    layers, width = plain.config.num_hidden_layers, plain.config.intermediate_size
    norms = (4 if architecture == "qwen3" else 2) * layers + 1  # Qwen3 also normalises each head's queries and keys
    lean = copy.deepcopy(plain)
    assert lean_activations(lean) == type(lean_activations(lean))(mlps=layers, norms=norms)  # idempotent
    ids = torch.randint(3, plain.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding

    plain_widths, want_logits, want_grads = train_step(plain, ids, mask)
    widths, logits, grads = train_step(lean, ids, mask)
    # Plain: gate, silu(gate), up and their product per layer; lean: gate and up.
    assert plain_widths.count(width) == 4 * layers
    assert widths.count(width) == 2 * layers
    # Each norm kept its input, its normalised input and (for the next linear) its output; now not the second.
    hidden = plain.config.hidden_size
    assert plain_widths.count(hidden) - widths.count(hidden) == 2 * layers + 1
    assert len(widths) < len(plain_widths)
    torch.testing.assert_close(logits, want_logits, atol=1e-6, rtol=1e-6)
    assert want_grads.keys() == grads.keys()
    for name in want_grads:
        torch.testing.assert_close(grads[name], want_grads[name], atol=1e-6, rtol=1e-5, msg=name)


def test_bf16_autocast_gives_the_plain_gradients_to_bf16_precision(tokenizer):
    plain = llama_model(tokenizer, seed=2).train()
    lean = copy.deepcopy(plain)
    lean_activations(lean)
    ids = torch.randint(3, plain.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    _, want_logits, want_grads = train_step(plain, ids, torch.ones_like(ids), autocast=True)
    _, logits, grads = train_step(lean, ids, torch.ones_like(ids), autocast=True)
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits, want_logits, atol=0, rtol=0)
    for name in want_grads:
        assert grads[name].dtype == want_grads[name].dtype == torch.float32
        scale = want_grads[name].abs().max()
        assert (grads[name] - want_grads[name]).abs().max() <= 0.02 * scale, name


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_lora_adapters_train_the_same_through_the_lean_mlp(tokenizer, targets):
    """LoRA on every linear: down_proj is peft's layer, so silu * up keeps gate and up and down_proj runs itself.
    LoRA on attention only: the frozen MLP runs as one node, which gives its frozen weight no gradient (autograd
    kept gate, silu(gate) and up there, the frozen down_proj needing no product). One tensor fewer either way."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, init_lora_weights=False)
    plain = get_peft_model(llama_model(tokenizer, seed=3), config).train()
    lean = copy.deepcopy(plain)
    assert lean_activations(lean).mlps == 2
    ids = torch.randint(3, plain.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(2))
    plain_widths, _, want_grads = train_step(plain, ids, torch.ones_like(ids))
    widths, _, grads = train_step(lean, ids, torch.ones_like(ids))
    assert plain_widths.count(80) - widths.count(80) == 2  # 2 layers, MLP width 80
    assert want_grads and want_grads.keys() == grads.keys()
    for name in want_grads:
        torch.testing.assert_close(grads[name], want_grads[name], atol=1e-6, rtol=1e-5, msg=name)


def test_other_norms_and_mlps_keep_their_forward(tokenizer):
    """Gemma's RMSNorm scales by 1 + weight and its MLP uses GELU: the check against each class's own forward
    keeps them. GPT-2 has neither a gated MLP nor an RMSNorm."""
    config = transformers.GemmaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                      pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    gemma = transformers.GemmaForCausalLM(config)
    with torch.no_grad():
        for module in gemma.modules():
            if type(module).__name__ == "GemmaRMSNorm":
                module.weight.normal_()  # zeros at init, where w and 1 + w would be told apart only by the offset
    result = lean_activations(gemma)
    assert (result.mlps, result.norms) == (0, 0)
    assert result.kept == ("GemmaMLP", "GemmaRMSNorm")
    assert not any(isinstance(module, (LeanSwiGLU, LeanRMSNorm)) for module in gemma.modules())
    gpt2 = gpt2_model(tokenizer)
    assert lean_activations(gpt2) == type(result)()


def test_eval_mode_and_no_grad_run_the_modules_own_forward(make_model):
    model = make_model(seed=4)
    lean_activations(model)
    mlp = model.model.layers[0].mlp
    x = torch.randn(2, 3, model.config.hidden_size, requires_grad=True)
    assert type(mlp.train()(x).grad_fn).__name__ == "SwiGLUDownBackward"
    assert type(mlp.eval()(x).grad_fn).__name__ != "SwiGLUDownBackward"
    with torch.no_grad():
        torch.testing.assert_close(mlp.train()(x), type(mlp).__mro__[2].forward(mlp, x), atol=0, rtol=0)


def test_a_copy_runs_its_own_weights(make_model):
    """The reference is a deep copy of the policy: a switched class must compute with the copy's weights."""
    model = make_model(seed=5).train()
    lean_activations(model)
    reference = copy.deepcopy(model)
    ids = torch.randint(3, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    before = reference(ids).logits.detach()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1)
    torch.testing.assert_close(reference(ids).logits.detach(), before, atol=0, rtol=0)


@pytest.mark.parametrize("options", [{}, {"lean_activations": False},
                                     {"shared_prefix_forward": True, "gradient_checkpointing": True}])
def test_the_trainer_switches_the_policy_unless_told_not_to(tmp_path, make_model, tokenizer, options):
    from datasets import Dataset

    from conftest import digit_fraction
    from rloo import RLOOConfig, RLOOTrainer
    from rloo.model_loading import CheckpointedLayer

    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=4, beta=0.04, max_steps=1, save_steps=0, report_to=[], **options)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=Dataset.from_list([{"prompt": "1+1="}]),
                          processing_class=tokenizer)
    model = trainer.accelerator.unwrap_model(trainer.model)
    mlps = [layer.mlp for layer in model.model.layers]
    assert all(isinstance(mlp, LeanSwiGLU) for mlp in mlps) == options.get("lean_activations", True)
    checkpointed = [isinstance(layer, CheckpointedLayer) for layer in model.model.layers]
    assert all(checkpointed) == bool(options.get("gradient_checkpointing"))
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    assert trainer.global_step == 1
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))

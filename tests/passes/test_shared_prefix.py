"""The shared-prefix training forward (`shared_prefix_forward`, passes.prefix_logprobs.shared_prompt_logprobs):
the same log-probs, entropies and gradients as running every row whole, on Qwen2 and GPT-2, eager
and sdpa, with left-padded prompts and micro-batches that cut groups."""

import pytest
import torch
import transformers

from conftest import gpt2_model
from rloo import update as update_module
from rloo.passes import prefix_logprobs
from rloo.passes.logprobs import completion_logprobs
from rloo.passes.prefix_logprobs import shared_prompt_logprobs


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("architecture", ["qwen2", "gpt2"])
def test_same_logprobs_entropies_and_gradients_as_whole_rows(make_model, tokenizer, architecture, implementation):
    if architecture == "qwen2":
        model = make_model(seed=3)
        model.set_attn_implementation(implementation)
    else:
        model = gpt2_model(tokenizer, n_positions=64, attn_implementation=implementation)
    gen = torch.Generator().manual_seed(0)
    n, k, p, c, vocab = 3, 4, 7, 5, model.config.vocab_size
    prompt_mask = (torch.arange(p)[None] >= p - torch.tensor([7, 3, 5])[:, None]).long()  # (n, P) left padding
    prompt_ids = (torch.randint(3, vocab, (n, p), generator=gen) * prompt_mask).repeat_interleave(k, 0)
    prompt_mask = prompt_mask.repeat_interleave(k, 0)
    completion_mask = (torch.arange(c)[None] < torch.randint(1, c + 1, (n * k, 1), generator=gen)).long()
    completion_ids = torch.randint(3, vocab, (n * k, c), generator=gen) * completion_mask
    weights_lp, weights_h = torch.randn(n * k, c, generator=gen), torch.randn(n * k, c, generator=gen)
    rows = slice(2, 11)  # a micro-batch that cuts the first and last groups

    def run(forward):
        model.zero_grad(set_to_none=True)
        logps, entropy = forward()
        mask = completion_mask[rows]
        ((logps * weights_lp[rows] + entropy * weights_h[rows]) * mask).sum().backward()
        grads = {name: param.grad.clone() for name, param in model.named_parameters()}
        return logps.detach() * mask, entropy.detach() * mask, grads

    want = run(lambda: completion_logprobs(
        model, torch.cat([prompt_ids, completion_ids], 1)[rows], torch.cat([prompt_mask, completion_mask], 1)[rows],
        c, 0.7, with_entropy=True, entropy_grad=True))
    got = run(lambda: shared_prompt_logprobs(model, prompt_ids[rows], prompt_mask[rows], completion_ids[rows],
                                             completion_mask[rows], 0.7, with_entropy=True, entropy_grad=True))
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], atol=1e-5, rtol=1e-4, msg=name)


def test_trainer_micro_batch_loss_is_the_same_with_the_shared_prefix_forward(tmp_path, make_model, tokenizer,
                                                                             monkeypatch):
    from datasets import Dataset

    from conftest import digit_fraction
    from rloo import RLOOConfig, RLOOTrainer

    rows = [{"prompt": "1+1="}, {"prompt": "12+34+5="}, {"prompt": "7="}]  # left-padded to the longest
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=6, gradient_accumulation_steps=2,
                      num_generations=4, max_completion_length=6, beta=0.1,
                      kl_penalty="loss", entropy_coef=0.01, temperature=0.8, max_steps=1, save_steps=0, seed=0,
                      shared_prefix_forward=True)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer)
    rollout, _ = trainer.collector.collect(rows, trainer.global_step, trainer.episode)
    trainer.model.train()
    micro = rollout.micro_batch(2, 7)  # rows 2-8: the end of group 0, group 1, the start of group 2

    def loss_and_grads(shared: bool):
        trainer.learner.args.shared_prefix_forward = shared
        trainer.model.zero_grad(set_to_none=True)
        numerators, _ = trainer.learner.micro_batch_loss(micro)
        numerators.sum().backward()
        return numerators.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}

    calls = []
    monkeypatch.setattr(update_module, "shared_prompt_logprobs",
                        lambda *a, **k: calls.append(1) or shared_prompt_logprobs(*a, **k))
    want = loss_and_grads(False)
    assert calls == []
    got = loss_and_grads(True)
    assert calls == [1]
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=1e-5)
    assert got[1].keys() == want[1].keys() and want[1]
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], atol=1e-6, rtol=1e-4, msg=name)


def test_shared_prefix_forward_on_a_sliding_window_model_gives_the_whole_rows_gradients(tokenizer):
    """With a window (4) shorter than the rows, the training pass on copies of the prompt's cache gives the
    whole-row pass's log-probs and every parameter's gradient (the mask applies the window over the copy)."""
    from test_prefix_logprobs import grouped_batch, sliding_window_models

    prompt_ids, prompt_mask, completion_ids, completion_mask = grouped_batch(len(tokenizer))
    input_ids, attention_mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    weights = torch.randn(completion_ids.shape, generator=torch.Generator().manual_seed(2)) * completion_mask
    for name, model in sliding_window_models(len(tokenizer)).items():
        prefix_logprobs.check_shared_prompt_model(model)
        names, params = zip(*model.named_parameters())
        want, _ = completion_logprobs(model, input_ids, attention_mask, completion_ids.shape[1])
        want_grads = torch.autograd.grad((want * weights).sum(), params)
        got, _ = shared_prompt_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
        got_grads = torch.autograd.grad((got * weights).sum(), params)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=name)
        for param, a, b in zip(names, got_grads, want_grads):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=f"{name} {param}")


def test_trainer_trains_with_the_shared_prefix_forward_on_a_sliding_window_model(tmp_path, tokenizer):
    from datasets import Dataset

    from conftest import digit_fraction
    from rloo import RLOOConfig, RLOOTrainer

    config = transformers.Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
                                      use_sliding_window=True, sliding_window=4, max_window_layers=0,
                                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=4, beta=0.0, max_steps=1, save_steps=0, shared_prefix_forward=True)
    model = transformers.Qwen2ForCausalLM(config)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = RLOOTrainer(model, digit_fraction, args=args, train_dataset=Dataset.from_list([{"prompt": "1+1="}]),
                          processing_class=tokenizer)
    trainer.train()
    assert any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())


def test_logits_path_when_the_head_is_out_of_reach(make_model, monkeypatch):
    model = make_model(seed=4)
    gen = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(3, model.config.vocab_size, (2, 5), generator=gen).repeat_interleave(3, 0)
    completion_ids = torch.randint(3, model.config.vocab_size, (6, 4), generator=gen)
    masks = torch.ones_like(prompt_ids), torch.ones_like(completion_ids)
    want, want_entropy = completion_logprobs(model, torch.cat([prompt_ids, completion_ids], 1), torch.cat(masks, 1), 4,
                                             1.3, with_entropy=True)
    monkeypatch.setattr(prefix_logprobs, "reachable_head", lambda model: None)
    got, entropy = shared_prompt_logprobs(model, prompt_ids, masks[0], completion_ids, masks[1], 1.3, with_entropy=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, want_entropy, atol=1e-5, rtol=1e-5)


def test_shared_prefix_forward_refuses_a_model_with_transformers_checkpointing_on(make_model):
    model = make_model()
    model.gradient_checkpointing_enable()
    with pytest.raises(ValueError, match="transformers turns off under gradient checkpointing"):
        prefix_logprobs.check_shared_prompt_model(model)


def saved_activations(model, forward):
    """The distinct tensors autograd keeps for backward (not the parameters), as {storage: shape}."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(tensor):
        key = tensor.untyped_storage().data_ptr()
        if key not in params:
            saved.setdefault(key, tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = forward()
    return saved, out


@pytest.mark.parametrize("architecture", ["qwen2", "gpt2"])
def test_checkpointed_layers_keep_only_their_inputs_and_give_the_same_gradients(make_model, tokenizer, architecture):
    """gradient_checkpointing with shared_prefix_forward (`model_loading.checkpoint_layers`): the decoder layers of
    both passes (the prompts' prefill and the completions on its cache) are recomputed in backward, so nothing of
    the MLP's or the attention's inner width is kept, and log-probs and gradients are those of the plain forward."""
    from rloo.model_loading import checkpoint_layers

    model = make_model(seed=5) if architecture == "qwen2" else gpt2_model(tokenizer, n_positions=64)
    width = getattr(model.config, "intermediate_size", None) or 4 * model.config.hidden_size  # GPT-2: n_inner None
    hidden = model.config.hidden_size
    gen = torch.Generator().manual_seed(2)
    prompt_ids = torch.randint(3, model.config.vocab_size, (2, 6), generator=gen).repeat_interleave(3, 0)
    completion_ids = torch.randint(3, model.config.vocab_size, (6, 5), generator=gen)
    masks = torch.ones_like(prompt_ids), torch.ones_like(completion_ids)
    model.train()  # checkpointing applies in training mode; no dropout, as the trainer's disable_dropout does
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0

    def run():
        model.zero_grad(set_to_none=True)
        saved, (logps, _) = saved_activations(model, lambda: shared_prompt_logprobs(
            model, prompt_ids, masks[0], completion_ids, masks[1], 0.9, with_entropy=True))
        logps.sum().backward()
        return saved, logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    plain_saved, want_logps, want_grads = run()
    assert any(shape[-1] == width for shape in plain_saved.values())  # the MLP's intermediates, kept
    assert checkpoint_layers(model) == model.config.num_hidden_layers
    saved, logps, grads = run()
    assert not any(shape[-1] == width for shape in saved.values()), sorted(set(saved.values()))
    # Per layer and pass, its input (hidden wide) is what stays; the plain forward kept several such tensors.
    assert sum(shape[-1] == hidden for shape in saved.values()) < sum(shape[-1] == hidden for shape in plain_saved.values()) / 2
    assert len(saved) < len(plain_saved) / 2
    torch.testing.assert_close(logps, want_logps, atol=0, rtol=0)
    for name in want_grads:
        torch.testing.assert_close(grads[name], want_grads[name], atol=1e-6, rtol=1e-5, msg=name)


def test_a_replayable_cache_layer_gives_the_same_states_when_called_again():
    """What lets a decoder layer be recomputed on a cache: a second update with the same new states returns the
    prefix followed by them again, where a DynamicLayer would append them a second time."""
    prefix_k, prefix_v, new_k, new_v = (torch.randn(2, 3, n, 4) for n in (5, 5, 2, 2))
    cache = prefix_logprobs.ReplayableCache([(prefix_k, prefix_v)])
    assert cache.get_seq_length() == 5
    first = cache.layers[0].update(new_k, new_v)
    again = cache.layers[0].update(new_k, new_v)
    for got in (first, again):
        torch.testing.assert_close(got[0], torch.cat([prefix_k, new_k], dim=-2), atol=0, rtol=0)
        torch.testing.assert_close(got[1], torch.cat([prefix_v, new_v], dim=-2), atol=0, rtol=0)
    empty = prefix_logprobs.ReplayableCache(1)
    assert empty.get_seq_length() == 0
    for _ in range(2):
        keys, values = empty.layers[0].update(new_k, new_v)
        assert torch.equal(keys, new_k) and torch.equal(values, new_v)


def test_a_copy_of_a_checkpointed_model_runs_its_own_weights(make_model):
    """The reference is a deep copy of the policy: its checkpointed layers must compute with the copy's weights,
    in training mode and in eval mode (a wrapped bound method would still point at the original's)."""
    import copy

    from rloo.model_loading import checkpoint_layers

    model = make_model(seed=6)
    checkpoint_layers(model)
    reference = copy.deepcopy(model)
    ids = torch.randint(3, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    for train in (True, False):
        model.train(train)
        reference.train(train)
        before = reference(ids).logits.detach()
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.1)
        torch.testing.assert_close(reference(ids).logits.detach(), before, atol=0, rtol=0)
        assert not torch.allclose(model(ids).logits, before)


def test_checkpoint_layers_refuses_a_model_without_decoder_layers():
    from rloo.config import ConfigError
    from rloo.model_loading import checkpoint_layers

    with pytest.raises(ConfigError, match="recomputes each of the model's decoder layers"):
        checkpoint_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_trainer_with_gradient_checkpointing_and_the_shared_prefix_forward(tmp_path, make_model, tokenizer):
    """Both on: rloo checkpoints the decoder layers, transformers' checkpointing (which drops the cache) stays off,
    and a step trains."""
    from datasets import Dataset

    from conftest import digit_fraction
    from rloo import RLOOConfig, RLOOTrainer
    from rloo.model_loading import CheckpointedLayer

    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=4, beta=0.0, max_steps=1, save_steps=0, report_to=[],
                      shared_prefix_forward=True, gradient_checkpointing=True)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=Dataset.from_list([{"prompt": "1+1="}]),
                          processing_class=tokenizer)
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert not model.is_gradient_checkpointing
    assert all(isinstance(layer, CheckpointedLayer) for layer in model.model.layers)
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    assert trainer.global_step == 1
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))

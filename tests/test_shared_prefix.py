"""The shared-prefix training forward (algo.shared_prefix): packing and mask by hand, and the same
log-probs, entropies and gradients as running every row whole, on Qwen2 and GPT-2, eager and sdpa."""

import pytest
import torch
import transformers

from rloo import update as update_module
from rloo.algo.logprobs import completion_logprobs
from rloo.algo.shared_prefix import block_mask, pack_groups, prompt_runs, shared_prefix_logprobs


def test_packing_by_hand():
    # Rows 0-1 share prompt [5, 6] (left-padded to 3), row 2 has prompt [7, 8, 9]; completions of 2 tokens.
    prompt_ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9]])
    prompt_mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1]])
    completion_ids = torch.tensor([[11, 12], [21, 22], [31, 32]])
    assert prompt_runs(prompt_ids, prompt_mask) == [(0, 2), (2, 3)]
    input_ids, positions, segments, source = pack_groups(prompt_ids, prompt_mask, completion_ids)
    assert input_ids.tolist() == [[5, 6, 11, 12, 21, 22], [7, 8, 9, 31, 32, 0]]
    assert positions.tolist() == [[0, 1, 2, 3, 2, 3], [0, 1, 2, 3, 4, 0]]
    assert segments.tolist() == [[0, 0, 1, 1, 2, 2], [0, 0, 0, 1, 1, -1]]
    # Token 0 of each completion is predicted by the prompt's last token; token 1 by token 0.
    assert source.tolist() == [[1, 2], [1, 4], [6 + 2, 6 + 3]]
    visible = block_mask(segments)[:, 0].long()
    assert visible[0].tolist() == [[1, 0, 0, 0, 0, 0],
                                   [1, 1, 0, 0, 0, 0],
                                   [1, 1, 1, 0, 0, 0],
                                   [1, 1, 1, 1, 0, 0],
                                   [1, 1, 0, 0, 1, 0],  # completion 2 skips completion 1
                                   [1, 1, 0, 0, 1, 1]]
    assert visible[1, 5].tolist() == [0, 0, 0, 0, 0, 1]  # packing padding sees only itself (no NaN row)


def gpt2_model(tokenizer, implementation):
    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                     pad_token_id=tokenizer.pad_token_id, attn_implementation=implementation)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        model.transformer.wpe.weight.normal_(0, 1.0)  # a wrong position changes every log-prob
    return model.eval()  # no dropout: both passes must see the same network


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("architecture", ["qwen2", "gpt2"])
def test_same_logprobs_entropies_and_gradients_as_whole_rows(make_model, tokenizer, architecture, implementation):
    if architecture == "qwen2":
        model = make_model(seed=3)
        model.set_attn_implementation(implementation)
    else:
        model = gpt2_model(tokenizer, implementation)
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
    got = run(lambda: shared_prefix_logprobs(model, prompt_ids[rows], prompt_mask[rows], completion_ids[rows], 0.7,
                                             with_entropy=True, entropy_grad=True))
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=1e-5)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], atol=1e-5, rtol=1e-4, msg=name)


def test_refuses_attention_without_custom_masks(make_model):
    model = make_model()
    model.config._attn_implementation = "flash_attention_2"
    ids = torch.tensor([[3, 4]])
    with pytest.raises(ValueError, match="shared_prefix_forward needs attn_implementation in \\('eager', 'sdpa'\\)"):
        shared_prefix_logprobs(model, ids, torch.ones_like(ids), ids)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_trainer_micro_batch_loss_is_the_same_with_the_shared_prefix_forward(tmp_path, make_model, tokenizer,
                                                                             monkeypatch, checkpointing):
    from datasets import Dataset

    from rloo import RLOOConfig, RLOOTrainer
    from conftest import digit_fraction

    rows = [{"prompt": "1+1="}, {"prompt": "12+34+5="}, {"prompt": "7="}]  # left-padded to the longest
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=6, gradient_accumulation_steps=2,
                      num_generations=4, max_completion_length=6, beta=0.1,
                      kl_penalty="loss", entropy_coef=0.01, temperature=0.8, max_steps=1, save_steps=0, seed=0,
                      shared_prefix_forward=True, gradient_checkpointing=checkpointing)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer)
    rollout, _ = trainer.collect(rows)
    micro = rollout.micro_batch(2, 7)  # rows 2-8: the end of group 0, group 1, the start of group 2

    def loss_and_grads(shared: bool):
        trainer.learner.args.shared_prefix_forward = shared
        trainer.model.zero_grad(set_to_none=True)
        numerators, _ = trainer.learner.micro_batch_loss(micro)
        numerators.sum().backward()
        return numerators.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}

    calls = []
    monkeypatch.setattr(update_module, "shared_prefix_logprobs",
                        lambda *a, **k: calls.append(1) or shared_prefix_logprobs(*a, **k))
    want = loss_and_grads(False)
    assert calls == []
    got = loss_and_grads(True)
    assert calls == [1]
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=1e-5)
    assert got[1].keys() == want[1].keys() and want[1]
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], atol=1e-6, rtol=1e-4, msg=name)


def test_trainer_refuses_the_shared_prefix_forward_without_custom_masks(tmp_path, make_model, tokenizer):
    from datasets import Dataset

    from rloo import RLOOConfig, RLOOTrainer
    from conftest import digit_fraction

    model = make_model()
    model.config._attn_implementation = "flash_attention_2"
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=4, beta=0.0, max_steps=1, save_steps=0, shared_prefix_forward=True)
    with pytest.raises(ValueError, match="model_init_kwargs=\\{'attn_implementation': 'sdpa'\\}"):
        RLOOTrainer(model, digit_fraction, args=args, train_dataset=Dataset.from_list([{"prompt": "1+1="}]),
                    processing_class=tokenizer)

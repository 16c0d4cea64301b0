"""The whole-row log-prob pass avoids padding in the attention mask: completions' right padding is
left unmasked, and on the tiled-head path left padding moves behind the completion
(`passes.logprobs.padding_to_the_end`), where causal attention hides it. Checked against each row run
alone without any padding (a slow loop), on a rotary (Qwen2) and an absolute-position (GPT-2)
model, through the tiled head and the plain path, with gradients."""

import pytest
import torch

from conftest import gpt2_model
from rloo.passes import logprobs as logprobs_module
from rloo.passes.logprobs import completion_logprobs, is_right_padded, padding_to_the_end


def test_padding_moves_behind_the_completion_by_hand():
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 0],
                        [9, 5, 6, 7, 8, 9, 9],
                        [0, 4, 4, 3, 0, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1],  # completion padding already unmasked, as the caller does
                         [1, 1, 1, 1, 1, 1, 1],
                         [0, 1, 1, 1, 1, 1, 1]])
    moved, lead = padding_to_the_end(ids, mask, completion_length=3)  # P = 4
    assert lead.tolist() == [2, 0, 1]
    assert moved.tolist() == [[5, 6, 7, 8, 0, 0, 0],
                              [9, 5, 6, 7, 8, 9, 9],
                              [4, 4, 3, 0, 0, 0, 0]]


def test_holes_are_not_moved():
    ids = torch.tensor([[5, 0, 6, 7, 8]])
    assert padding_to_the_end(ids, torch.tensor([[1, 0, 1, 1, 1]]), completion_length=2) is None  # in a prompt
    assert padding_to_the_end(ids, torch.tensor([[0, 1, 1, 0, 1]]), completion_length=2) is None  # in a completion
    assert is_right_padded(torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]]))
    assert not is_right_padded(torch.tensor([[1, 0, 1]]))


def batch(vocab: int):
    """Left-padded prompts of lengths 5, 2, 4 (P = 5) and right-padded completions of lengths 4, 1, 3 (C = 4)."""
    gen = torch.Generator().manual_seed(1)
    prompt_lengths, completion_lengths = torch.tensor([5, 2, 4]), torch.tensor([4, 1, 3])
    prompt_mask = (torch.arange(5)[None] >= 5 - prompt_lengths[:, None]).long()
    completion_mask = (torch.arange(4)[None] < completion_lengths[:, None]).long()
    prompt_ids = torch.randint(3, vocab, (3, 5), generator=gen) * prompt_mask
    completion_ids = torch.randint(3, vocab, (3, 4), generator=gen) * completion_mask
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def row_alone(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """Log-probs of one unpadded row, positions 0.. as the model numbers them by default, by hand from the logits."""
    logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float() / temperature
    predicting = logits[len(prompt) - 1 : -1]  # (c, V): position t predicts token t + 1
    return torch.log_softmax(predicting, dim=-1).gather(1, torch.tensor(completion)[:, None])[:, 0]


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
@pytest.mark.parametrize("path", ["tiled", "plain"])
def test_log_probs_and_gradients_match_rows_run_alone(arch, path, make_model, tokenizer, monkeypatch):
    model = make_model(seed=2).eval() if arch == "qwen2" else gpt2_model(tokenizer, n_positions=32)
    if path == "plain":
        monkeypatch.setattr(logprobs_module, "reachable_head", lambda model: None)
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch(model.config.vocab_size)
    temperature = 0.8

    model.zero_grad()
    logps, _ = completion_logprobs(model, torch.cat([prompt_ids, completion_ids], 1),
                                   torch.cat([prompt_mask, completion_mask], 1), 4, temperature)
    (logps * completion_mask).sum().backward()
    got_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    model.zero_grad()
    total = 0
    for row in range(3):
        prompt = prompt_ids[row][prompt_mask[row].bool()].tolist()
        completion = completion_ids[row][completion_mask[row].bool()].tolist()
        want = row_alone(model, prompt, completion, temperature)
        torch.testing.assert_close(logps[row, : len(completion)], want, atol=2e-6, rtol=1e-5)
        total = total + want.sum()
    total.backward()
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(got_grads[name], p.grad, atol=2e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("path", ["tiled", "plain"])
def test_the_masks_the_model_gets(path, make_model, monkeypatch):
    """Tiled path: left-padded prompts and right-padded completions reach the model as an all-ones
    mask, so transformers builds no (B, 1, T, T) mask. Plain path: only the completions' right
    padding is unmasked. Holes (inside a prompt or a completion) keep their zeros."""
    model = make_model(seed=2).eval()
    if path == "plain":
        monkeypatch.setattr(logprobs_module, "reachable_head", lambda model: None)
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["attention_mask"].clone()),
                                    with_kwargs=True)
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch(model.config.vocab_size)
    ids = torch.cat([prompt_ids, completion_ids], 1)
    completion_logprobs(model, ids, torch.cat([prompt_mask, completion_mask], 1), 4)
    unmasked_completions = torch.cat([prompt_mask, torch.ones_like(completion_mask)], 1)
    assert torch.equal(seen[-1], torch.ones_like(ids) if path == "tiled" else unmasked_completions)

    prompt_hole = unmasked_completions.clone()
    prompt_hole[0, 1] = 0  # row 0's prompt is full length: a zero inside it is a hole, not left padding
    completion_logprobs(model, ids, torch.cat([prompt_hole[:, :5], completion_mask], 1), 4)
    assert torch.equal(seen[-1], prompt_hole)

    completion_hole = torch.cat([prompt_mask, completion_mask], 1)
    completion_hole[0, 6] = 0  # row 0's completion has 4 tokens: a zero at its second is a hole
    completion_logprobs(model, ids, completion_hole, 4)
    assert torch.equal(seen[-1], completion_hole)

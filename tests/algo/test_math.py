"""The RLOO math against hand-computed values and slow reference loops."""

import math

import pytest
import torch

from rloo.algo.advantages import leave_one_out_advantages
from rloo.algo.kl import kl_penalized_reward, sequence_kl
from rloo.algo.loss import clipped_sequence_loss
from rloo.generation import completion_mask_from_eos, left_pad
from rloo.passes.logprobs import entropy_from_logits, position_ids_from_mask, selective_log_softmax


def test_vectorized_advantage_example():
    # Seed 002 lays rewards out as (K=4, 3 prompts); our function takes (prompts, K).
    rlhf_reward = torch.tensor([1, 2, 3, 2, 3, 4, 5, 6, 7, 8, 9, 10], dtype=torch.float32)
    grouped = rlhf_reward.reshape(4, 3).T  # (3, 4)
    advantages = leave_one_out_advantages(grouped)
    # By hand: A = r - (S - r)/3 = (4r - S)/3 with group sums S = 16, 20, 24.
    expected_row = torch.tensor([-4.0, -8.0 / 3, 4.0 / 3, 16.0 / 3])
    torch.testing.assert_close(advantages, expected_row.expand(3, 4))
    flat = advantages.T.reshape(-1)  # back to seed 002's order
    assert flat[0].item() == pytest.approx(1 - (2 + 5 + 8) / 3)
    assert flat[7].item() == pytest.approx(6 - (3 + 2 + 9) / 3)


def _loop_leave_one_out(rewards):
    out = torch.zeros_like(rewards)
    for p in range(rewards.shape[0]):
        for i in range(rewards.shape[1]):
            others = [rewards[p, j] for j in range(rewards.shape[1]) if j != i]
            out[p, i] = rewards[p, i] - sum(others) / len(others)
    return out


@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_leave_one_out_matches_loop_and_scaled_mean(k):
    rewards = torch.randn(5, k, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
    vectorized = leave_one_out_advantages(rewards)
    torch.testing.assert_close(vectorized, _loop_leave_one_out(rewards))
    scaled = k / (k - 1) * (rewards - rewards.mean(dim=1, keepdim=True))
    torch.testing.assert_close(vectorized, scaled)


def test_leave_one_out_rejects_single_sample_groups():
    with pytest.raises(ValueError, match="K >= 2"):
        leave_one_out_advantages(torch.ones(3, 1))


def test_kl_is_folded_into_the_reward_before_the_baseline():
    # Two prompts, K=2. Token log-probs of policy and reference over 3 positions; the last
    # position of completion 1 is padding and must not count.
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -9.0], [-0.2, -0.2, -0.2], [-3.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -2.0, -1.0], [-2.0, -1.0, -0.1], [-0.2, -0.7, -0.2], [-3.0, -3.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]])
    seq_kl = sequence_kl(logps, ref, mask)
    # By hand: 0.5 + 0 + 0.5 = 1.0; 1.0 + 0 = 1.0 (padding ignored); 0 + 0.5 + 0 = 0.5; 0 + 2 + 0 = 2.0
    torch.testing.assert_close(seq_kl, torch.tensor([1.0, 1.0, 0.5, 2.0]))
    scores = torch.tensor([1.0, 0.0, 2.0, 2.0])
    rewards = kl_penalized_reward(scores, seq_kl, beta=0.1)
    torch.testing.assert_close(rewards, torch.tensor([0.9, -0.1, 1.95, 1.8]))
    advantages = leave_one_out_advantages(rewards.view(2, 2)).view(-1)
    # K=2: A_1 = r_1 - r_2. Group 1: 0.9 - (-0.1) = 1.0; group 2: 1.95 - 1.8 = 0.15.
    torch.testing.assert_close(advantages, torch.tensor([1.0, -1.0, 0.15, -0.15]))
    # Folding the KL after the baseline would give different advantages for group 2 (0 vs 0.15).
    assert not torch.allclose(leave_one_out_advantages(scores.view(2, 2)).view(-1), advantages)


def test_clipped_loss_by_hand():
    e = math.e
    # ratios: e^0 = 1, e^0.5 ~ 1.6487 (clipped to 1.2), e^-0.5 ~ 0.6065 (clipped to 0.8), e^0.5 again.
    seq_logps = torch.tensor([-1.0, -0.5, -1.5, -0.5], requires_grad=True)
    old = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    advantages = torch.tensor([2.0, 1.0, -1.0, -1.0])
    out = clipped_sequence_loss(seq_logps, old, advantages, epsilon=0.2)
    # 1: ratio 1 -> -2 * 1 = -2.
    # 2: A>0, ratio 1.6487: max(-1.6487, -1.2) = -1.2, clipped branch in force.
    # 3: A<0, ratio 0.6065: max(0.6065, 0.8) = 0.8, clipped branch in force.
    # 4: A<0, ratio 1.6487: max(1.6487, 1.2) = 1.6487, unclipped (no gradient is removed).
    expected = torch.tensor([-2.0, -1.2, 0.8, e ** 0.5])
    torch.testing.assert_close(out.loss, expected)
    torch.testing.assert_close(out.clipped, torch.tensor([0.0, 1.0, 1.0, 0.0]))
    out.loss.sum().backward()
    # Gradient: -A * ratio where unclipped, 0 where clipped.
    torch.testing.assert_close(seq_logps.grad, torch.tensor([-2.0, 0.0, 0.0, e ** 0.5]))


def test_one_pass_loss_has_the_reinforce_gradient():
    seq_logps = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    advantages = torch.tensor([0.5, -1.0, 2.0])
    out = clipped_sequence_loss(seq_logps, seq_logps.detach(), advantages, epsilon=0.2)
    out.loss.sum().backward()
    torch.testing.assert_close(seq_logps.grad, -advantages)  # d/dlogp of -A * log pi
    torch.testing.assert_close(out.ratio, torch.ones(3))


def test_selective_log_softmax_and_entropy_match_the_full_computation():
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0))
    index = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(1))
    full = torch.log_softmax(logits, dim=-1)
    torch.testing.assert_close(selective_log_softmax(logits, index), full.gather(-1, index.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(entropy_from_logits(logits), -(full.exp() * full).sum(-1))


def test_completion_mask_stops_at_first_eos_and_flags_truncation():
    ids = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [2, 0, 0, 0]])
    mask, has_eos = completion_mask_from_eos(ids, eos_ids=[2])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert has_eos.tolist() == [True, False, True]


def test_left_pad_and_positions():
    ids, mask = left_pad([[4, 5, 6], [7]], pad_id=0)
    assert ids.tolist() == [[4, 5, 6], [0, 0, 7]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert position_ids_from_mask(mask).tolist() == [[0, 1, 2], [0, 0, 0]]


def test_chunked_log_softmax_matches_the_full_computation_across_uneven_chunks(monkeypatch):
    import rloo.passes.logprobs as logprobs

    logits = torch.randn(7, 5, 11, dtype=torch.bfloat16)
    index = torch.randint(0, 11, (7, 5))
    full = torch.log_softmax(logits.float(), dim=-1)
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 2 * 5 * 11)  # blocks of 2 rows: 2, 2, 2, 1
    assert len(logprobs._row_chunks(logits)) == 4
    torch.testing.assert_close(selective_log_softmax(logits, index), full.gather(-1, index.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(entropy_from_logits(logits), -(full.exp() * full).sum(-1))

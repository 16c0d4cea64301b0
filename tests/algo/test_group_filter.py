"""Dynamic sampling's group filter (rloo.algo.group_filter), and zero-spread groups in the loss."""

import math

import pytest
import torch

from rloo.algo.advantages import compute_advantages
from rloo.algo.group_filter import informative_groups, keep_rows
from rloo.algo.loss import clipped_sequence_loss, loss_denominator


def test_informative_groups_by_hand():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.5], [2.0, 2.0, math.nan], [3.0, 0.0, 0.0]])
    valid = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0]]).bool()
    # all equal; spread; all equal; equal among the scored (the NaN is unscored); one scored sample only.
    assert informative_groups(rewards, valid).tolist() == [False, True, False, False, False]
    assert informative_groups(rewards[:3]).tolist() == [False, True, False]


def test_atol_treats_near_ties_as_equal():
    rewards = torch.tensor([[0.0, 1e-9, 0.0]])
    assert informative_groups(rewards).tolist() == [True]
    assert informative_groups(rewards, atol=1e-6).tolist() == [False]


def test_informative_groups_match_rloo_advantages():
    torch.manual_seed(0)
    rewards = torch.randint(0, 2, (50, 4)).float()
    advantages = compute_advantages(rewards, "rloo")
    assert torch.equal(informative_groups(rewards), (advantages != 0).any(dim=1))


def test_keep_rows():
    assert keep_rows(torch.tensor([False, True, True]), 2).tolist() == [2, 3, 4, 5]
    assert keep_rows(torch.tensor([False, False]), 3).tolist() == []


def test_zero_spread_groups_still_count_in_the_loss_denominator():
    # Group 0 has zero spread (advantages 0, 0), group 1 has advantages -1, +1.
    advantages = compute_advantages(torch.tensor([[1.0, 1.0], [0.0, 1.0]]), "rloo").view(-1)
    assert advantages.tolist() == [0.0, 0.0, -1.0, 1.0]
    seq_logps = torch.tensor([-1.0, -2.0, -3.0, -4.0], requires_grad=True)
    out = clipped_sequence_loss(seq_logps, seq_logps.detach(), advantages, 0.2)
    mask = torch.ones(4, 5)
    denominator = loss_denominator("seq-mean-token-sum", mask)
    assert denominator.item() == 4.0  # all four completions, the zero-spread pair included
    (out.loss.sum() / denominator).backward()
    # d/dlogp_i of -A_i * rho_i / 4 = -A_i / 4.
    assert seq_logps.grad.tolist() == pytest.approx([0.0, 0.0, 0.25, -0.25])

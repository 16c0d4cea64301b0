"""The algorithm options' math against hand-computed values and slow loops.

Estimators, the valid mask, KL estimators and placements, clipping with epsilon_high, loss
aggregation, reward shaping and stop strings.
"""

import math

import pytest
import torch

from rloo.algo.advantages import compute_advantages, leave_one_out_advantages, whiten
from rloo.algo.kl import sequence_kl, token_kl, token_kl_advantages
from rloo.algo.loss import clipped_sequence_loss, clipped_token_loss, loss_denominator, reduce_to_sequences
from rloo.algo.shaping import shape_scores
from rloo.generation.stop import cut_at_stop_strings, stop_string_length
from rloo.passes.logprobs import completion_logprobs

S2 = math.sqrt(2.0)

# ---------------------------------------------------------------- advantage estimators

# Group 1: r = [1, 0, 0, 3], sum 4, mean 1, centered [0, -1, -1, 2], unbiased var (0+1+1+4)/3 = 2.
# Group 2: r = [2, 2, 2, 2], centered all 0.
REWARDS = torch.tensor([[1.0, 0.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
# reinforce_pp: the 8 centered values have mean 0 and population variance (0+1+1+4+0)/8 = 0.75.
PP = math.sqrt(0.75) + 1e-8
BY_HAND = {
    # A_i = r_i - (4 - r_i)/3
    "rloo": [[0.0, -4 / 3, -4 / 3, 8 / 3], [0.0] * 4],
    "drgrpo": [[0.0, -1.0, -1.0, 2.0], [0.0] * 4],
    "grpo": [[0.0, -1 / (S2 + 1e-4), -1 / (S2 + 1e-4), 2 / (S2 + 1e-4)], [0.0] * 4],
    "reinforce": [[1.0, 0.0, 0.0, 3.0], [2.0] * 4],
    "reinforce_pp": [[0.0, -1 / PP, -1 / PP, 2 / PP], [0.0] * 4],
}


@pytest.mark.parametrize("estimator", sorted(BY_HAND))
def test_estimators_by_hand(estimator):
    expected = torch.tensor(BY_HAND[estimator], dtype=torch.float64)
    torch.testing.assert_close(compute_advantages(REWARDS, estimator), expected)


def test_unknown_estimator_lists_the_valid_ones():
    with pytest.raises(ValueError, match="rloo.*reinforce_pp"):
        compute_advantages(REWARDS, "ppo")


# Group 1: r = [1, 5, 0, 3] with the 5 invalid: valid values 1, 0, 3 (mean 4/3).
# Group 2: only one valid sample. NaN placeholders at invalid positions must not leak.
MASKED = torch.tensor([[1.0, 5.0, 0.0, 3.0], [2.0, float("nan"), float("nan"), float("nan")]], dtype=torch.float64)
VALID = torch.tensor([[True, False, True, True], [True, False, False, False]])
MASKED_BY_HAND = {
    # baseline = mean of the OTHER valid ones: 1 - (0+3)/2, 0 - (1+3)/2, 3 - (1+0)/2; alone -> 0
    "rloo": [[-0.5, 0.0, -2.0, 2.5], [0.0] * 4],
    "drgrpo": [[-1 / 3, 0.0, -4 / 3, 5 / 3], [0.0] * 4],
    # unbiased var over the 3 valid: (1/9 + 16/9 + 25/9) / 2 = 7/3
    "grpo": [[-1 / 3 / (math.sqrt(7 / 3) + 1e-4), 0.0, -4 / 3 / (math.sqrt(7 / 3) + 1e-4), 5 / 3 / (math.sqrt(7 / 3) + 1e-4)],
             [0.0] * 4],
    "reinforce": [[1.0, 0.0, 0.0, 3.0], [2.0, 0.0, 0.0, 0.0]],
    # the singleton group is left out of the batch statistics; the 3 centered values have mean 0,
    # population var (1/9 + 16/9 + 25/9) / 3 = 14/9
    "reinforce_pp": [[-1 / 3 / (math.sqrt(14 / 9) + 1e-8), 0.0, -4 / 3 / (math.sqrt(14 / 9) + 1e-8),
                      5 / 3 / (math.sqrt(14 / 9) + 1e-8)], [0.0] * 4],
}


@pytest.mark.parametrize("estimator", sorted(MASKED_BY_HAND))
def test_invalid_samples_are_left_out_of_every_baseline(estimator):
    expected = torch.tensor(MASKED_BY_HAND[estimator], dtype=torch.float64)
    torch.testing.assert_close(compute_advantages(MASKED, estimator, valid=VALID), expected)


def _loop_masked_leave_one_out(rewards, valid):
    out = torch.zeros_like(rewards)
    for p in range(rewards.shape[0]):
        for i in range(rewards.shape[1]):
            others = [rewards[p, j] for j in range(rewards.shape[1]) if j != i and valid[p, j]]
            if valid[p, i] and others:
                out[p, i] = rewards[p, i] - sum(others) / len(others)
    return out


@pytest.mark.parametrize("k", [2, 3, 5])
def test_masked_leave_one_out_matches_a_loop(k):
    generator = torch.Generator().manual_seed(k)
    rewards = torch.randn(6, k, generator=generator, dtype=torch.float64)
    valid = torch.rand(6, k, generator=generator) > 0.3
    torch.testing.assert_close(compute_advantages(rewards, "rloo", valid), _loop_masked_leave_one_out(rewards, valid))
    # all valid: the masked path is the plain leave-one-out one
    torch.testing.assert_close(compute_advantages(rewards, "rloo"), leave_one_out_advantages(rewards))


def test_whiten_by_hand():
    # mean 2, population std sqrt(2/3)
    torch.testing.assert_close(whiten(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)),
                               torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64) / (math.sqrt(2 / 3) + 1e-8))


# ---------------------------------------------------------------- KL estimators and placements

def test_kl_estimators_by_hand():
    logps = torch.tensor([[-1.0, -2.0, -1.0]])
    ref = torch.tensor([[-2.0, -1.0, -1.0]])  # log r = 1, -1, 0
    torch.testing.assert_close(token_kl(logps, ref, "k1"), torch.tensor([[1.0, -1.0, 0.0]]))
    torch.testing.assert_close(token_kl(logps, ref, "k2"), torch.tensor([[0.5, 0.5, 0.0]]))
    # k3 = e^{-log r} - 1 + log r: e^-1 - 1 + 1 = 0.3679; e^1 - 1 - 1 = 0.7183; 0
    torch.testing.assert_close(token_kl(logps, ref, "k3"), torch.tensor([[math.exp(-1), math.e - 2, 0.0]]))
    mask = torch.tensor([[1, 1, 0]])
    torch.testing.assert_close(sequence_kl(logps, ref, mask, "k3"), torch.tensor([math.exp(-1) + math.e - 2]))
    with pytest.raises(ValueError, match="k1"):
        token_kl(logps, ref, "k4")


def test_k3_is_nonnegative_and_k1_k3_agree_in_expectation():
    generator = torch.Generator().manual_seed(0)
    pi = torch.softmax(torch.randn(6, generator=generator, dtype=torch.float64), 0)
    ref = torch.softmax(torch.randn(6, generator=generator, dtype=torch.float64), 0)
    exact = (pi * (pi / ref).log()).sum()
    log_pi, log_ref = pi.log().unsqueeze(0), ref.log().unsqueeze(0)  # every token of the vocabulary, weighted by pi
    assert (token_kl(log_pi, log_ref, "k3") >= 0).all()
    for estimator in ("k1", "k3"):  # both unbiased: the pi-weighted mean is the exact KL
        torch.testing.assert_close((pi * token_kl(log_pi, log_ref, estimator)).sum(), exact)
    assert not torch.isclose((pi * token_kl(log_pi, log_ref, "k2")).sum(), exact)  # k2 is biased


def test_token_kl_advantages_by_hand():
    advantages = torch.tensor([1.0, -2.0])
    kls = torch.tensor([[0.5, 0.2, 0.3, 9.0], [1.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    # row 1: KL before each token 0, 0.5, 0.7 -> 1 + 0.1 * [0, 0.5, 0.7]; padding 0 (the 9 never counts)
    # row 2: KL before 0, 1 -> -2 + 0.1 * [0, 1]
    expected = torch.tensor([[1.0, 1.05, 1.07, 0.0], [-2.0, -1.9, 0.0, 0.0]])
    torch.testing.assert_close(token_kl_advantages(advantages, kls, mask, beta=0.1), expected)


def test_token_kl_really_changes_the_gradient():
    """TRL #2581: token-level KL summed back into one reward gave the sequence gradient exactly."""
    logps = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    kls = torch.tensor([[0.4, 0.2, 0.6]])
    mask = torch.ones(1, 3)
    advantage = torch.tensor([1.0])  # sequence advantage of r = score - beta * 1.2
    sequence = clipped_sequence_loss(logps.sum(1), logps.sum(1).detach(), advantage, 0.2).loss.sum()
    (seq_grad,) = torch.autograd.grad(sequence, logps)
    token_adv = token_kl_advantages(advantage, kls, mask, beta=0.5)
    token = clipped_token_loss(logps, logps.detach(), token_adv, 0.2).loss.sum()
    (token_grad,) = torch.autograd.grad(token, logps)
    # sequence: every token gets -A = -1; token: -(A + 0.5 * KL before t) = -[1, 1.2, 1.3]
    torch.testing.assert_close(seq_grad, torch.tensor([[-1.0, -1.0, -1.0]]))
    torch.testing.assert_close(token_grad, torch.tensor([[-1.0, -1.2, -1.3]]))


# ---------------------------------------------------------------- clipping and aggregation

def test_epsilon_high_widens_only_the_upper_side():
    log_ratio = torch.tensor([0.25, 0.25, -0.3, -0.3])  # ratios 1.284, 1.284, 0.741, 0.741
    advantages = torch.tensor([1.0, -1.0, -1.0, 1.0])
    logps = log_ratio.clone().requires_grad_()
    symmetric = clipped_sequence_loss(logps, torch.zeros(4), advantages, epsilon=0.2)
    # A>0, ratio 1.284 > 1.2: clipped high; A<0, ratio 0.741 < 0.8: clipped low; the others are not
    assert symmetric.clipped_high.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert symmetric.clipped_low.tolist() == [0.0, 0.0, 1.0, 0.0]
    torch.testing.assert_close(symmetric.loss[:3], torch.tensor([-1.2, math.exp(0.25), 0.8]))
    wide = clipped_sequence_loss(logps, torch.zeros(4), advantages, epsilon=0.2, epsilon_high=0.3)
    # 1.284 < 1.3 is now inside: -A * ratio with its gradient; the low side is unchanged
    assert wide.clipped_high.tolist() == [0.0, 0.0, 0.0, 0.0] and wide.clipped_low.tolist() == [0.0, 0.0, 1.0, 0.0]
    torch.testing.assert_close(wide.loss[0], torch.tensor(-math.exp(0.25)))
    wide.loss.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([-math.exp(0.25), math.exp(0.25), 0.0, -math.exp(-0.3)]))


def test_token_loss_is_the_sequence_formula_per_token():
    logps = torch.tensor([[-1.0, -0.5], [-2.0, -1.0]])
    old = torch.tensor([[-1.0, -1.0], [-1.5, -1.0]])  # token ratios [1, e^0.5], [e^-0.5, 1]
    out = clipped_token_loss(logps, old, torch.tensor([2.0, -1.0]), epsilon=0.2)
    # row 1 (A=2): -2 * 1, max(-2 * 1.6487, -2 * 1.2) = -2.4; row 2 (A=-1): max(0.6065, 0.8) = 0.8, 1
    torch.testing.assert_close(out.loss, torch.tensor([[-2.0, -2.4], [0.8, 1.0]]))
    assert out.clipped.tolist() == [[0.0, 1.0], [1.0, 0.0]]


TOKEN_LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 7.0, 7.0]])
TOKEN_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # lengths 3 and 1; the 7s are padding


@pytest.mark.parametrize(
    "mode, numerators, denominator",
    [
        ("seq-mean-token-sum", [6.0, 4.0], 2.0),  # loss (6 + 4) / 2 completions = 5
        ("token-mean", [6.0, 4.0], 4.0),  # (1+2+3+4) / 4 tokens = 2.5
        ("seq-mean-token-mean", [2.0, 4.0], 2.0),  # (6/3 + 4/1) / 2 = 3
        ("seq-mean-token-sum-norm", [1.5, 1.0], 2.0),  # (6/4 + 4/4) / 2 with max_completion_length 4
    ],
)
def test_loss_aggregation_by_hand(mode, numerators, denominator):
    torch.testing.assert_close(reduce_to_sequences(TOKEN_LOSS, TOKEN_MASK, mode, max_completion_length=4),
                               torch.tensor(numerators))
    assert loss_denominator(mode, TOKEN_MASK).item() == denominator


def test_masked_out_completions_leave_the_denominators():
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])  # the middle completion carries no weight
    assert loss_denominator("seq-mean-token-sum", mask).item() == 2.0
    assert loss_denominator("token-mean", mask).item() == 3.0


def test_entropy_carries_grad_only_when_asked(make_model):
    model = make_model()
    ids = torch.tensor([[5, 6, 7, 8]])
    mask = torch.ones_like(ids)
    _, detached = completion_logprobs(model, ids, mask, 2, with_entropy=True)
    _, with_grad = completion_logprobs(model, ids, mask, 2, with_entropy=True, entropy_grad=True)
    assert not detached.requires_grad and with_grad.requires_grad
    torch.testing.assert_close(detached, with_grad.detach())


# ---------------------------------------------------------------- reward shaping and stop strings

def test_shape_scores_by_hand():
    scores = torch.tensor([1.0, 2.0, 3.0, 10.0])
    ended = torch.tensor([True, False, True, True])
    penalised = shape_scores(scores, ended, missing_eos_penalty=1.0)
    torch.testing.assert_close(penalised, torch.tensor([1.0, 1.0, 3.0, 10.0]))
    # mean 3.75; deviations -2.75, -2.75, -0.75, 6.25; unbiased var (7.5625*2 + 0.5625 + 39.0625)/3 = 18.25
    std = math.sqrt(18.25) + 1e-8
    z = torch.tensor([-2.75, -2.75, -0.75, 6.25]) / std
    torch.testing.assert_close(shape_scores(scores, ended, 1.0, normalize=True), z)
    torch.testing.assert_close(shape_scores(scores, ended, 1.0, normalize=True, clip_range=1.0),
                               torch.tensor([-2.75 / std, -2.75 / std, -0.75 / std, 1.0]))
    torch.testing.assert_close(shape_scores(scores, ended, clip_range=2.5), torch.tensor([1.0, 2.0, 2.5, 2.5]))
    assert scores.tolist() == [1.0, 2.0, 3.0, 10.0]  # the input is left alone


def _decode(ids):
    # token 0 is the two-character piece "ab"; token n > 0 is chr(ord('a') + n)
    return "".join("ab" if i == 0 else chr(ord("a") + i) for i in ids)


def test_stop_string_length_by_hand():
    # tokens 3, 4, 0, 2 decode to "de" + "ab" + "c" = "deabc"
    assert stop_string_length([3, 4, 0, 2], _decode, ["ea"]) == 3  # "ea" completes with the "ab" token
    assert stop_string_length([3, 4, 0, 2], _decode, ["bc", "d"]) == 1  # the earliest of several strings
    assert stop_string_length([3, 4, 0, 2], _decode, ["zz"]) is None
    assert stop_string_length([], _decode, ["a"]) is None


def test_cut_at_stop_strings_marks_the_completion_as_ended():
    ids = torch.tensor([[3, 4, 0, 2], [3, 3, 9, 9]])  # "deabc"; "dd" then padding (9)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    ended = torch.tensor([False, True])
    new_ids, new_mask, new_ended = cut_at_stop_strings(ids, mask, ended, _decode, ["ea"], pad_token_id=9)
    assert new_ids.tolist() == [[3, 4, 0, 9], [3, 3, 9, 9]]
    assert new_mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert new_ended.tolist() == [True, True]
    assert ids.tolist() == [[3, 4, 0, 2], [3, 3, 9, 9]]  # inputs untouched


def test_normalize_rewards_uses_only_scored_samples():
    scores = torch.tensor([1.0, 0.0, 3.0, 0.0])  # samples 1 and 3: no reward function scored them
    valid = torch.tensor([True, False, True, False])
    shaped = shape_scores(scores, torch.ones(4, dtype=torch.bool), normalize=True, valid=valid)
    # Over the scored values {1, 3}: mean 2, sample std sqrt(2); the unscored stay 0.
    s = 2 ** 0.5
    torch.testing.assert_close(shaped, torch.tensor([-1 / s, 0.0, 1 / s, 0.0]))

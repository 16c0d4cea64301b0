"""The off-policy toolkit (rloo.algo.off_policy) against hand-computed values and slow loops."""

import math

import pytest
import torch

from rloo.algo.off_policy import (
    importance_log_ratio,
    kept_log_mass,
    off_policy_sequence_mask,
    sampler_correction_weights,
    sampling_keep_mask,
    truncated_logprobs,
)
from rloo.generation.fast import filter_logits

LN = math.log


def test_token_level_ratio_is_per_token_and_detaches_old():
    logps = torch.tensor([[LN(0.5), LN(0.2)]], requires_grad=True)
    old = torch.tensor([[LN(0.25), LN(0.4)]], requires_grad=True)
    log_ratio = importance_log_ratio(logps, old, torch.ones(1, 2), "token")
    # 0.5 / 0.25 = 2, 0.2 / 0.4 = 0.5
    assert log_ratio.exp()[0].tolist() == pytest.approx([2.0, 0.5])
    log_ratio.sum().backward()
    assert old.grad is None and logps.grad.tolist() == [[1.0, 1.0]]


def test_sequence_level_ratio_is_the_length_normalised_mean():
    # Row 0: token ratios 4 and 1 over two real tokens -> geometric mean 2 (a sum would give 4).
    # Row 1: token ratios 2, 2, 2 -> 2 (a sum would give 8). Padding (99) never counts.
    logps = torch.tensor([[LN(0.8), LN(0.3), 99.0], [LN(0.2), LN(0.4), LN(0.6)]], requires_grad=True)
    old = torch.tensor([[LN(0.2), LN(0.3), 0.0], [LN(0.1), LN(0.2), LN(0.3)]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    log_s = importance_log_ratio(logps, old, mask, "sequence")
    assert log_s.exp().flatten().tolist() == pytest.approx([2.0] * 6, rel=1e-5)
    # d log s_i / d log pi_t = 1 / |y_i| on real tokens, 0 on padding.
    log_s[:, 0].sum().backward()
    assert logps.grad.flatten().tolist() == pytest.approx([0.5, 0.5, 0.0, 1 / 3, 1 / 3, 1 / 3])


def test_sequence_level_matches_a_slow_loop():
    torch.manual_seed(0)
    logps, old = torch.randn(5, 7), torch.randn(5, 7)
    mask = (torch.rand(5, 7) > 0.3).int()
    mask[:, 0] = 1
    fast = importance_log_ratio(logps, old, mask, "sequence")[:, 0]
    for row in range(5):
        total, count = 0.0, 0
        for t in range(7):
            if mask[row, t]:
                total += float(logps[row, t] - old[row, t])
                count += 1
        assert fast[row].item() == pytest.approx(total / count, abs=1e-5)


def test_unknown_level_is_refused():
    with pytest.raises(ValueError, match="importance_sampling_level"):
        importance_log_ratio(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), "tokens")


def test_off_policy_mask_drops_only_negative_samples_that_drifted():
    current = torch.zeros(4, 3)
    # Mean drift log pi_sampler - log pi over the two real tokens: 0.6, 0.4, 2.0, 2.0 (the third column is padding).
    sampler = torch.tensor([[0.7, 0.5, 50.0], [0.4, 0.4, 50.0], [2.0, 2.0, 50.0], [2.0, 2.0, 50.0]])
    mask = torch.tensor([[1, 1, 0]] * 4)
    advantages = torch.tensor([-1.0, -1.0, 1.0, 0.0])
    keep = off_policy_sequence_mask(advantages, current, sampler, mask, threshold=0.5)
    # row 0: A < 0 and drift 0.6 > 0.5 -> dropped; row 1 drift 0.4 kept; rows 2-3: A >= 0 kept.
    assert keep.tolist() == [0.0, 1.0, 1.0, 1.0]
    # The sign matters: a policy that moved *towards* the sample (negative drift) keeps it.
    assert off_policy_sequence_mask(advantages, sampler, current, mask, 0.5).tolist() == [1.0, 1.0, 1.0, 1.0]


def test_sampler_correction_modes_by_hand():
    # Token ratios pi_old / pi_s: 2, 3 and (padding) 0.5; the sequence ratio is 2 * 3 = 6.
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2]]))
    sampler = torch.log(torch.tensor([[0.25, 0.3, 0.4]]))
    mask = torch.tensor([[1, 1, 0]])

    def weights(mode, low, high):
        return sampler_correction_weights(old, sampler, mask, mode, low, high)[0].tolist()

    assert weights("token_truncate", None, 2.5) == pytest.approx([2.0, 2.5, 1.0])
    assert weights("token_truncate", 2.5, None) == pytest.approx([2.5, 3.0, 1.0])
    assert weights("token_mask", None, 2.5) == pytest.approx([2.0, 0.0, 1.0])
    assert weights("token_mask", 2.5, None) == pytest.approx([0.0, 3.0, 1.0])
    assert weights("sequence_truncate", None, 5.0) == pytest.approx([5.0, 5.0, 1.0])
    assert weights("sequence_mask", None, 5.0) == pytest.approx([0.0, 0.0, 1.0])
    assert weights("sequence_mask", 0.5, 10.0) == pytest.approx([6.0, 6.0, 1.0])
    with pytest.raises(ValueError, match="token_truncate"):
        weights("truncate", None, 2.0)


# Probabilities 0.5, 0.3, 0.15, 0.05 as logits (their logs).
PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def test_truncated_logprobs_renormalise_over_the_kept_set():
    logits = PROBS.log().view(1, 1, 4).expand(1, 4, 4)
    targets = torch.tensor([[0, 1, 2, 3]])
    # top_k=2 keeps {0, 1}, mass 0.8: 0.5 / 0.8, 0.3 / 0.8, outside -> -inf.
    top_k = truncated_logprobs(logits, targets, top_k=2)[0]
    assert top_k[:2].tolist() == pytest.approx([LN(0.5 / 0.8), LN(0.3 / 0.8)], rel=1e-5)
    assert top_k[2:].tolist() == [-math.inf, -math.inf]
    # top_p=0.9: ascending masses 0.05, 0.2, ... ; only 0.05 <= 1 - 0.9 goes, kept mass 0.95.
    top_p = truncated_logprobs(logits, targets, top_p=0.9)[0]
    assert top_p[:3].tolist() == pytest.approx([LN(0.5 / 0.95), LN(0.3 / 0.95), LN(0.15 / 0.95)], rel=1e-5)
    assert top_p[3].item() == -math.inf
    # No filter: the plain softmax.
    assert truncated_logprobs(logits, targets)[0].tolist() == pytest.approx(PROBS.log().tolist(), rel=1e-5)


def test_kept_log_mass_by_hand_and_with_temperature():
    scores = PROBS.log().view(1, 4)
    assert kept_log_mass(scores, top_k=2).item() == pytest.approx(LN(0.8), rel=1e-5)
    assert kept_log_mass(scores, top_p=0.7).item() == pytest.approx(LN(0.8), rel=1e-5)  # 0.05, 0.15 <= 0.3 go
    assert kept_log_mass(scores).item() == pytest.approx(0.0, abs=1e-6)
    # At temperature 2 the probabilities become sqrt(p) / sum sqrt(p); top_k=2 keeps the two largest.
    roots = PROBS.sqrt()
    expected = LN(float(roots[:2].sum() / roots.sum()))
    assert kept_log_mass(scores / 2.0, top_k=2).item() == pytest.approx(expected, rel=1e-5)
    # The truncated log-prob is the full one minus the kept mass.
    full = torch.log_softmax(scores, dim=-1)[0, 1]
    truncated = truncated_logprobs(scores.view(1, 1, 4), torch.tensor([[1]]), top_k=2)[0, 0]
    assert truncated.item() == pytest.approx((full - kept_log_mass(scores, top_k=2)).item(), rel=1e-5)


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (3, 1.0), (0, 0.8), (5, 0.6), (1, 0.95)])
def test_keep_mask_is_the_samplers_filter(top_k, top_p):
    torch.manual_seed(1)
    logits = torch.randn(6, 20) * 3
    sampled_from = torch.isfinite(filter_logits(logits, 1.0, top_k, top_p))
    assert torch.equal(sampling_keep_mask(logits, top_k, top_p), sampled_from)

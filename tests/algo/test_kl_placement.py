"""Where each kl_penalty mode puts the KL, decided in one place (algo/kl.py)."""

import pytest

from rloo.algo.kl import KL_PENALTIES, KLPlacement, kl_placement


@pytest.mark.parametrize("mode, beta, expected", [
    ("sequence", 0.1, KLPlacement(in_reward=True, token_advantages=False, keeps_ref_logps=False, in_loss=False)),
    ("token", 0.1, KLPlacement(in_reward=True, token_advantages=True, keeps_ref_logps=False, in_loss=False)),
    ("loss", 0.1, KLPlacement(in_reward=False, token_advantages=False, keeps_ref_logps=True, in_loss=True)),
    ("token", 0.0, KLPlacement(in_reward=True, token_advantages=False, keeps_ref_logps=False, in_loss=False)),
    ("loss", 0.0, KLPlacement(in_reward=False, token_advantages=False, keeps_ref_logps=True, in_loss=False)),
])
def test_each_mode_acts_where_its_docstring_says(mode, beta, expected):
    assert kl_placement(mode, beta) == expected


def test_every_mode_is_placed_and_an_unknown_one_is_refused():
    assert {mode: kl_placement(mode, 0.1).in_reward for mode in KL_PENALTIES} == {"sequence": True, "token": True,
                                                                                  "loss": False}
    with pytest.raises(ValueError, match="kl_penalty must be one of"):
        kl_placement("reward", 0.1)

"""DAPO's soft overlong punishment as a built-in reward (rloo.rewards.overlong_penalty)."""

import pytest

from rloo.rewards import BUILTIN_REWARD_FACTORIES, get_soft_overlong_punishment, overlong_penalty


def test_overlong_penalty_by_hand():
    reward = overlong_penalty(max_completion_length=10, overlong_buffer=4)
    lengths = [3, 6, 7, 8, 10, 11]
    # free = 6: 0 up to 6 tokens, then (6 - L) / 4 down to -1 at 10, and -1 past it.
    assert reward(completion_ids=[[0] * n for n in lengths]) == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])


def test_overlong_penalty_agrees_with_trls_function():
    ours = overlong_penalty(max_completion_length=20, overlong_buffer=5)
    trls = get_soft_overlong_punishment(max_completion_len=20, soft_punish_cache=5)
    ids = [[1] * n for n in range(0, 25)]
    assert ours(completion_ids=ids) == pytest.approx(trls(completion_ids=ids))


@pytest.mark.parametrize("length,buffer", [(10, 0), (10, 10), (10, 12), (10, 2.5)])
def test_bad_buffers_are_refused(length, buffer):
    with pytest.raises(ValueError, match="overlong_buffer"):
        overlong_penalty(max_completion_length=length, overlong_buffer=buffer)


def test_registered_as_a_factory():
    assert BUILTIN_REWARD_FACTORIES["overlong_penalty"] is overlong_penalty

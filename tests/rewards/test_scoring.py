"""Reward plumbing: None and the valid mask, async functions, trainer_state, and every malformed output."""

import asyncio
import math

import pytest
import torch

from rloo.algo.advantages import leave_one_out_advantages
from rloo.rewards.scoring import RewardError, RewardFunction, reward_function_metrics, score_completions


def _arguments(n=4):
    return {
        "prompts": [f"prompt {i} " + "x" * 300 for i in range(n)],
        "completions": [f"completion {i}" for i in range(n)],
        "completion_ids": [[i] for i in range(n)],
        "answer": [str(i) for i in range(n)],
        "trainer_state": {"global_step": 7, "episode": 56},
    }


def _score(funcs, weights=None, arguments=None, step=7):
    arguments = arguments or _arguments()
    wrapped = [RewardFunction.wrap(f) for f in funcs]
    return score_completions(wrapped, weights or [1.0] * len(funcs), arguments, len(arguments["prompts"]), step=step)


def test_leave_one_out_with_valid_mask_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 99.0],
                            [5.0, float("nan"), 7.0, 0.0],
                            [4.0, 8.0, 8.0, 8.0]])
    valid = torch.tensor([[True, True, True, False],
                          [True, False, False, False],
                          [True, True, True, True]])
    advantages = leave_one_out_advantages(rewards, valid)
    # Row 0: the invalid 99 is out of every baseline: 1-(2+3)/2, 2-(1+3)/2, 3-(1+2)/2, and 0 for itself.
    # Row 1: the only valid sample has no other valid one to compare with: 0 (and the NaN never leaks).
    # Row 2: all valid, the plain leave-one-out: 4-8, 8-(4+8+8)/3 (x3).
    expected = torch.tensor([[-1.5, 0.0, 1.5, 0.0],
                             [0.0, 0.0, 0.0, 0.0],
                             [-4.0, 4.0 / 3, 4.0 / 3, 4.0 / 3]])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(leave_one_out_advantages(rewards[2:], valid[2:]), leave_one_out_advantages(rewards[2:]))
    with pytest.raises(ValueError, match="shape"):
        leave_one_out_advantages(rewards, valid[:, :2])


def test_none_leaves_a_function_out_and_unscored_samples_are_invalid():
    def only_even(completions, **kwargs):
        return [1.0 if i % 2 == 0 else None for i in range(len(completions))]

    def only_first(completions, **kwargs):
        return [3.0, None, None, None]

    scored = _score([only_even, only_first], weights=[2.0, 0.5])
    # Sample 0: 2*1 + 0.5*3; sample 2: 2*1 only; samples 1 and 3: nobody scored them.
    torch.testing.assert_close(scored.scores, torch.tensor([3.5, 0.0, 2.0, 0.0]))
    assert scored.valid.tolist() == [True, False, True, False]
    assert math.isnan(scored.per_function[1, 0]) and scored.per_function[0, 1] == 3.0
    metrics = reward_function_metrics(["only_even", "only_first"], scored.per_function)
    assert metrics == {"rewards/only_even/mean": 1.0, "rewards/only_even/std": 0.0,
                       "rewards/only_first/mean": 3.0, "rewards/only_first/std": 0.0,  # over scored samples, no NaN
                       "rewards/unscored_frac": 0.5}
    assert reward_function_metrics(["never"], torch.full((4, 1), float("nan"))) == {"rewards/unscored_frac": 1.0}


def test_async_functions_run_concurrently_and_trainer_state_reaches_kwargs():
    order = []

    async def slow_a(completions, **kwargs):
        order.append("a starts")
        await asyncio.sleep(0.05)
        order.append("a ends")
        return [1.0] * len(completions)

    async def slow_b(completions, **kwargs):
        order.append("b starts")
        await asyncio.sleep(0.05)
        order.append("b ends")
        return [2.0] * len(completions)

    seen = {}

    def with_state(completions, trainer_state):
        seen["state"] = trainer_state
        return [0.0] * len(completions)

    def with_kwargs(completions, **kwargs):
        seen["kwargs"] = set(kwargs)
        return [0.0] * len(completions)

    scored = _score([slow_a, with_state, slow_b, with_kwargs])
    assert order[:2] == ["a starts", "b starts"]  # together: b starts before a ends, whatever the clock says
    torch.testing.assert_close(scored.per_function[:, 0], torch.ones(4))
    torch.testing.assert_close(scored.per_function[:, 2], torch.full((4,), 2.0))
    assert seen["state"] == {"global_step": 7, "episode": 56}
    # TRL passes trainer_state (and log_extra / log_metric) through **kwargs too
    assert "trainer_state" in seen["kwargs"] and "answer" in seen["kwargs"]


def _wrong_count(completions, **kwargs):
    return [1.0]


def _a_string(completions, **kwargs):
    return [1.0, "0.5", 1.0, 1.0]


def _nan(completions, **kwargs):
    return [1.0, 1.0, float("nan"), 1.0]


def _inf(completions, **kwargs):
    return [1.0, 1.0, 1.0, float("-inf")]


def _raises(completions, **kwargs):
    return [1.0 / (int(c[-1]) - 3) for c in completions]  # sample 3 divides by zero


def _a_number(completions, **kwargs):
    return 1.0


@pytest.mark.parametrize("func, pattern", [
    (_wrong_count, r"`_wrong_count` returned 1 values for 4 completions at step 7.*nothing is broadcast"),
    (_a_string, r"`_a_string` returned '0.5' \(a str, not a number\) for sample 1 at step 7"),
    (_nan, r"`_nan` returned nan for sample 2 at step 7"),
    (_inf, r"`_inf` returned -inf for sample 3 at step 7"),
    (_raises, r"`_raises` raised ZeroDivisionError: .* at step 7, on sample 3"),
    (_a_number, r"`_a_number` returned a float at step 7"),
])
def test_malformed_outputs_name_function_step_and_sample(func, pattern):
    with pytest.raises(RewardError, match=pattern) as error:
        _score([func])
    message = str(error.value)
    if "sample" in pattern:  # the sample is shown, its long prompt shortened
        index = int(pattern.split("sample ")[1][0])
        assert f"completion: completion {index}" in message and " ... " in message and len(message) < 800


def test_async_function_errors_are_blamed_on_it():
    async def broken(completions, **kwargs):
        raise KeyError("missing")

    with pytest.raises(RewardError, match=r"`broken` raised KeyError: 'missing' at step 3"):
        _score([broken], step=3)

"""reward_timeout (issue #48): a reward function that hangs is abandoned after the deadline, and the run stops
naming the function, the step and the batch ("stop"), or scores that function None on the batch ("none")."""

import asyncio
import math
import threading
import time

import pytest

from rloo import RLOOConfig
from rloo.config_checks import ConfigError
from rloo.rewards.scoring import RewardFunction, RewardTimeout, score_completions

ARGUMENTS = {"prompts": ["a"] * 4, "completions": ["1", "2", "3", "4"], "completion_ids": [[1]] * 4}


def _hangs(release: threading.Event):
    def hangs(completions, **kwargs):
        release.wait(60)  # a reward server that never answers
        return [1.0] * len(completions)
    return hangs


def test_a_hung_plain_function_is_abandoned_at_the_deadline_and_named():
    release = threading.Event()
    fn = RewardFunction.wrap(_hangs(release))
    start = time.monotonic()
    with pytest.raises(RewardTimeout, match=r"reward function `hangs` did not return within reward_timeout=0.5 s "
                                            r"at step 7, on the batch of 4 completions"):
        score_completions([fn], [1.0], ARGUMENTS, 4, step=7, timeout=0.5)
    assert time.monotonic() - start < 5
    release.set()


def test_with_policy_none_the_hung_function_scores_the_batch_none_and_is_counted():
    release = threading.Event()
    ok = RewardFunction.wrap(lambda completions, **kw: [0.5] * len(completions), name="ok")
    scored = score_completions([RewardFunction.wrap(_hangs(release)), ok], [1.0, 1.0], ARGUMENTS, 4, step=2,
                               error_policy="none", timeout=0.5)
    release.set()
    assert all(math.isnan(v) for v in scored.per_function[:, 0].tolist())
    assert scored.per_function[:, 1].tolist() == [0.5] * 4 and scored.errors == {"hangs": 4}


def test_a_hung_async_function_is_cancelled_at_the_deadline():
    async def slow(completions, **kwargs):
        await asyncio.sleep(60)
        return [1.0] * len(completions)

    start = time.monotonic()
    with pytest.raises(RewardTimeout, match="`slow` did not return within reward_timeout=0.5 s at step 3"):
        score_completions([RewardFunction.wrap(slow)], [1.0], ARGUMENTS, 4, step=3, timeout=0.5)
    assert time.monotonic() - start < 5


def test_a_fast_function_and_its_errors_are_unchanged_under_a_deadline():
    def fails(completions, **kwargs):
        raise ValueError("broken")
    scored = score_completions([RewardFunction.wrap(lambda completions, **kw: [1.0] * 4, name="f")], [1.0],
                               ARGUMENTS, 4, timeout=5)
    assert scored.scores.tolist() == [1.0] * 4
    with pytest.raises(Exception, match=r"`fails` raised ValueError: broken at step 0, on sample 0"):
        score_completions([RewardFunction.wrap(fails)], [1.0], ARGUMENTS, 4, timeout=5)


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), True, "10"])
def test_the_deadline_is_checked(value):
    with pytest.raises(ConfigError, match="reward_timeout must be (a positive number of seconds|a finite number|of type)"):
        RLOOConfig(reward_timeout=value)

"""The rollout source is chosen once, from the config (`rollout.sources.rollout_source`)."""

from types import SimpleNamespace

import pytest

from rloo import RLOOConfig
from rloo.rollout.async_rollouts import AheadOfTheLearner
from rloo.rollout.dynamic_sampling import DynamicSampler
from rloo.rollout.sources import PlainRollouts, rollout_source


@pytest.mark.parametrize("options, kind", [({}, PlainRollouts), ({"dynamic_sampling": True}, DynamicSampler),
                                           ({"async_rollouts": True}, AheadOfTheLearner)])
def test_the_config_names_the_one_source(tmp_path, options, kind):
    args = RLOOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, **options)
    collector = SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=0))
    source = rollout_source(args, SimpleNamespace(), collector, [], lambda index: [], num_rollouts=3)
    assert type(source) is kind
    source.close()  # nothing started: closing is a no-op for every kind


def test_a_plain_source_collects_the_rollout_s_own_rows(tmp_path):
    calls = []
    collector = SimpleNamespace(collect=lambda rows, step, episode: calls.append((rows, step, episode)) or ("R", "S"))
    source = PlainRollouts(collector, rows_of=lambda index: [f"row of {index}"])
    source.start()
    assert source.next(2, 5, 40) == ("R", "S", {}) and calls == [(["row of 2"], 5, 40)]

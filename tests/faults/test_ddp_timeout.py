"""ddp_timeout (TRL's name; issue #48): the deadline of every collective reaches the process group accelerate sets
up, so that when one process dies or stalls the others end within it (benchmarks/runs/faults.py's "rank 1 stalls"
measures it with 2 processes: 20 s, then torchrun's grace)."""

import datetime

import pytest

from rloo import RLOOConfig
from rloo.builders import _process_group_kwargs
from rloo.config_checks import ConfigError


def test_the_collective_deadline_is_ddp_timeout_and_defaults_to_minutes(tmp_path):
    (handler,) = _process_group_kwargs(RLOOConfig(output_dir=str(tmp_path), ddp_timeout=20))
    assert handler.timeout == datetime.timedelta(seconds=20)
    (handler,) = _process_group_kwargs(RLOOConfig(output_dir=str(tmp_path)))
    assert handler.timeout == datetime.timedelta(minutes=5)  # transformers' 1800 s is half an hour of a dead run


@pytest.mark.parametrize("value", [0, -5])
def test_a_deadline_that_is_not_positive_is_refused(value, tmp_path):
    with pytest.raises(ConfigError, match="ddp_timeout must be > 0 seconds"):
        RLOOConfig(output_dir=str(tmp_path), ddp_timeout=value)

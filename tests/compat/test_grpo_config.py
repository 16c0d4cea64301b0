"""A GRPOConfig ports (compat/grpo_fields.py): every field of TRL 1.16's GRPOConfig is honoured, mapped or refused
as GRPOConfig's; the defaults that differ are announced once; docs/trl_migration.md's "From GRPOTrainer" tables are
the code's."""

import dataclasses
import logging
from pathlib import Path

import pytest

from rloo import RLOOConfig
from rloo.compat import grpo_fields
from rloo.compat.config_fields import TRL_FIELDS
from rloo.compat.grpo_fields import GRPO_FIELDS, defaults_table_markdown, grpo_table_markdown
from rloo.compat.trl_config import OWN_FIELDS
from rloo.config import ConfigError

DOC = Path(__file__).resolve().parents[2] / "docs" / "trl_migration.md"


def test_every_grpo_config_field_has_an_answer_and_its_default_is_taken(tmp_path):
    trl = pytest.importorskip("trl")
    fields = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}
    unanswered = sorted(name for name in fields if name not in OWN_FIELDS | set(TRL_FIELDS) | set(GRPO_FIELDS))
    assert unanswered == []
    for name in GRPO_FIELDS:  # the table's default is GRPOConfig's, and giving it is never refused
        assert fields[name].default == GRPO_FIELDS[name].default, name
        RLOOConfig(output_dir=str(tmp_path / "run"), **{name: fields[name].default})


def test_grpo_fields_map_onto_rloo_s_behaviours(tmp_path):
    config = RLOOConfig(output_dir=str(tmp_path / "run"), loss_type="grpo", scale_rewards="group",
                        vllm_importance_sampling_clip_max=3.0, multi_objective_aggregation="sum_then_normalize")
    assert (config.loss_agg_mode, config.advantage_estimator, config.vllm_importance_sampling_cap) == (
        "seq-mean-token-mean", "grpo", 3.0)
    assert config.loss_type == "grpo" and config.delta is None  # readable as a GRPO script reads them
    assert RLOOConfig(output_dir=str(tmp_path / "run"), loss_type="dr_grpo", scale_rewards="none").advantage_estimator \
        == "drgrpo"


@pytest.mark.parametrize("given, message", [
    (dict(delta=1.5), r"`delta=1.5` is a field of TRL's GRPOConfig: .*two-sided clipping.* Instead: epsilon"),
    (dict(loss_type="cispo"), r"`loss_type='cispo'` is a field of TRL's GRPOConfig: .* Instead: loss_type in"),
    (dict(scale_rewards="batch"), r"`scale_rewards='batch'` is a field of TRL's GRPOConfig: .*normalize_advantages"),
    (dict(top_entropy_quantile=0.2), r"is a field of TRL's GRPOConfig: training only the highest-entropy tokens"),
    (dict(multi_objective_aggregation="normalize_then_sum"), r"is a field of TRL's GRPOConfig: rloo sums"),
    (dict(loss_type="grpo", loss_agg_mode="token-mean"), r"means loss_agg_mode='seq-mean-token-mean'"),
])
def test_grpo_fields_rloo_does_not_have_are_refused_as_grpo_s(tmp_path, given, message):
    with pytest.raises(ConfigError, match=message):
        RLOOConfig(output_dir=str(tmp_path / "run"), **given)


def test_the_defaults_that_differ_are_announced_once_for_a_ported_grpo_config(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(grpo_fields, "_announced", set())
    with caplog.at_level(logging.WARNING, logger="rloo.compat.grpo_fields"):
        RLOOConfig(output_dir=str(tmp_path / "run"))  # nothing of GRPO's: an RLOO config, nothing said
        assert not caplog.records
        RLOOConfig(output_dir=str(tmp_path / "run"), loss_type="dapo", num_generations=8)
        RLOOConfig(output_dir=str(tmp_path / "run"), loss_type="dapo", num_generations=8)
    [record] = caplog.records
    text = record.getMessage()
    assert "beta: 0.05 (GRPOConfig: 0.0)" in text and "max_completion_length: 256 (GRPOConfig: 512)" in text
    assert "gradient_checkpointing: False (GRPOConfig: True)" in text and "sequence_mask" in text
    assert "num_generations" not in text and "loss_agg_mode" not in text  # given, or set by loss_type


def test_the_docs_tables_are_the_code_s():
    text = DOC.read_text(encoding="utf-8")
    assert grpo_table_markdown() in text and defaults_table_markdown() in text

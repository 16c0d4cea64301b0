"""`rloo demo` run twice in a row works: the demo owns its output folder (and only a demo's)."""

import pytest

import rloo.toy.demo as demo
from rloo.config import ConfigError
from rloo.toy import build_char_tokenizer, build_tiny_model
from rloo.toy.warm_start import DEMO_WARM_START


@pytest.fixture
def quick_demo(monkeypatch):
    """The demo with a tiny untrained model instead of the cached warm start (minutes on first use)."""
    def tiny(cache_dir, seed=0, **kwargs):
        assert kwargs == DEMO_WARM_START  # the demo's smaller, faster warm start, whose typical steps are known
        tokenizer = build_char_tokenizer()
        return build_tiny_model(tokenizer, seed=seed, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                intermediate_size=64), tokenizer

    monkeypatch.setattr(demo, "warm_started_addition_model", tiny)
    def no_report(output_dir):
        raise ImportError("no report in this test")

    monkeypatch.setattr("rloo.run.report.build_report", no_report)
    return lambda out: demo.main(["--output_dir", str(out), "--episodes", "16", "--batch_size", "8",
                                  "--num_generations", "4", "--num_eval", "4"])


def test_demo_twice_in_a_row(tmp_path, quick_demo, capsys):
    out = tmp_path / "demo"
    first = quick_demo(out)
    rows = (out / "metrics.jsonl").read_text().splitlines()
    second = quick_demo(out)
    assert first["episodes"] == second["episodes"] == 16
    assert "replacing the earlier demo run" in capsys.readouterr().out
    assert len((out / "metrics.jsonl").read_text().splitlines()) == len(rows)  # one run's rows, not two


def test_demo_leaves_another_runs_folder_alone(tmp_path, quick_demo):
    out = tmp_path / "someone_elses_run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ConfigError, match="holds another run's files"):
        quick_demo(out)
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n' and not (out / demo.MARKER).exists()

"""The console: a short table of the metrics a person watches, printed above the progress bar."""

from rloo.run.console import console_columns, metrics_table, render


def test_training_log_shows_the_key_metrics_only():
    metrics = {"reward": 0.5, "reward_std": 0.25, "objective/kl": 0.01, "objective/entropy": 2.0,
               "completions/mean_length": 12.0, "policy/clipfrac_avg": 0.1, "lr": 1e-5, "eps": 40.0,
               "val/ratio_var": 0.3, "loss/policy_avg": -0.2, "rewards/f/mean": 0.5}
    assert list(console_columns(metrics)) == ["reward", "spread", "KL", "entropy", "length", "clip frac", "lr",
                                              "episodes/s"]
    text = render(metrics_table(metrics, 7))
    assert len(text.splitlines()) <= 4 and max(len(line) for line in text.splitlines()) <= 120
    assert "val/ratio_var" not in text and "1e-05" in text


def test_eval_log_shows_short_names_with_pass_at_k():
    metrics = {"eval/reward": 0.5, "eval/reward_std": 0.1, "eval/completions/mean_length": 3.0,
               "eval/completions/min_length": 1.0, "eval/completions/clipped_ratio": 0.0,
               "eval/rewards/acc/mean": 0.5, "eval/rewards/acc/pass@1": 0.5, "eval/rewards/acc/pass@4": 0.9}
    assert list(console_columns(metrics)) == ["eval/reward", "spread", "length", "truncated", "acc pass@1",
                                              "acc pass@4"]
    assert "…" not in render(metrics_table(metrics, 3))


def test_tables_go_through_tqdm_write_so_the_progress_bar_is_redrawn_below(tmp_path, monkeypatch, capsys):
    import torch
    from accelerate import Accelerator

    from rloo.run import metrics as metrics_module

    written = []
    monkeypatch.setattr(metrics_module.tqdm, "write", lambda text, *a, **k: written.append(text))
    logger = metrics_module.MetricsLogger(Accelerator(cpu=True), tmp_path, "none")
    logger.log({"reward": 0.5}, step=1)
    rows = metrics_module.completion_rows(["p"], ["c"], ["f"], torch.tensor([[1.0]]), [1.0], [0.5], 1, 4)
    logger.log_completions(rows, step=1)
    assert len(written) == 2 and "reward" in written[0] and "Sample completions at step 1" in written[1]
    assert capsys.readouterr().out == ""  # nothing printed around the bar

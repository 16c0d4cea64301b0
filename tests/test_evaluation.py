"""Eval: pass@k against hand values, the eval metrics of a known batch, and eval during training."""

import json
import math

import pytest
import torch

from conftest import digit_fraction
from rloo import ConfigError, RLOOConfig, RLOOTrainer
from rloo.evaluation import eval_metrics, pass_at_k, pass_at_k_values


@pytest.mark.parametrize("n,c,k,expected", [
    (4, 1, 1, 1 / 4),
    (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
    (4, 2, 2, 1 - 1 / 6),  # 1 - C(2,2)/C(4,2)
    (4, 0, 3, 0.0),
    (3, 2, 2, 1.0),  # n - c < k: every draw of 2 holds a correct one
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    (5, 5, 5, 1.0),
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, torch.tensor([c]), k).item() == pytest.approx(expected, abs=1e-12)


def test_pass_at_1_is_the_fraction_correct_and_k_must_fit_n():
    correct = torch.tensor([0, 1, 2, 3, 7, 8])
    torch.testing.assert_close(pass_at_k(8, correct, 1), correct.double() / 8)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, correct, 5)
    assert pass_at_k_values(8) == [1, 2, 4, 8] and pass_at_k_values(6) == [1, 2, 4, 6] and pass_at_k_values(1) == [1]


def test_eval_metrics_of_a_hand_batch():
    # 2 prompts x 4 samples; one 0/1 function and one graded function (NaN: did not apply).
    correct = torch.tensor([[1.0, 0, 0, 0], [1, 1, 0, float("nan")]])
    graded = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.2, 0.4, 0.6, 0.8]])
    scores = torch.nan_to_num(correct) + graded
    lengths = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    truncated = torch.tensor([[False, False, False, True], [False, False, True, True]])
    m = eval_metrics(scores, torch.stack([correct, graded], dim=-1), ["acc", "graded"], lengths, truncated)
    assert m["eval/reward"] == pytest.approx(scores.mean().item())
    assert m["eval/completions/mean_length"] == 4.5 and m["eval/completions/min_length"] == 1
    assert m["eval/completions/max_length"] == 8 and m["eval/completions/clipped_ratio"] == 3 / 8
    assert m["eval/rewards/acc/mean"] == pytest.approx(3 / 7)
    assert m["eval/rewards/acc/pass@1"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert m["eval/rewards/acc/pass@2"] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)
    assert m["eval/rewards/acc/pass@4"] == pytest.approx(1.0)
    assert not any(key.startswith("eval/rewards/graded/pass") for key in m)  # not correct/incorrect
    assert "eval/pass@1" not in m  # the weighted sum is not 0/1 either
    assert m["eval/reward_std"] == pytest.approx(scores.std(dim=1).mean().item())


def test_num_generations_eval_is_validated_naming_the_field():
    with pytest.raises(ConfigError, match="num_generations_eval"):
        RLOOConfig(num_generations_eval=0)


def exact_digit(completions, **kwargs):
    """1 when the completion starts with a digit: a correct/incorrect reward."""
    return [float(c[:1].isdigit()) for c in completions]


def test_eval_every_eval_steps_is_logged_once_per_step_with_pass_at_k(tmp_path, make_model, tokenizer, digit_dataset):
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=2,
                      num_generations_eval=4, max_completion_length=4, max_steps=4, logging_steps=1, save_steps=0,
                      eval_steps=2, seed=0)
    trainer = RLOOTrainer(make_model(), [exact_digit, digit_fraction], args=args, train_dataset=digit_dataset,
                          eval_dataset=digit_dataset.select(range(6)), processing_class=tokenizer)
    final = trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [line for line in lines if "eval/reward" in line]
    assert [line["step"] for line in evals] == [2, 4]  # the last step's eval is not repeated after the loop
    for name in ("eval/reward", "eval/reward_std", "eval/completions/mean_length", "eval/completions/clipped_ratio",
                 "eval/rewards/exact_digit/mean", "eval/rewards/exact_digit/pass@1", "eval/rewards/exact_digit/pass@2",
                 "eval/rewards/exact_digit/pass@4", "eval/rewards/digit_fraction/mean"):
        assert name in evals[-1] and math.isfinite(evals[-1][name]), name
    assert "eval/rewards/exact_digit/pass@8" not in evals[-1]
    assert evals[-1]["eval/rewards/exact_digit/pass@1"] <= evals[-1]["eval/rewards/exact_digit/pass@4"]
    assert final["eval/reward"] == evals[-1]["eval/reward"]
    assert not (tmp_path / "run" / "eval_completions.jsonl").exists()  # log_completions is off


def test_eval_completions_are_written_with_log_completions(tmp_path, make_model, tokenizer, digit_dataset):
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=2,
                      num_generations_eval=2, max_completion_length=4, max_steps=2, logging_steps=1, save_steps=0,
                      eval_steps=1, seed=0, log_completions=True)
    trainer = RLOOTrainer(make_model(), [exact_digit, digit_fraction], args=args, train_dataset=digit_dataset,
                          eval_dataset=digit_dataset.select(range(3)), processing_class=tokenizer)
    trainer.train()
    samples = [json.loads(line) for line in (tmp_path / "run" / "eval_completions.jsonl").read_text().splitlines()]
    assert [(row["step"], row["index"], row["sample"]) for row in samples] == \
        [(step, i, k) for step in (1, 2) for i in range(3) for k in range(2)]
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if "eval/reward" in line]
    for step, figures in zip((1, 2), evals):
        rows = [row for row in samples if row["step"] == step]
        assert [row["prompt"] for row in rows] == [digit_dataset[i]["prompt"] for i in range(3) for _ in range(2)]
        assert sum(row["digit_fraction"] for row in rows) / 6 == pytest.approx(figures["eval/rewards/digit_fraction/mean"])
        assert sum(row["score"] for row in rows) / 6 == pytest.approx(figures["eval/reward"])
        for row in rows:  # each value is the reward of that very completion
            assert row["digit_fraction"] == pytest.approx(digit_fraction([row["completion"]])[0])


def _saved_model(tmp_path, make_model, tokenizer):
    model_dir = tmp_path / "model"
    make_model().save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir


def _rows(path, numbers):
    path.write_text("\n".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) for a in numbers))


def _eval_config(tmp_path, data):
    import textwrap

    (tmp_path / "run.yaml").write_text(textwrap.dedent(f"""\
        dataset_name: {data}
        reward_funcs: [exact_match]
        output_dir: {tmp_path / "out"}
        per_device_train_batch_size: 8
        num_generations: 2
        num_generations_eval: 4
        max_completion_length: 3
        """))
    return str(tmp_path / "run.yaml")


def test_rloo_eval_cli_on_a_saved_model(tmp_path, make_model, tokenizer, capsys):
    from rloo.cli import main

    model_dir = _saved_model(tmp_path, make_model, tokenizer)
    data = tmp_path / "prompts.jsonl"
    _rows(data, range(6))
    main(["eval", "--model", str(model_dir), "--config", _eval_config(tmp_path, data)])
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert results["model"] == str(model_dir) and results["split"] == "train"
    assert (results["prompts"], results["num_generations"]) == (6, 4)
    for name in ("eval/reward", "eval/rewards/exact_match/pass@1", "eval/rewards/exact_match/pass@4",
                 "eval/completions/clipped_ratio"):
        assert 0.0 <= results[name] <= 3.0, name
    assert not any(key.startswith("eval_") for key in results)  # one spelling of each figure
    captured = capsys.readouterr()
    assert f"{data} [train]: 6 prompts x 4 completions (num_generations_eval) = 24 samples" in captured.out
    # A single file has no held-out split: scoring the training split is said loudly.
    assert "WARNING: scoring 'train', the split this config trains on" in captured.err
    assert "has no 'test' or 'validation' split" in captured.err
    assert "eval (4 completions each)" in captured.err and "prompt/s" in captured.err  # the progress bar
    printed = [line.split()[0] for line in captured.out.splitlines() if line.startswith("eval")]
    assert "eval/rewards/exact_match/pass@4" in printed and "eval/reward" in printed
    assert len(printed) == len(set(printed)) and not any(name.startswith("eval_") for name in printed)  # once each
    assert not (tmp_path / "out" / "metrics.jsonl").exists()  # nothing trained, nothing logged as training
    # Every sample, in the data's order, with the rewards the figures were computed from.
    samples = [json.loads(line) for line in (tmp_path / "out" / "eval_samples.jsonl").read_text().splitlines()]
    assert [(row["index"], row["sample"]) for row in samples] == [(i, k) for i in range(6) for k in range(4)]
    assert [row["prompt"] for row in samples[::4]] == [f"{a}+{a}=" for a in range(6)]
    assert all(isinstance(row["completion"], str) and row["step"] == 0 for row in samples)
    assert sum(row["exact_match"] for row in samples) / 24 == pytest.approx(results["eval/rewards/exact_match/mean"])
    assert [row["score"] for row in samples] == [row["exact_match"] for row in samples]  # one function, weight 1


def test_rloo_eval_prefers_the_held_out_split_and_caps_the_prompts(tmp_path, make_model, tokenizer, capsys):
    from rloo.cli import main

    model_dir = _saved_model(tmp_path, make_model, tokenizer)
    data = tmp_path / "data"
    data.mkdir()
    _rows(data / "train.jsonl", range(8))
    _rows(data / "test.jsonl", range(20, 25))
    main(["eval", "--model", str(model_dir), "--config", _eval_config(tmp_path, data), "--max_eval_samples", "3"])
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert (results["split"], results["prompts"]) == ("test", 3)
    captured = capsys.readouterr()
    assert f"{data} [test]: the first 3 of 5 prompts (max_eval_samples) x 4 completions" in captured.out
    assert "WARNING" not in captured.err
    main(["eval", "--model", str(model_dir), "--config", _eval_config(tmp_path, data), "--eval_split", "train"])
    assert json.loads((tmp_path / "out" / "eval_results.json").read_text())["prompts"] == 8
    assert "WARNING: scoring 'train'" in capsys.readouterr().err  # chosen, but still the training rows


def test_max_eval_samples_must_keep_a_prompt(tmp_path):
    from rloo.cli import parse_train_args

    with pytest.raises(ConfigError, match="max_eval_samples must be at least 1"):
        parse_train_args(["--max_eval_samples", "0"])


def test_a_signal_during_rloo_eval_says_it_stopped_an_evaluation(tmp_path, make_model, tokenizer, capsys,
                                                                 monkeypatch):
    import os
    import signal

    from rloo import evaluation
    from rloo.cli import main

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal should have stopped the evaluation")

    monkeypatch.setattr(evaluation, "evaluate", signalled)
    model_dir = _saved_model(tmp_path, make_model, tokenizer)
    data = tmp_path / "prompts.jsonl"
    _rows(data, range(4))
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--model", str(model_dir), "--config", _eval_config(tmp_path, data)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 143 and "Traceback" not in err
    assert "stopped by SIGTERM during evaluation; no eval_results.json was written" in err
    assert "training" not in err.splitlines()[-1]
    assert not (tmp_path / "out" / "eval_results.json").exists()


def test_eval_gives_reward_functions_trls_log_extra_and_log_metric(tmp_path, make_model, tokenizer, digit_dataset):
    calls = []

    def logging_reward(completions, log_extra, log_metric, **kwargs):
        log_extra("chars", [len(c) for c in completions])
        log_metric("calls", 1.0)
        calls.append(len(completions))
        return [1.0] * len(completions)

    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=4, max_steps=1, save_steps=0, seed=0)
    trainer = RLOOTrainer(make_model(), logging_reward, args=args, train_dataset=digit_dataset,
                          eval_dataset=digit_dataset.select(range(2)), processing_class=tokenizer)
    assert trainer.evaluate()["eval/reward"] == 1.0
    assert calls == [8]  # 2 eval prompts x K=4, scored together

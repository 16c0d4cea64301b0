"""Where train() leaves the trained model: in output_dir, except under TRL's save_strategy="no", which
(as in TRL) writes no weights until save_model is called; `rloo train` saves it either way, as TRL's script."""

import json

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.cli import main


def _trainer(tmp_path, make_model, tokenizer, digit_dataset, **overrides):
    args = RLOOConfig(**{**dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                                max_completion_length=4, max_steps=1, logging_steps=1, save_steps=0, seed=0),
                         **overrides})
    return RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)


def test_save_strategy_no_writes_no_weights_until_save_model(tmp_path, make_model, tokenizer, digit_dataset):
    trainer = _trainer(tmp_path, make_model, tokenizer, digit_dataset, save_strategy="no")
    trainer.train()
    run = tmp_path / "run"
    assert (run / "metrics.jsonl").exists()
    assert not list(run.glob("*.safetensors")) and not list(run.glob("checkpoint-*"))
    trainer.save_model()
    assert (run / "model.safetensors").exists() and (run / "config.json").exists()


def test_train_writes_the_final_model_by_default_and_with_save_steps_0(tmp_path, make_model, tokenizer, digit_dataset):
    _trainer(tmp_path, make_model, tokenizer, digit_dataset).train()
    assert (tmp_path / "run" / "model.safetensors").exists()


def test_rloo_train_saves_the_model_under_save_strategy_no(tmp_path, make_model, tokenizer, capsys):
    tiny_model_dir = str(tmp_path / "model")
    make_model().save_pretrained(tiny_model_dir)
    tokenizer.save_pretrained(tiny_model_dir)
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{a}+{a}="}) for a in range(8)))
    main(["train", "--model_name_or_path", tiny_model_dir, "--dataset_name", str(data), "--reward_funcs",
          "conftest.digit_fraction", "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
          "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "4",
          "--save_strategy", "no", "--report_to", "none"])
    assert (tmp_path / "out" / "model.safetensors").exists()
    assert "Saved the trained model" in capsys.readouterr().out

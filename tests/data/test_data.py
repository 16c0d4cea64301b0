"""Datasets and prompts: local file types, conversational prompts, chat_template_kwargs, clear errors."""

import copy
import json
import logging

import pytest
from datasets import Dataset

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.data.loading import load_prompt_dataset
from rloo.data.prompts import tokenize_prompts
from rloo.toy import CHAT_TEMPLATE

ROWS = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(4)]


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=4, beta=0.0, max_steps=1, logging_steps=1, save_steps=0, seed=0)
    return RLOOConfig(**{**values, **overrides})


@pytest.mark.parametrize("suffix", ["json", "jsonl", "csv", "parquet"])
def test_local_files_of_every_type_load(tmp_path, suffix):
    path = tmp_path / f"prompts.{suffix}"
    frame = Dataset.from_list(ROWS)
    if suffix == "json":
        path.write_text(json.dumps(ROWS))
    elif suffix == "jsonl":
        frame.to_json(str(path))
    elif suffix == "csv":
        frame.to_csv(str(path), index=False)
    else:
        frame.to_parquet(str(path))
    loaded = load_prompt_dataset(str(path))
    assert loaded["prompt"] == [row["prompt"] for row in ROWS]
    assert [str(a) for a in loaded["answer"]] == [row["answer"] for row in ROWS]  # csv reads numbers as numbers


def test_save_to_disk_directory_and_missing_file(tmp_path):
    Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    assert len(load_prompt_dataset(str(tmp_path / "saved"))) == 4
    with pytest.raises(FileNotFoundError, match="does not exist locally"):
        load_prompt_dataset(str(tmp_path / "missing.jsonl"))


def _thinking_tokenizer(tokenizer):
    """The toy tokenizer with a template that reacts to enable_thinking, as Qwen3's does."""
    copied = copy.deepcopy(tokenizer)
    copied.chat_template = CHAT_TEMPLATE + "{% if enable_thinking is defined and not enable_thinking %}</think>{% endif %}"
    return copied


def test_conversational_prompts_use_the_chat_template_with_its_kwargs(tokenizer):
    thinking = _thinking_tokenizer(tokenizer)
    conversation = [{"role": "system", "content": "add"}, {"role": "user", "content": "1+1="}]
    decode = lambda ids: thinking.decode(ids[0])  # noqa: E731
    assert decode(tokenize_prompts([conversation], thinking, 100)) == "system: add\nuser: 1+1=\nassistant: "
    assert decode(tokenize_prompts([conversation], thinking, 100, {"enable_thinking": False})).endswith("assistant: </think>")
    assert decode(tokenize_prompts(["1+1="], thinking, 100, {"enable_thinking": False})) == "1+1="  # plain: as written
    assert decode(tokenize_prompts(["0123456789"], thinking, 4)) == "6789"  # left truncation keeps the end


def test_conversational_rows_reach_rewards_as_messages(tmp_path, make_model, tokenizer):
    seen = {}

    def record(prompts, completions, answer):
        seen.update(prompts=prompts, completions=completions, answer=answer)
        return [float(len(c[0]["content"])) for c in completions]

    rows = [{"prompt": [{"role": "user", "content": f"{a}+{a}="}], "answer": str(2 * a)} for a in range(4)]
    thinking = _thinking_tokenizer(tokenizer)
    trainer = RLOOTrainer(make_model(), record, args=_config(tmp_path, chat_template_kwargs={"enable_thinking": False}),
                          train_dataset=Dataset.from_list(rows), processing_class=thinking)
    rollout, samples = trainer.collector.collect(rows[:2], trainer.global_step, trainer.episode)
    first_prompt = thinking.decode(rollout.prompt_ids[0][rollout.prompt_mask[0].bool()])
    assert first_prompt == "user: 0+0=\nassistant: </think>"  # template and its kwargs applied
    assert seen["prompts"][0] == rows[0]["prompt"] and seen["answer"] == ["0"] * 4 + ["2"] * 4
    assert all(c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) and len(c) == 1
               for c in seen["completions"])
    assert [c[0]["content"] for c in seen["completions"]] == samples.completions


@pytest.mark.parametrize("chunk", [None, 2])  # 2: the long rows 3 and 4 lie in different tokenizer calls
def test_long_prompts_warn_once_with_a_count_or_fail_naming_the_row(tmp_path, make_model, tokenizer, caplog,
                                                                    monkeypatch, chunk):
    if chunk:
        monkeypatch.setattr("rloo.data.prompts._LENGTH_CHUNK", chunk)
    rows = [{"prompt": "1+1="}] * 3 + [{"prompt": "9" * 30}, {"prompt": "8" * 20}] + [{"prompt": "2+2="}] * 3
    dataset = Dataset.from_list(rows)
    with caplog.at_level(logging.WARNING, logger="rloo.prompts"):
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_prompt_length=10),
                    train_dataset=dataset, processing_class=tokenizer)
    warnings = [r.getMessage() for r in caplog.records if "max_prompt_length" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("2 of 8 prompts in train_dataset") and "row 3 has 30" in warnings[0]
    with pytest.raises(ValueError, match=r"train_dataset row 3 has a prompt of 30 tokens, more than max_prompt_length=10 "
                                         r"\(2 rows are too long\)"):
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_prompt_length=10, truncate_prompts="error"),
                    train_dataset=dataset, processing_class=tokenizer)


def test_prompts_are_not_truncated_by_default_as_in_trl(tmp_path, make_model, tokenizer, caplog):
    """max_prompt_length is an opt-in (TRL's RLOOConfig has no prompt truncation): by default a prompt longer than
    rloo's old limit of 512 tokens reaches the sampler whole, with no warning."""
    rows = [{"prompt": "9" * 600}] * 2 + [{"prompt": "1+1="}] * 2
    with caplog.at_level(logging.WARNING, logger="rloo.prompts"):
        trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), train_dataset=Dataset.from_list(rows),
                              processing_class=tokenizer)
    assert trainer.args.max_prompt_length is None and not [r for r in caplog.records if "max_prompt_length" in r.getMessage()]
    rollout, _ = trainer.collector.collect(rows[:2], trainer.global_step, trainer.episode)
    assert int(rollout.prompt_mask[0].sum()) == len(tokenizer("9" * 600)["input_ids"]) > 512


def test_dataset_errors_are_clear(tmp_path, make_model, tokenizer, digit_dataset):
    with pytest.raises(ValueError, match="train_dataset is empty"):
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), processing_class=tokenizer,
                    train_dataset=Dataset.from_dict({"prompt": [], "answer": []}))
    with pytest.raises(ValueError, match="eval_dataset has no 'prompt' column"):
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), processing_class=tokenizer,
                    train_dataset=digit_dataset, eval_dataset=digit_dataset.rename_column("prompt", "question"))
    with pytest.raises(ValueError, match="row 1: 'prompt' must be a string or a list of"):
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), processing_class=tokenizer,
                    train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}, {"prompt": []}]))

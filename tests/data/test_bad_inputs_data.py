"""Datasets and models that do not fit together are refused before any weights load or any step runs,
each with one sentence naming the row (or the sizes) and the fix."""

import pytest
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer
from rloo.config_checks import ConfigError


def _reward(completions, **kwargs):
    return [0.0] * len(completions)


def _trainer(tmp_path, model, tokenizer, rows, as_list=False, **overrides):
    args = RLOOConfig(**{**dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                                max_completion_length=4, max_steps=1, save_steps=0, report_to="none"), **overrides})
    dataset = rows if as_list else Dataset.from_list(rows)
    return RLOOTrainer(model, _reward, args=args, train_dataset=dataset, processing_class=tokenizer)


def _chat(role="user", content="2+2="):
    return {"prompt": [{"role": role, "content": content}]}


@pytest.mark.parametrize("rows, pattern", [
    ([_chat(content=None)] * 4, r"row 0, message 0: 'content' is NoneType, not a string"),
    ([_chat(), _chat(role="wizard")] * 2, r"row 1, message 0: unknown role 'wizard'.*one of"),
    ([{"prompt": "1+1="}, {"prompt": ""}] * 2, r"row 1: the prompt is an empty string"),
])
def test_malformed_prompts_are_named_by_row(tmp_path, make_model, tokenizer, rows, pattern):
    with pytest.raises(ConfigError, match=pattern):
        _trainer(tmp_path, make_model(), tokenizer, rows)


def test_a_model_with_fewer_embeddings_than_the_tokenizer_is_refused(tmp_path, make_model, tokenizer):
    model = make_model()
    model.resize_token_embeddings(len(tokenizer) - 3)
    with pytest.raises(ConfigError, match=rf"tokenizer has {len(tokenizer)} tokens but .* {len(tokenizer) - 3} rows"):
        _trainer(tmp_path, model, tokenizer, [{"prompt": "1+1="}] * 4)


def test_a_list_of_dicts_is_converted_with_a_warning(tmp_path, make_model, tokenizer, caplog):
    with caplog.at_level("WARNING"):
        trainer = _trainer(tmp_path, make_model(), tokenizer, [{"prompt": "1+1=", "answer": "2"}] * 4,
                           as_list=True)
    assert trainer.train_dataset.column_names == ["prompt", "answer"]
    assert "a list of 4 rows" in caplog.text and "Dataset.from_list" in caplog.text


def test_a_reward_that_is_not_a_function_is_refused_before_loading(tmp_path, tokenizer):
    args = RLOOConfig(output_dir=str(tmp_path / "run"), report_to="none")
    with pytest.raises(ConfigError, match=r"reward_funcs holds 5 \(int\); each entry must be a function"):
        RLOOTrainer(str(tmp_path / "never" / "loaded"), 5, args=args,
                    train_dataset=Dataset.from_list([{"prompt": "1+1="}]), processing_class=tokenizer)


def test_a_split_the_data_does_not_have_is_refused(tmp_path):
    from rloo.data.loading import load_prompt_dataset

    single = tmp_path / "rows.jsonl"
    single.write_text('{"prompt": "1+1="}\n')
    with pytest.raises(ConfigError, match=r"single file, so its only split is 'train', not 'test'"):
        load_prompt_dataset(str(single), "test")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"prompt": "1+1="}\n')
    assert len(load_prompt_dataset(str(folder), "train")) == 1
    with pytest.raises(ConfigError, match=r"has no split 'validation'.*train"):
        load_prompt_dataset(str(folder), "validation")


def test_a_reward_model_path_that_does_not_exist_is_named(tmp_path, make_model, tokenizer):
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=4, max_steps=1, save_steps=0, report_to="none")
    with pytest.raises(ConfigError, match=r"reward model path './nonexistent/rm' does not exist"):
        RLOOTrainer(make_model(), "./nonexistent/rm", args=args, processing_class=tokenizer,
                    train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 4))

"""max_prompt_length sees the prompt as the model does: the tool schemas and the environment's reset() text
included. No silent cut: by default (None) nothing is truncated; "error" names the trajectory's prompt at the step
it appears; "left" cuts with a warning (once)."""

import logging

import pytest
from datasets import Dataset
from tool_chat import ScriptedSampler, tool_tokenizer

from rloo import RLOOConfig, RLOOTrainer
from rloo.config import ConfigError
from rloo.toy import build_tiny_model


class Library:
    """An environment whose reset() adds a long task text to the prompt."""

    def reset(self, **row):
        return " Read this first: " + "lorem ipsum " * 20

    def lookup(self, word: str) -> str:
        """Look a word up.

        Args:
            word: the word
        """
        return word.upper()


def _trainer(tmp_path, **overrides):
    tokenizer = tool_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=32)
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=2, num_generations=2,
                  max_completion_length=20, learning_rate=1e-2, beta=0.0, max_steps=1, logging_steps=1, save_steps=0,
                  seed=0, overwrite_output_dir=True)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Find it."}]}])
    sampler = ScriptedSampler(tokenizer, lambda text, row: "done")
    trainer = RLOOTrainer(model=model, args=RLOOConfig(**{**values, **overrides}), train_dataset=dataset,
                          processing_class=tokenizer, sampler=sampler, environment_factory=Library,
                          reward_funcs=[lambda completions, **kw: [1.0] * len(completions)])
    return trainer, sampler, tokenizer


def test_without_a_limit_the_whole_prompt_is_sampled_from(tmp_path):
    trainer, sampler, tokenizer = _trainer(tmp_path)
    trainer.collector.collect(trainer.train_dataset.to_list())
    text = tokenizer.decode(sampler.calls[0][0])
    assert text.startswith("system: tools lookup") and "lorem ipsum " * 20 in text


def test_a_prompt_over_the_limit_with_its_schemas_and_reset_text_is_an_error_naming_it(tmp_path):
    """The dataset's prompt alone fits (the construction check passes); with the schemas and reset's text it does
    not: the first collect stops, naming the trajectory, its prompt and its environment."""
    trainer, sampler, _ = _trainer(tmp_path, max_prompt_length=60, truncate_prompts="error")
    with pytest.raises(ConfigError, match=r"the prompt of trajectory 0 \('Find it\. Read this first.*\) is \d+ tokens "
                                          r"as the model sees it .*max_prompt_length=60"):
        trainer.collector.collect(trainer.train_dataset.to_list())
    assert sampler.calls == []


def test_truncation_left_is_warned_once(tmp_path, caplog):
    trainer, sampler, tokenizer = _trainer(tmp_path, max_prompt_length=60)
    with caplog.at_level(logging.WARNING, logger="rloo.rollout.multi_turn"):
        trainer.collector.collect(trainer.train_dataset.to_list())
        trainer.collector.collect(trainer.train_dataset.to_list())
    warnings = [r for r in caplog.records if "longer than max_prompt_length=60" in r.getMessage()]
    assert len(warnings) == 1 and "2 of 2 prompts" in warnings[0].getMessage()
    assert all(len(prompt) == 60 for call in sampler.calls for prompt in call)
    assert not tokenizer.decode(sampler.calls[0][0]).startswith("system: tools")  # what the cut drops

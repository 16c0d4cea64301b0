"""log_level quiets the libraries' progress bars by default and shows them on request, with the real
transformers and datasets printing (or not) their "Loading weights" and "Generating train split" bars."""

import logging

import datasets
import huggingface_hub.utils
import pytest
import transformers

from rloo import ConfigError, RLOOConfig, RLOOTrainer
from rloo.run.verbosity import set_library_verbosity


@pytest.fixture(autouse=True)
def restore_library_defaults():
    yield
    transformers.utils.logging.enable_progress_bar()
    transformers.utils.logging.set_verbosity_warning()
    datasets.enable_progress_bars()
    datasets.utils.logging.set_verbosity_warning()
    huggingface_hub.utils.enable_progress_bars()
    logging.getLogger("rloo").setLevel(logging.NOTSET)


def bars() -> tuple[bool, bool, bool]:
    return (transformers.utils.logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled(),
            not huggingface_hub.utils.are_progress_bars_disabled())


def test_the_default_is_passive_and_a_bad_level_is_refused():
    assert RLOOConfig().log_level == "passive"
    with pytest.raises(ConfigError, match="log_level must be one of"):
        RLOOConfig(log_level="loud")


def test_each_level_sets_the_bars_and_the_loggers():
    set_library_verbosity("passive")
    assert bars() == (False, False, True)  # Hub downloads keep their bars
    assert transformers.utils.logging.get_verbosity() == logging.WARNING  # passive leaves levels alone
    set_library_verbosity("info")
    assert bars() == (True, True, True)
    assert transformers.utils.logging.get_verbosity() == logging.INFO
    assert datasets.utils.logging.get_verbosity() == logging.INFO and logging.getLogger("rloo").level == logging.INFO
    set_library_verbosity("error")
    assert bars() == (False, False, False)
    assert transformers.utils.logging.get_verbosity() == logging.ERROR


def load_save_and_read(model_dir, rows_file):
    transformers.AutoModelForCausalLM.from_pretrained(model_dir).save_pretrained(model_dir.parent / "saved")
    datasets.load_dataset("json", data_files=str(rows_file), split="train", cache_dir=str(rows_file.parent / "cache"))


@pytest.mark.parametrize("level, printed", [("passive", False), ("info", True)])
def test_loading_and_saving_a_model_and_reading_data_print_bars_only_when_asked(level, printed, tmp_path, make_model, capfd):
    make_model().save_pretrained(tmp_path / "model")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1="}\n')
    set_library_verbosity(level)
    capfd.readouterr()
    load_save_and_read(tmp_path / "model", rows)
    err = capfd.readouterr().err
    shown = ("Loading weights" in err, "Writing model shards" in err, "Generating train split" in err)
    assert shown == (printed,) * 3, err


def test_the_trainer_applies_its_config(tmp_path, make_model, tokenizer, digit_dataset):
    from conftest import digit_fraction

    args = RLOOConfig(output_dir=str(tmp_path), log_level="error", max_steps=1, per_device_train_batch_size=4,
                      num_generations=2)
    RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=digit_dataset, processing_class=tokenizer)
    assert bars() == (False, False, False)

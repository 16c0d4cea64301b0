"""TRL's own RLOO scripts, ported by changing their imports, on a local tiny model and dataset.

`trl/scripts/rloo.py` is read from the installed trl package at test time (trl is in the `dev`
extra for this), its `from trl ...` imports are changed to `from rloo ...`, and it runs as
`__main__` with flags and a `--config` YAML. The example script below follows TRL's
`examples/scripts/rloo.py` (NuminaMath, LoRA, vLLM), written out here with the import changed,
the Hub model and dataset replaced by local tiny ones and the sizes shrunk so that it runs in seconds.
Every option they pass is honoured or refused with a named reason.
"""

import dataclasses
import importlib.util
import json
import logging
import os
import re
import runpy
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from rloo import (
    ConfigError,
    DatasetMixtureConfig,
    ModelConfig,
    RLOOConfig,
    ScriptArguments,
    TrlParser,
    get_dataset,
    get_kbit_device_map,
    get_peft_config,
    get_quantization_config,
)
from rloo.cli import main

EXAMPLE_SCRIPT = '''
import torch
from peft import LoraConfig

from rloo import RLOOConfig, RLOOTrainer
from rloo.rewards import accuracy_reward, think_format_reward

SYSTEM_PROMPT = "The assistant thinks inside <think></think> tags, then answers."

def make_conversation(example):
    return {"prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                       {"role": "user", "content": example["problem"]}]}

train_dataset = raw_train.map(make_conversation, remove_columns=["problem"])
eval_dataset = raw_eval.map(make_conversation, remove_columns=["problem"])

training_args = RLOOConfig(
    output_dir=OUTPUT_DIR,
    model_init_kwargs={"dtype": torch.bfloat16},
    learning_rate=1e-5,
    log_completions=True,
    num_completions_to_print=2,
    max_completion_length=8,
    gradient_accumulation_steps=2,
    steps_per_generation=8,
    use_vllm=True,
    vllm_mode="colocate",
    vllm_gpu_memory_utilization=0.5,
    run_name="tiny-RLOO",
    per_device_train_batch_size=4,
    max_steps=4,
    save_steps=0,
)

trainer = RLOOTrainer(
    model=MODEL,
    args=training_args,
    reward_funcs=[think_format_reward, accuracy_reward],
    train_dataset=train_dataset,
    eval_dataset=eval_dataset,
    peft_config=LoraConfig(),
)
trainer.train()
trainer.save_model(training_args.output_dir)
trainer.push_to_hub(dataset_name="local/tiny-math")
'''


@pytest.fixture
def tiny_model_dir(tmp_path, make_model, tokenizer):
    model_dir = tmp_path / "model"
    make_model().save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return str(model_dir)


def _math(n):
    return Dataset.from_list([{"problem": f"{a}+{a}?", "solution": str(2 * a)} for a in range(n)])


def test_trl_example_script_refuses_vllm_by_name_then_runs_without_it(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    names = {"raw_train": _math(16), "raw_eval": _math(4), "MODEL": tiny_model_dir, "OUTPUT_DIR": str(tmp_path / "out")}
    # use_vllm=True maps to sampler="vllm", which needs vLLM in this process (not installed here).
    with pytest.raises(ConfigError, match="use_vllm=True means sampler='vllm'.*needs vLLM"):
        exec(EXAMPLE_SCRIPT, dict(names))
    # What the error says to do: drop the vLLM options (vllm_mode="colocate" is TRL's default and harmless).
    script = EXAMPLE_SCRIPT.replace("    use_vllm=True,\n", "").replace("    vllm_gpu_memory_utilization=0.5,\n", "")
    with pytest.raises(RuntimeError, match="HF_HUB_OFFLINE"):  # the last line pushes: offline, it says so
        exec(script, dict(names))
    out = tmp_path / "out"
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    # logging_steps is TRL's default 10: the last step logs
    assert steps[0] == 4 and any("eval/reward" in json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines())
    assert (out / "adapter_config.json").exists() and "local/tiny-math" in (out / "README.md").read_text()


def test_trl_rloo_script_flags_and_body(tmp_path, tiny_model_dir, monkeypatch):
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{a}+{a}=", "solution": str(2 * a)}) for a in range(16)))
    out = tmp_path / "out"
    # `trl rloo ...` flags, as TRL's docs show them, given to `rloo train`.
    main(["train", "--model_name_or_path", tiny_model_dir, "--dataset_name", str(data),
          "--dataset_train_split", "train", "--reward_funcs", "think_format_reward", "conftest.digit_fraction",
          "--dtype", "float32", "--trust_remote_code", "false", "--output_dir", str(out), "--max_steps", "2",
          "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "4",
          "--logging_steps", "1", "--save_strategy", "no", "--eval_strategy", "no", "--learning_rate", "1e-4",
          "--gradient_checkpointing", "true", "--optim", "adamw_torch_fused", "--bf16", "false",
          "--report_to", "none", "--push_to_hub", "false"])
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2

    # The script's body after parsing: what it reads from the config and calls on the trainer.
    from rloo import RLOOConfig, RLOOTrainer
    from rloo.rewards import think_format_reward

    training_args = RLOOConfig(output_dir=str(tmp_path / "body"), max_steps=1, per_device_train_batch_size=8,
                               num_generations=4, max_completion_length=4, save_steps=0)
    training_args.model_init_kwargs = {"revision": None, "trust_remote_code": training_args.trust_remote_code,
                                       "attn_implementation": None, "dtype": "float32"}
    dataset = {"train": Dataset.from_json(str(data))}
    trainer = RLOOTrainer(model=tiny_model_dir, reward_funcs=[think_format_reward], args=training_args,
                          train_dataset=dataset["train"],
                          eval_dataset=dataset["test"] if training_args.eval_strategy != "no" else None,
                          quantization_config=None, peft_config=None)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.accelerator.print("Training completed.")
    trainer.save_model(training_args.output_dir)
    assert training_args.push_to_hub is False and trainer.hub_model_id == "body"
    trainer.end()


# --- TRL's trl/scripts/rloo.py, read from the installed package ---

TRL_IMPORTS = {"from trl import ": "from rloo import ", "from trl.rewards import ": "from rloo.rewards import "}


def ported_trl_script(tmp_path: Path) -> Path:
    """TRL's script with only its two imports changed, written to tmp_path/rloo_script.py."""
    spec = importlib.util.find_spec("trl")
    if spec is None:
        pytest.skip("trl is not installed: this test runs TRL's own trl/scripts/rloo.py (pip install -e '.[dev]').")
    text = (Path(spec.origin).parent / "scripts" / "rloo.py").read_text()
    for old, new in TRL_IMPORTS.items():
        assert old in text, f"TRL's script no longer says {old!r}; the port instructions need updating"
        text = text.replace(old, new)
    assert not re.search(r"^\s*(from|import) trl\b", text, re.MULTILINE)
    script = tmp_path / "rloo_script.py"
    script.write_text(text)
    return script


def run_script(script: Path, monkeypatch, *flags: str) -> None:
    monkeypatch.setattr(sys, "argv", [str(script), *flags])
    runpy.run_path(str(script), run_name="__main__")


def _write_jsonl(path: Path, n: int) -> None:
    path.write_text("\n".join(json.dumps({"prompt": f"{a}+{a}=", "solution": str(2 * a)}) for a in range(n)))


TINY = ["--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "4",
        "--save_strategy", "no", "--push_to_hub", "false", "--report_to", "none"]


def test_trl_rloo_script_runs_with_only_its_imports_changed(tmp_path, tiny_model_dir, monkeypatch):
    script = ported_trl_script(tmp_path)
    data = tmp_path / "data"  # a directory of split files: the script passes dataset_name to datasets.load_dataset
    data.mkdir()
    _write_jsonl(data / "train.jsonl", 16)
    _write_jsonl(data / "test.jsonl", 4)
    config = tmp_path / "run.yaml"
    config.write_text("env:\n  RLOO_TRL_SCRIPT_TEST: from-yaml\n"
                      "max_steps: 5\nlearning_rate: 1e-4\nlogging_steps: 1\ndtype: bfloat16\n"
                      "eval_strategy: steps\neval_steps: 2\n")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("RLOO_TRL_SCRIPT_TEST", "unset")
    out = tmp_path / "out"
    run_script(script, monkeypatch, "--config", str(config), "--model_name_or_path", tiny_model_dir,
               "--dataset_name", str(data), "--reward_funcs", "think_format_reward", "conftest.digit_fraction",
               "--output_dir", str(out), "--max_steps", "2", *TINY)  # the flag wins over the YAML's max_steps: 5
    assert os.environ["RLOO_TRL_SCRIPT_TEST"] == "from-yaml"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "reward" in row] == [1, 2]
    assert [row["step"] for row in rows if "eval/reward" in row] == [2]  # test.jsonl, every eval_steps=2
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert next(model.parameters()).dtype == torch.bfloat16  # --dtype from the YAML reached from_pretrained


def test_trl_rloo_script_with_peft_and_a_dataset_mixture(tmp_path, tiny_model_dir, monkeypatch):
    script = ported_trl_script(tmp_path)
    _write_jsonl(tmp_path / "train.jsonl", 16)
    config = tmp_path / "run.yaml"
    config.write_text(f"datasets:\n  - path: {tmp_path / 'train.jsonl'}\n    columns: [prompt, solution]\n"
                      "use_peft: true\nlora_r: 4\nlora_target_modules: [all-linear]\nlearning_rate: 1e-3\n")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    run_script(script, monkeypatch, "--config", str(config), "--model_name_or_path", tiny_model_dir,
               "--reward_funcs", "conftest.digit_fraction", "--lora_alpha", "8", "--output_dir", str(out),
               "--max_steps", "2", "--logging_steps", "1", *TINY)
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (4, 8) and not (out / "model.safetensors").exists()
    from peft import AutoPeftModelForCausalLM

    model = AutoPeftModelForCausalLM.from_pretrained(out)
    lora_b = [p for name, p in model.named_parameters() if "lora_B" in name]
    assert len(lora_b) == 14 and any(p.abs().sum() > 0 for p in lora_b)  # peft starts B at zero: it trained


# --- the helpers one by one ---

@dataclasses.dataclass
class Extra:
    reward_funcs: list[str] | None = None


def test_trl_parser_yaml_defaults_env_and_flags_win(tmp_path, monkeypatch):
    config = tmp_path / "run.yaml"
    config.write_text("env:\n  RLOO_PARSER_TEST: 7\nlearning_rate: 1e-5\nmax_steps: 9\nlora_r: 4\n"
                      "dataset_name: data\neval_strategy: steps\nreward_funcs: [a, b]\npush_to_hub: false\n")
    monkeypatch.setenv("RLOO_PARSER_TEST", "unset")
    parser = TrlParser((ScriptArguments, RLOOConfig, ModelConfig, Extra))
    script, config_, model, extra = parser.parse_args_and_config(
        ["--config", str(config), "--max_steps", "3", "--kl_coef", "0.1", "--use_peft", "--save_strategy", "no"])
    assert os.environ["RLOO_PARSER_TEST"] == "7"
    assert (config_.learning_rate, config_.max_steps, config_.beta, config_.eval_strategy) == (1e-5, 3, 0.1, "steps")
    assert config_.save_steps == 0 and config_.push_to_hub is False  # TRL names: mapped, and kept to be read
    assert (script.dataset_name, script.dataset_train_split, model.lora_r, model.use_peft) == ("data", "train", 4, True)
    assert extra.reward_funcs == ["a", "b"]
    assert RLOOConfig().output_dir == config_.output_dir  # fields not given keep rloo's defaults


def test_trl_parser_unknown_keys(tmp_path, caplog):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rat: 1e-5\n")
    parser = TrlParser((RLOOConfig, ModelConfig))
    with pytest.raises(ConfigError, match="learning_rat.*did you mean `learning_rate`"):
        parser.parse_args_and_config([f"--config={config}"])
    with caplog.at_level(logging.WARNING):
        parser.parse_args_and_config(["--config", str(config)], fail_with_unknown_args=False)
    assert "learning_rat" in caplog.text
    with pytest.raises(ConfigError, match="eval_strategy='sometimes'"):  # TRL names are refused by name
        parser.parse_args_and_config(["--eval_strategy", "sometimes"])
    with pytest.raises(ValueError, match="field named `config`"):
        TrlParser(dataclasses.make_dataclass("Bad", [("config", str, dataclasses.field(default=""))]))


def test_trl_parser_takes_grpo_config_s_own_fields(tmp_path):
    """A GRPO script's TrlParser((ScriptArguments, GRPOConfig, ModelConfig)) with rloo's RLOOConfig: GRPOConfig's own
    fields are flags and YAML keys, answered as in Python (compat/grpo_fields.py)."""
    config = tmp_path / "grpo.yaml"
    config.write_text("loss_type: dr_grpo\n")
    parser = TrlParser((ScriptArguments, RLOOConfig, ModelConfig))
    _, config_, _ = parser.parse_args_and_config(["--config", str(config), "--scale_rewards", "none",
                                                  "--output_dir", str(tmp_path / "run")])
    assert (config_.loss_agg_mode, config_.advantage_estimator) == ("seq-mean-token-sum-norm", "drgrpo")
    with pytest.raises(ConfigError, match=r"`delta=1.5` is a field of TRL's GRPOConfig"):
        parser.parse_args_and_config(["--delta", "1.5"])


def test_get_dataset_mixture_fractions_columns_and_test_split(tmp_path):
    _write_jsonl(tmp_path / "a.jsonl", 10)
    Dataset.from_list([{"prompt": f"q{i}", "solution": "x", "extra": i} for i in range(4)]).to_json(tmp_path / "b.jsonl")
    mixture = DatasetMixtureConfig(datasets=[
        {"path": str(tmp_path / "a.jsonl"), "fraction": 1.0},
        {"path": str(tmp_path / "b.jsonl"), "fraction": 1.0, "columns": ["prompt", "solution"]}])
    train = get_dataset(mixture)["train"]
    # shares 1/2 and 1/2; the largest mixture repeating no row is min(10 / 0.5, 4 / 0.5) = 8 rows: 4 of each
    assert train["prompt"] == ["0+0=", "1+1=", "2+2=", "3+3=", "q0", "q1", "q2", "q3"]
    assert train.column_names == ["prompt", "solution"]
    split = get_dataset(DatasetMixtureConfig(datasets=[{"path": str(tmp_path / "a.jsonl")}], test_split_size=0.2))
    assert (len(split["train"]), len(split["test"])) == (8, 2)
    with pytest.raises(ConfigError, match="set it on all of them or none"):
        get_dataset(DatasetMixtureConfig(datasets=[{"path": str(tmp_path / "a.jsonl"), "fraction": 1.0},
                                                   {"path": str(tmp_path / "b.jsonl")}]))


def test_model_config_peft_and_quantization():
    assert get_peft_config(ModelConfig()) is None and get_quantization_config(ModelConfig()) is None
    lora = get_peft_config(ModelConfig(use_peft=True, lora_r=8, lora_target_modules=["all-linear"], use_rslora=True))
    assert (lora.r, lora.lora_alpha, lora.target_modules, lora.use_rslora, lora.task_type) == (
        8, 32, "all-linear", True, "CAUSAL_LM")
    with pytest.raises(ConfigError, match="lora_task_type='SEQ_CLS'.*CAUSAL_LM"):
        ModelConfig(lora_task_type="SEQ_CLS")
    with pytest.raises(ConfigError, match="--use_peft"):
        get_quantization_config(ModelConfig(load_in_4bit=True))
    with pytest.raises(ConfigError, match="dtype='bf16'"):
        ModelConfig(dtype="bf16")


def test_kbit_device_map_puts_the_model_on_this_process_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert get_kbit_device_map() is None
    import accelerate

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # a stand-in for the process state: accelerate's PartialState is a singleton the other tests share
    monkeypatch.setattr(accelerate, "PartialState", lambda: type("State", (), {"local_process_index": 3})())
    assert get_kbit_device_map() == {"": 3}

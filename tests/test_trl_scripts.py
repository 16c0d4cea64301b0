"""TRL's own RLOO scripts, ported by changing their imports, on a local tiny model and dataset.

The script texts below follow TRL's `examples/scripts/rloo.py` (NuminaMath, LoRA, vLLM) and
`trl/scripts/rloo.py` (`trl rloo` flags), written out here with the import changed to rloo, the
Hub model and dataset replaced by local tiny ones and the sizes shrunk so that they run in seconds.
Every option they pass is honoured or refused with a named reason.
"""

import json

import pytest
from datasets import Dataset

from rloo import ConfigError
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
    assert steps[0] == 4 and any(  # logging_steps is TRL's default 10: the last step logs"eval/reward" in json.loads(line) for line in
                                             (out / "metrics.jsonl").read_text().splitlines())
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

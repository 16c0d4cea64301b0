"""What `rloo train` does with the flags of TRL's `trl rloo` script that are not already its own: the
fields of TRL's script dataclasses, declared once in compat/scripts.py (cli/parser.py turns them into flags).

Each is honoured (mapped onto what rloo does with the same meaning) or refused with the flag to use
instead. TRL's RLOOConfig fields are flags too; they go through the config's own mapping
(`compat/config_fields.py`). docs/trl_migration.md has the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rloo.config import ConfigError


@dataclass
class RetiredTRLFlags:
    """A flag older TRL scripts took that TRL's dataclasses no longer declare; refused (REFUSED)."""

    gradient_checkpointing_use_reentrant: bool | None = None
    """Refused: rloo enables gradient checkpointing with transformers' defaults."""


REFUSED = {
    "dataset_streaming": "streaming datasets are not loaded by `rloo train`; from Python, pass an IterableDataset "
                         "with max_steps",
    "streaming": "streaming datasets are not loaded by `rloo train`; from Python, pass an IterableDataset with max_steps",
    "datasets": "dataset mixtures are not supported; prepare one dataset and pass --dataset_name",
    "test_split_size": "split the dataset beforehand and pass --eval_split",
    "ignore_bias_buffers": "a DDP setting; configure distributed runs with `accelerate launch --config_file`",
    "gradient_checkpointing_use_reentrant": "rloo enables gradient checkpointing with transformers' defaults; "
                                            "use --gradient_checkpointing",
}


def apply(trl: Any, script: Any, config_values: dict[str, Any]) -> dict[str, Any]:
    """Fold the TRL flags into rloo's script arguments (in place) and config values; return the
    extra keyword arguments for RLOOTrainer (quantization_config)."""
    for name, instead in REFUSED.items():
        if getattr(trl, name) not in (None, False):
            raise ConfigError(f"--{name}: {instead}.")
    if trl.dataset_train_split is not None:
        script.dataset_split = trl.dataset_train_split
    if trl.dataset_test_split is not None and script.eval_split is None and config_values.get("eval_strategy", "no") != "no":
        script.eval_split = trl.dataset_test_split
    if trl.reward_model_name_or_path:
        script.reward_funcs = [f"model:{trl.reward_model_name_or_path}", *script.reward_funcs]
    init = dict(config_values.get("model_init_kwargs") or {})
    for flag, key in (("model_revision", "revision"), ("dtype", "dtype"), ("attn_implementation", "attn_implementation")):
        if getattr(trl, flag) is not None:
            init.setdefault(key, getattr(trl, flag))
    if init:
        config_values["model_init_kwargs"] = init
    check_lora_task_type(trl.lora_task_type)
    return {"quantization_config": quantization_config(trl, script)}


def lora_config(script: Any, trl: Any) -> Any:
    """A peft LoraConfig from `lora_r`, `lora_alpha`, `lora_dropout`, `lora_target_modules` (on `script`)
    and TRL's other LoRA flags (on `trl`: `lora_task_type`, `use_rslora`, `use_dora`,
    `lora_modules_to_save`, `lora_target_parameters`). `rloo train` and `get_peft_config` both build
    theirs here; TRL's ModelConfig holds all of them, so it can be both arguments."""
    check_lora_task_type(trl.lora_task_type)
    from peft import LoraConfig

    targets = script.lora_target_modules
    extras = {"use_rslora": trl.use_rslora, "use_dora": trl.use_dora, "modules_to_save": trl.lora_modules_to_save,
              "target_parameters": trl.lora_target_parameters}
    return LoraConfig(r=script.lora_r, lora_alpha=script.lora_alpha, lora_dropout=script.lora_dropout,
                      # "all-linear" is a keyword of peft only as a string, not inside a list
                      target_modules=targets[0] if targets == ["all-linear"] else targets, task_type="CAUSAL_LM",
                      **{k: v for k, v in extras.items() if v is not None})


def check_lora_task_type(task_type: str | None) -> None:
    if task_type not in (None, "CAUSAL_LM"):
        raise ConfigError(f"lora_task_type={task_type!r}: rloo trains causal LMs; use CAUSAL_LM.")


# TRL's ModelConfig defaults of the 4-bit options: giving them without --load_in_4bit asks for nothing.
_QUANT_DEFAULTS = {"bnb_4bit_quant_type": "nf4", "use_bnb_nested_quant": False, "bnb_4bit_quant_storage": None}


def quantization_config(trl: Any, script: Any) -> Any:
    """A BitsAndBytesConfig for --load_in_4bit / --load_in_8bit, or None. `trl` holds the bnb flags and
    `dtype`, `script` holds `use_peft` (TRL's ModelConfig holds all of them)."""
    if not (trl.load_in_4bit or trl.load_in_8bit):
        for name, default in _QUANT_DEFAULTS.items():
            if getattr(trl, name) not in (None, default):
                raise ConfigError(f"--{name} applies with --load_in_4bit; give that too, or drop it.")
        return None
    if trl.load_in_4bit and trl.load_in_8bit:
        raise ConfigError("--load_in_4bit and --load_in_8bit were both given; choose one.")
    if not script.use_peft:
        raise ConfigError("--load_in_4bit / --load_in_8bit quantise frozen weights; train LoRA adapters on them "
                          "with --use_peft.")
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError("--load_in_4bit / --load_in_8bit need bitsandbytes (>= 0.49 runs on "
                          "CPU too): `pip install 'rloo[quantization]'`, or drop the flag.")
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=bool(trl.load_in_4bit), load_in_8bit=bool(trl.load_in_8bit),
        bnb_4bit_compute_dtype=getattr(torch, trl.dtype) if trl.dtype not in (None, "auto") else torch.float32,
        bnb_4bit_quant_type=trl.bnb_4bit_quant_type or "nf4",
        bnb_4bit_use_double_quant=bool(trl.use_bnb_nested_quant),
        bnb_4bit_quant_storage=trl.bnb_4bit_quant_storage,
    )

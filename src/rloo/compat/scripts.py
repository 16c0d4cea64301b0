"""What TRL's training scripts import besides the trainer: `ScriptArguments`, `ModelConfig`,
`DatasetMixtureConfig` with `get_dataset`, `get_peft_config`, `get_quantization_config`,
`get_kbit_device_map`, and `TrlParser` (script_parser.py).

With them TRL's `trl/scripts/rloo.py` runs after changing its imports, `from trl import ...` to
`from rloo import ...` and `from trl.rewards import ...` to `from rloo.rewards import ...`.
The field names and defaults are TRL 1.16's; the LoRA and quantization settings are built by the
same code as `rloo train --use_peft` (trl_flags.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rloo.compat import trl_flags
from rloo.config_checks import MODEL_DTYPES, ConfigError

logger = logging.getLogger(__name__)


@dataclass
class ScriptArguments:
    """The dataset a TRL script trains on (TRL's ScriptArguments). The script itself loads it."""

    dataset_name: str | None = None
    """Hub name or local directory of the dataset (the script passes it to datasets.load_dataset);
    ignored when `datasets` (DatasetMixtureConfig) is given."""
    dataset_config: str | None = None
    """Dataset configuration name (load_dataset's `name`)."""
    dataset_train_split: str = "train"
    """Split to train on."""
    dataset_test_split: str = "test"
    """Split evaluated when eval_strategy is not "no"."""
    dataset_streaming: bool = False
    """Load the dataset as an IterableDataset; rloo then needs max_steps."""
    ignore_bias_buffers: bool = False
    """TRL's DDP workaround; refused when True (rloo leaves DDP to accelerate)."""

    def __post_init__(self) -> None:
        if self.ignore_bias_buffers:
            raise ConfigError(f"ignore_bias_buffers=True: {trl_flags.REFUSED['ignore_bias_buffers']}.")


@dataclass
class RLOOScriptArguments(ScriptArguments):
    """The arguments of TRL's `trl rloo` script: ScriptArguments and a reward model."""

    reward_model_name_or_path: str | None = None
    """A reward model (AutoModelForSequenceClassification, num_labels=1) scored beside the reward functions."""


@dataclass
class ModelConfig:
    """How the policy is loaded and adapted (TRL's ModelConfig): the same names and defaults."""

    model_name_or_path: str | None = None
    """Model id or local path of the policy."""
    model_revision: str = "main"
    """Branch, tag or commit of the model on the Hub."""
    dtype: str | None = "float32"
    """dtype the model is loaded in: "auto", "bfloat16", "float16" or "float32" (TRL's default)."""
    attn_implementation: str | None = None
    """Attention implementation for from_pretrained, e.g. "sdpa" or "eager"."""
    use_peft: bool = False
    """Train LoRA adapters instead of all weights (get_peft_config)."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA alpha (scale alpha / r)."""
    lora_dropout: float = 0.05
    """Dropout on the LoRA branch."""
    lora_target_modules: list[str] | None = None
    """Modules that get adapters; None lets peft pick the attention projections of known architectures,
    ["all-linear"] every linear layer but the output head."""
    lora_target_parameters: list[str] | None = None
    """Parameters (not modules) that get adapters, e.g. MoE experts."""
    lora_modules_to_save: list[str] | None = None
    """Modules trained in full besides the adapters (e.g. lm_head)."""
    lora_task_type: str = "CAUSAL_LM"
    """peft task type; rloo trains causal LMs, so only "CAUSAL_LM"."""
    use_rslora: bool = False
    """Rank-stabilised LoRA: scale alpha / sqrt(r)."""
    use_dora: bool = False
    """Weight-decomposed LoRA (DoRA)."""
    load_in_8bit: bool = False
    """Load the base model in 8 bits with bitsandbytes (needs use_peft and bitsandbytes; CUDA or CPU)."""
    load_in_4bit: bool = False
    """Load the base model in 4 bits with bitsandbytes (QLoRA; needs use_peft and bitsandbytes; CUDA or CPU)."""
    bnb_4bit_quant_type: str = "nf4"
    """4-bit quantisation type: "nf4" or "fp4"."""
    use_bnb_nested_quant: bool = False
    """Quantise the 4-bit quantisation constants too."""
    bnb_4bit_quant_storage: str | None = None
    """Storage dtype of the 4-bit weights."""

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in MODEL_DTYPES:
            raise ConfigError(f"dtype={self.dtype!r} must be one of {MODEL_DTYPES}.")
        if self.load_in_4bit and self.load_in_8bit:
            raise ConfigError("load_in_4bit and load_in_8bit were both set; choose one.")
        if self.bnb_4bit_quant_type not in ("nf4", "fp4"):
            raise ConfigError(f"bnb_4bit_quant_type={self.bnb_4bit_quant_type!r} must be 'nf4' or 'fp4'.")
        trl_flags.check_lora_task_type(self.lora_task_type)


@dataclass
class DatasetConfig:
    """One dataset of a mixture; the fields are datasets.load_dataset's arguments."""

    path: str
    """A local data file (json, jsonl, csv, parquet), a local directory, or a Hub name."""
    name: str | None = None
    """Dataset configuration name."""
    data_dir: str | None = None
    """Directory of data files inside the dataset."""
    data_files: str | list[str] | dict[str, str] | None = None
    """Data file(s) inside the dataset."""
    split: str = "train"
    """Split to load."""
    columns: list[str] | None = None
    """Columns to keep; all when None."""
    fraction: float | None = None
    """Share of this dataset in the mixture (set on all datasets or none); see get_dataset."""


@dataclass
class DatasetMixtureConfig:
    """Several datasets trained on as one (TRL's DatasetMixtureConfig); the YAML key `datasets` holds a
    list of DatasetConfig mappings."""

    datasets: list[DatasetConfig] = field(default_factory=list)
    """The datasets of the mixture (mappings are turned into DatasetConfig)."""
    streaming: bool = False
    """Load every dataset as an IterableDataset."""
    test_split_size: float | None = None
    """Split the mixture into train and test (train_test_split's test_size); None keeps train only."""

    def __post_init__(self) -> None:
        self.datasets = [DatasetConfig(**d) if isinstance(d, dict) else d for d in self.datasets]


def get_dataset(mixture: DatasetMixtureConfig) -> Any:
    """Load and concatenate the mixture's datasets: a DatasetDict with "train" (and "test" when
    test_split_size is set).

    With fractions f_i, shares w_i = f_i / sum(f) and the mixture holds round(w_i * N) rows of dataset
    i, the first ones, where N = min_i len_i / w_i is the largest size that repeats no row. Example:
    lengths 100 and 10 with fractions 0.5, 0.5: N = 20, so 10 rows of each.
    """
    import datasets

    if not mixture.datasets:
        raise ConfigError("the dataset mixture is empty; give `datasets` (a list of {path: ...}) or dataset_name.")
    parts = []
    for spec in mixture.datasets:
        part = _load_dataset(spec, mixture.streaming)
        parts.append(part.select_columns(spec.columns) if spec.columns is not None else part)
    fractions = [spec.fraction for spec in mixture.datasets]
    if any(f is not None for f in fractions):
        if any(f is None for f in fractions):
            raise ConfigError("`fraction` is set on some datasets of the mixture; set it on all of them or none.")
        if mixture.streaming:
            raise ConfigError("`fraction` needs the datasets' lengths, which streaming datasets do not have.")
        shares = [f / sum(fractions) for f in fractions]
        size = min(len(part) / share for part, share in zip(parts, shares) if share > 0)
        parts = [part.select(range(round(share * size))) for part, share in zip(parts, shares)]
    combined = datasets.concatenate_datasets(parts)
    if mixture.test_split_size is not None:
        return combined.train_test_split(test_size=mixture.test_split_size)
    return datasets.DatasetDict({"train": combined})


def _load_dataset(spec: DatasetConfig, streaming: bool) -> Any:
    """One split: a local data file through its builder, anything else through load_dataset as given."""
    import datasets

    from rloo.data.loading import file_builder

    path = Path(spec.path).expanduser()
    if path.is_file():
        return datasets.load_dataset(file_builder(path), data_files=str(path), split=spec.split, streaming=streaming)
    return datasets.load_dataset(path=spec.path, name=spec.name, data_dir=spec.data_dir, data_files=spec.data_files,
                                 split=spec.split, streaming=streaming)


def get_peft_config(model_args: ModelConfig) -> Any:
    """A peft LoraConfig from the lora_* fields when use_peft, else None."""
    return trl_flags.lora_config(model_args, model_args) if model_args.use_peft else None


def get_quantization_config(model_args: ModelConfig) -> Any:
    """A BitsAndBytesConfig for load_in_4bit / load_in_8bit (needs use_peft and bitsandbytes), else None."""
    return trl_flags.quantization_config(model_args, model_args)


def get_kbit_device_map() -> dict[str, int] | None:
    """Where a k-bit model goes: the whole model on this process's GPU, or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    from accelerate import PartialState

    return {"": PartialState().local_process_index}


__all__ = ["ScriptArguments", "ModelConfig", "DatasetConfig", "DatasetMixtureConfig", "get_dataset",
           "get_peft_config", "get_quantization_config", "get_kbit_device_map"]

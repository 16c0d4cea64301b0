"""Loading a prompt dataset from a local file or directory, or (with the network) the Hub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rloo.config import ConfigError

_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
_SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")  # a folder written by save_to_disk
# Splits that hold rows a model did not train on, in the order they are preferred: TRL's default
# dataset_test_split, then the name transformers' examples use.
HELD_OUT_SPLITS = ("test", "validation")


def file_builder(path: Path) -> str:
    """The datasets builder that reads a local data file ("json", "csv", "parquet"); refuses empty files."""
    builder = _FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise ConfigError(f"{path}: unsupported file type {path.suffix!r}; use one of {sorted(_FILE_BUILDERS)}.")
    if not path.read_bytes().strip():
        raise ConfigError(f"dataset file {path} is empty; it needs one prompt per row (a 'prompt' column).")
    return builder


def load_prompt_dataset(name: str, split: str = "train", config: str | None = None) -> Any:
    """Load a dataset from a local file (json, jsonl, csv, parquet), a local directory (written by
    `save_to_disk` or holding data files), or, for users with the network, a Hub name."""
    import datasets

    path = Path(name).expanduser()
    if path.is_file():
        if split != "train":
            raise ConfigError(f"dataset {name!r} is a single file, so its only split is 'train', not {split!r} (it "
                              f"would read the training rows again). Give the {split!r} rows as their own file, or a "
                              f"directory or Hub dataset that has that split.")
        return datasets.load_dataset(file_builder(path), data_files=str(path), split="train")
    if path.is_dir():
        if any((path / marker).exists() for marker in _SAVED_MARKERS):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise ConfigError(f"{path} has splits {list(loaded)}, not {split!r}; pass --dataset_split.")
                loaded = loaded[split]
            return loaded
        return _load_split(str(path), config, split)
    if name.startswith((".", "/", "~")) or name.endswith(tuple(_FILE_BUILDERS)):
        raise FileNotFoundError(f"dataset {name!r} does not exist locally.")
    return _load_split(name, config, split)


def _load_split(name: str, config: str | None, split: str) -> Any:
    """`datasets.load_dataset` of one split; a split the data does not have is named with the ones it has."""
    import datasets

    try:
        return datasets.load_dataset(name, config, split=split)
    except ValueError as error:
        if "split" not in str(error).lower():
            raise
        raise ConfigError(f"dataset {name!r} has no split {split!r} ({error}).") from None


def dataset_splits(name: str, config: str | None = None) -> list[str] | None:
    """The splits a dataset has, read without loading its rows: a single file has "train"; None when
    that cannot be known (a Hub dataset offline, a folder holding one saved split)."""
    import datasets

    path = Path(name).expanduser()
    if path.is_file():
        return ["train"]
    if path.is_dir() and any((path / marker).exists() for marker in _SAVED_MARKERS):
        listing = path / "dataset_dict.json"
        return list(json.loads(listing.read_text()).get("splits", [])) if listing.exists() else None
    try:
        return list(datasets.get_dataset_split_names(name, config))
    except Exception:  # offline, or a name datasets cannot resolve: loading it will say why
        return None


def held_out_split(name: str, config: str | None, train_split: str) -> str | None:
    """The data's held-out split ("test", else "validation"), other than `train_split`; None if it has none."""
    splits = dataset_splits(name, config) or []
    return next((split for split in HELD_OUT_SPLITS if split in splits and split != train_split), None)


def first_rows(dataset: Any, max_rows: int | None) -> Any:
    """The first `max_rows` rows of a dataset (all of them when None or more than it has), as
    transformers' examples apply max_eval_samples."""
    if max_rows is None or max_rows >= len(dataset):
        return dataset
    return dataset.select(range(max_rows))

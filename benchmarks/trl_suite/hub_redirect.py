"""Point TRL's tests at the local stand-ins: loaded as the `conftest.py` of the folder the runner builds.

Models: the runner sets HF_HUB_CACHE to the stand-ins' cache and HF_HUB_OFFLINE=1 before Python
starts, so `from_pretrained("trl-internal-testing/...")` resolves from that cache with no patching.
Data sets: `datasets.load_dataset("trl-internal-testing/zen", config, split=..., streaming=...)` (and
`zen-image`, `zen-multi-image`) is redirected to the parquet files the stand-in builder wrote; any other id
goes through unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

import datasets

_original_load_dataset = datasets.load_dataset
LOCAL_IDS = {f"trl-internal-testing/{name}": name for name in ("zen", "zen-image", "zen-multi-image")}


def load_dataset(path, name=None, *args, split=None, streaming=False, **kwargs):
    """`datasets.load_dataset`, with the test data set read from the local parquet files."""
    if path not in LOCAL_IDS:
        return _original_load_dataset(path, name, *args, split=split, streaming=streaming, **kwargs)
    folder = Path(os.environ["RLOO_TRL_SUITE_CACHE"]) / "datasets" / LOCAL_IDS[path] / name
    if not folder.is_dir():
        raise FileNotFoundError(f"no local stand-in for {path!r} config {name!r} (looked in {folder})")
    files = {p.stem: str(p) for p in sorted(folder.glob("*.parquet"))}
    return _original_load_dataset("parquet", data_files=files, split=split, streaming=streaming, **kwargs)


datasets.load_dataset = load_dataset

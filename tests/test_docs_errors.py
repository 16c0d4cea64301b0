"""docs/errors.md holds: every row's error is built from the row and its message compared with the row's.

Each table row ends with a "Built by" cell, which says how to raise the row's error here:

- `RLOOConfig(name=value, ...)`: the config is built with those keyword arguments (and a temporary
  `output_dir` unless one is given), and must raise;
- `rloo <subcommand> --flag value ...`: the command line runs in this process, and must exit with
  status 2 and print the message on stderr;
- `case <name>`: the function registered under that name below builds the error and returns its text;

several of them separated by `;` (each must match). The row's message is a list of alternatives
separated by " / "; each alternative is text in which "..." stands for anything: each build must match
one alternative, and each alternative must be matched by a build.

- `see Test`: the error needs a whole run (a signal, a resume, a training step); the row's Test cell
  names the test that holds it, and that test is checked to exist, as every row's Test cell is.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from rloo import RLOOConfig

ROOT = Path(__file__).resolve().parents[1]
ERRORS = ROOT / "docs" / "errors.md"
TESTS = ROOT / "tests"


# --- reading the page -----------------------------------------------------------------------------

def split_cells(line: str) -> list[str]:
    """A markdown table row's cells; `\\|` is a pipe inside a cell."""
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [cell.strip().replace("\\|", "|") for cell in cells]


def error_rows(text: str) -> list[dict[str, str]]:
    """Every row of every table in the page, as {header: cell}; a row with the wrong cell count fails."""
    rows, header = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = split_cells(line)
        if header is None:
            header = cells
            continue
        if set(line) <= set("|-: "):
            continue
        assert len(cells) == len(header), f"docs/errors.md line {number}: {len(cells)} cells, the table has {len(header)}"
        rows.append(dict(zip(header, cells), line=str(number)))
    return rows


ROWS = error_rows(ERRORS.read_text(encoding="utf-8"))


def as_pattern(message: str) -> re.Pattern:
    """A message of the page as a pattern: "..." matches anything, the rest literally (a run of spaces
    matches a single space; backquotes around code in the page are the message's own)."""
    return re.compile(".*".join(re.escape(" ".join(part.split())) for part in message.strip().split("...")), re.DOTALL)


# --- building the errors --------------------------------------------------------------------------

CASES: dict[str, Callable[[Path], str]] = {}


def case(name: str):
    def register(function):
        CASES[name] = function
        return function
    return register


def raised(function: Callable[[], object]) -> str:
    """The text of the exception `function` raises (failing when it raises none)."""
    try:
        function()
    except (Exception, SystemExit) as error:  # noqa: BLE001 - any error's text is compared
        return str(error)
    pytest.fail("no error was raised")


def literal(node: ast.expr) -> object:
    """A Python literal, where the names `inf` and `nan` are the floats."""
    if isinstance(node, ast.Name) and node.id in ("inf", "nan"):
        return float(node.id)
    if isinstance(node, ast.List):
        return [literal(element) for element in node.elts]
    return ast.literal_eval(node)


def build_config(arguments: str, tmp_path: Path) -> str:
    call = ast.parse(arguments, mode="eval").body
    assert isinstance(call, ast.Call) and not call.args, arguments
    kwargs = {keyword.arg: literal(keyword.value) for keyword in call.keywords}
    kwargs.setdefault("output_dir", str(tmp_path / "out"))
    return raised(lambda: RLOOConfig(**kwargs))


def build_cli(command: str, tmp_path: Path, capsys) -> str:
    from rloo.cli import main

    argv = shlex.split(command)[1:]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2, f"`{command}` exited with {exit_info.value.code}, not 2"
    return capsys.readouterr().err


def build(how: str, tmp_path: Path, capsys) -> str:
    how = how.strip().strip("`").strip()
    if how.startswith("RLOOConfig("):
        return build_config(how, tmp_path)
    if how.startswith("rloo "):
        return build_cli(how, tmp_path, capsys)
    if how.startswith("case "):
        return CASES[how[len("case "):].strip()](tmp_path)
    raise AssertionError(f"unknown way to build an error: {how!r}")


def builds(row: dict[str, str]) -> list[str]:
    return [how for how in row["Built by"].split(";") if how.strip()]


# --- the cases: errors that are not a config or a command line -----------------------------------

def without_module(name: str, function: Callable[[], object]) -> str:
    """The error `function` raises where the package `name` is not installed (whether or not it is here)."""
    import importlib.util

    real = importlib.util.find_spec
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(importlib.util, "find_spec", lambda module, *a, **k: None if module == name else real(module, *a, **k))
        return raised(function)


@case("adamw_8bit_without_bitsandbytes")
def _(tmp_path):
    return without_module("bitsandbytes", lambda: RLOOConfig(output_dir=str(tmp_path), optim="adamw_8bit"))


@case("vllm_sampler_without_vllm")
def _(tmp_path):
    return without_module("vllm", lambda: RLOOConfig(output_dir=str(tmp_path), sampler="vllm"))


@case("output_dir_is_a_file")
def _(tmp_path):
    (tmp_path / "taken").write_text("a file")
    return raised(lambda: RLOOConfig(output_dir=str(tmp_path / "taken")))


def yaml_errors(tmp_path: Path, *texts: str) -> str:
    """`rloo train --config run.yaml` for each YAML text, the error lines joined."""
    import contextlib
    import io

    from rloo.cli import main

    lines = []
    for text in texts:
        (tmp_path / "run.yaml").write_text(text)
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exit_info:
            main(["train", "--config", str(tmp_path / "run.yaml")])
        assert exit_info.value.code == 2
        lines.append(stderr.getvalue().replace(str(tmp_path) + "/", ""))
    return " / ".join(lines)


@case("yaml_unknown_key")
def _(tmp_path):
    return yaml_errors(tmp_path, "learning_rat: 1.0e-5\n")


@case("yaml_quoted_values")
def _(tmp_path):
    return yaml_errors(tmp_path, "bf16: 'false'\n", "bf16: 'maybe'\n", "use_peft: 'no'\n", "per_device_train_batch_size: '8'\n")


@case("yaml_words_for_numbers")
def _(tmp_path):
    return yaml_errors(tmp_path, "learning_rate: fast\n", "lora_r: 'four'\n")


@case("yaml_syntax_error")
def _(tmp_path):
    return yaml_errors(tmp_path, "seed: 1\nlearning_rate: 1e-5: 2\n")


def reward_error(spec: str) -> str:
    from rloo.cli import resolve_reward_func

    return raised(lambda: resolve_reward_func(spec))


@case("reward_module_that_cannot_be_imported")
def _(tmp_path):
    return reward_error("no_such_module:fn")


@case("reward_neither_builtin_nor_path")
def _(tmp_path):
    return reward_error("nonsense")


@case("reward_module_without_the_function")
def _(tmp_path):
    return reward_error("rloo.rewards:missing")


@case("reward_factory_wrong_argument")
def _(tmp_path):
    return reward_error("length_penalty:target=3")


@case("reward_factory_argument_without_equals")
def _(tmp_path):
    return reward_error("length_penalty:4")


def sandbox_error(layers: dict[str, bool]) -> str:
    """run_tests's refusal on a machine with only `layers` (simulated), nothing accepted by name."""
    import os
    from unittest import mock

    from rloo.rewards import isolation
    from rloo.rewards.sandbox import run_tests

    names = (isolation.ALLOW_UNISOLATED_ENV, isolation.ALLOW_MISSING_ENV, isolation.DISABLE_ENV)
    with mock.patch.object(isolation, "isolation_layers", lambda: layers), \
            mock.patch.object(isolation, "probe_namespaces", lambda: (None, "unshare: Operation not permitted")), \
            mock.patch.object(isolation, "_allowed_missing", frozenset()), \
            mock.patch.dict(os.environ, {name: "" for name in names}):
        return raised(lambda: run_tests("x = 1", ["assert x == 1"]))


@case("sandbox_without_namespaces")
def _(tmp_path):
    return sandbox_error({"namespaces": False, "landlock": True, "pids_cgroup": True})


@case("sandbox_without_any_layer")
def _(tmp_path):
    return sandbox_error({"namespaces": False, "landlock": False, "pids_cgroup": False})


def load_error(name: str, split: str = "train") -> str:
    from rloo.data.loading import load_prompt_dataset

    return raised(lambda: load_prompt_dataset(name, split=split))


@case("dataset_that_does_not_exist")
def _(tmp_path):
    return load_error("./x.jsonl")


@case("missing_split_of_a_file")
def _(tmp_path):
    return load_error("rows.jsonl", "test") + " / " + load_error("rows.jsonl", "validation")


@case("missing_split_of_a_folder")
def _(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "train.jsonl").write_text('{"prompt": "a"}\n')
    return load_error("folder", "validation")


@case("empty_jsonl_file")
def _(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    return load_error("empty.jsonl")


def dataset_error(rows: list[dict], name: str = "train_dataset") -> str:
    from datasets import Dataset

    from rloo.data.prompts import check_prompt_dataset

    return raised(lambda: check_prompt_dataset(Dataset.from_list(rows) if rows else Dataset.from_dict({"prompt": []}), name))


@case("empty_dataset")
def _(tmp_path):
    return dataset_error([])


@case("no_prompt_column")
def _(tmp_path):
    return dataset_error([{"question": "2+2="}], "eval_dataset")


@case("prompt_neither_text_nor_chat")
def _(tmp_path):
    return dataset_error([{"prompt": 3}])


@case("message_content_none")
def _(tmp_path):
    return dataset_error([{"prompt": [{"role": "user", "content": None}]}])


@case("message_unknown_role")
def _(tmp_path):
    return dataset_error([{"prompt": [{"role": "user", "content": "a"}]}, {"prompt": [{"role": "wizard", "content": "b"}]}])


@case("empty_string_prompt")
def _(tmp_path):
    return dataset_error([{"prompt": "a"}, {"prompt": ""}])


@case("prompt_longer_than_max_prompt_length")
def _(tmp_path):
    from datasets import Dataset

    from rloo.data.prompts import check_prompt_lengths
    from rloo.toy import build_char_tokenizer

    rows = Dataset.from_list([{"prompt": "1+1="}] * 3 + [{"prompt": "x" * 30}])
    return raised(lambda: check_prompt_lengths(rows, "train_dataset", build_char_tokenizer(), 10, "error"))


@case("model_directory_without_config")
def _(tmp_path):
    from rloo.builders import check_model_name

    (tmp_path / "weights").mkdir()
    return raised(lambda: check_model_name(str(tmp_path / "weights")))


def trainer_error(**kwargs) -> str:
    """RLOOTrainer's refusal of its reward arguments, which comes before any model loads."""
    from datasets import Dataset

    from rloo import RLOOTrainer

    rows = Dataset.from_list([{"prompt": "1+1="}] * 8)
    return raised(lambda: RLOOTrainer(model="./no/such/model", train_dataset=rows, **kwargs))


def zeros(completions, **kwargs):
    return [0.0] * len(completions)


@case("trainer_without_rewards")
def _(tmp_path):
    return trainer_error(reward_funcs=[], args=RLOOConfig(output_dir=str(tmp_path)))


@case("trainer_reward_that_is_an_int")
def _(tmp_path):
    return trainer_error(reward_funcs=5, args=RLOOConfig(output_dir=str(tmp_path)))


@case("trainer_reward_funcs_and_reward_model")
def _(tmp_path):
    return trainer_error(reward_funcs=[zeros], reward_model=[zeros], args=RLOOConfig(output_dir=str(tmp_path)))


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@case("two_tools_with_one_name")
def _(tmp_path):
    from rloo.tools import tool_schemas

    return raised(lambda: tool_schemas([add, add]))


@case("a_tool_that_is_not_callable")
def _(tmp_path):
    from rloo.tools import tool_schemas

    return raised(lambda: tool_schemas([5]))


@case("a_tool_without_a_docstring")
def _(tmp_path):
    from rloo.tools import tool_schemas

    def undocumented(a: int) -> int:
        return a

    return raised(lambda: tool_schemas([undocumented]))


@case("tools_with_a_tokenizer_without_a_chat_template")
def _(tmp_path):
    from rloo.tools import check_tool_template
    from rloo.toy import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    return raised(lambda: check_tool_template(tokenizer, None))


@case("tools_with_a_template_that_drops_tool_messages")
def _(tmp_path):
    from rloo.tools import check_tool_template
    from rloo.toy import build_char_tokenizer

    return raised(lambda: check_tool_template(build_char_tokenizer(), None))


@case("an_environment_without_reset")
def _(tmp_path):
    from rloo.rollout.multi_turn import MultiTurnRollout

    class NoReset:
        pass

    return raised(lambda: MultiTurnRollout(None, 8, 8, None, {0}, environment_factories={None: NoReset}))


def multi_turn_error(tmp_path: Path, tools: list | None, environment_factory=None, **config) -> str:
    """build_multi_turn's refusal of a rollout_func beside other options (checked before anything runs)."""

    from rloo.builders import build_multi_turn

    args = RLOOConfig(output_dir=str(tmp_path), **config)
    return raised(lambda: build_multi_turn(args, None, None, tools, environment_factory, lambda prompts, trainer: {}))


@case("rollout_func_with_tools")
def _(tmp_path):
    return multi_turn_error(tmp_path, [add])


@case("rollout_func_with_async_rollouts")
def _(tmp_path):
    return multi_turn_error(tmp_path, None, async_rollouts=True)


# --- the tests ------------------------------------------------------------------------------------

BUILT = [row for row in ROWS if row["Built by"] != "see Test"]


def test_every_row_says_how_it_is_built():
    assert len(ROWS) > 90
    for row in ROWS:
        assert set(row) == {"#", "Bad input", "Message", "Test", "Built by", "line"}, row
        assert row["Built by"] == "see Test" or builds(row), f"row {row['#']}: no way to build it"


@pytest.mark.parametrize("row", BUILT, ids=[row["#"] for row in BUILT])
def test_each_row_builds_its_error_with_its_message(row, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the commands' relative paths (rows.jsonl, ./no/such/model) are in tmp_path
    (tmp_path / "rows.jsonl").write_text('{"prompt": "2+2=", "answer": "4"}\n')
    # The " / "-separated alternatives; a message may hold " / " itself, so the whole message also counts.
    whole, patterns = as_pattern(row["Message"]), [as_pattern(text) for text in row["Message"].split(" / ")]
    matched = set()
    for how in builds(row):
        text = " ".join(build(how, tmp_path, capsys).split())
        if whole.search(text):
            matched.update(range(len(patterns)))
            continue
        hits = [index for index, pattern in enumerate(patterns) if pattern.search(text)]
        assert hits, f"row {row['#']}: {how.strip()} gave\n  {text}\nnot the row's message\n  {row['Message']}"
        matched.update(hits)
    missing = [row["Message"].split(" / ")[index] for index in range(len(patterns)) if index not in matched]
    assert not missing, f"row {row['#']}: no build gave {missing}"


TEST_NAME = re.compile(r"([\w/]+\.py)?::(test_\w+)|([\w/]+\.py)")


def referenced_tests(rows: list[dict[str, str]]) -> list[tuple[str, str, str | None]]:
    """(row, file, test) for every test a Test cell names; "same" is the row above's, "::name" its file."""
    found, previous_file, previous = [], None, []
    for row in rows:
        cell = row["Test"]
        if cell.startswith("same") or cell.startswith("(message in"):
            names = previous if cell.startswith("same") else []
            cell = cell[len("same"):] if cell.startswith("same") else ""
        else:
            names = []
        for match in TEST_NAME.finditer(cell):
            file = match.group(1) or match.group(3) or previous_file
            previous_file = file
            names.append((row["#"], file, match.group(2)))
        found.extend(names)
        previous = [(row["#"], file, test) for _, file, test in names]
    return found


def test_every_test_a_row_names_exists():
    files = {path.relative_to(TESTS).as_posix(): path for path in TESTS.rglob("test_*.py")}
    checked = 0
    for row, file, test in referenced_tests(ROWS):
        matches = [path for name, path in files.items() if name == file or name.endswith("/" + file)]
        assert len(matches) == 1, f"row {row}: test file {file} matches {len(matches)} files"
        if test is not None:
            assert re.search(rf"^def {test}\(", matches[0].read_text(), re.MULTILINE), f"row {row}: {file}::{test} does not exist"
            checked += 1
    assert checked > 50

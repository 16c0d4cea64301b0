"""safe_text: untrusted text shown as the characters it holds, never as markup, escapes or HTML;
and the console, log and report paths that use it. The whole run is in tests/e2e/test_untrusted_text.py."""

import json
import logging
import random

import pytest
import torch

from rloo.run.console import completions_table, metrics_table, render
from rloo.run.metrics import completion_rows
from rloo.run.report import build_report, completions_html, describe_run
from rloo.safe_text import console_text, display, html_text, tracker_text, visible

CONTROLS = [chr(c) for c in [*range(0x00, 0x20), *range(0x7f, 0xa0)]] + ["\u202e", "\u2066", "\u2028", "\u200f",
                                                                           "\ud800", "\udc80"]


def test_every_control_character_is_written_as_its_escape():
    assert visible("a\x1b[31mb") == "a\\x1b[31mb"
    assert visible("\r\x00\x7f\x9b\u202e\udc80") == "\\r\\x00\\x7f\\x9b\\u202e\\udc80"
    assert visible("line\n\ttab") == "line\\n\\ttab"  # names and log arguments: one line
    assert visible("line\n\ttab\r", keep="\n\t") == "line\n\ttab\\r"  # table cells keep newlines and tabs
    assert visible("é ü 中文 🙂 [/] <b>") == "é ü 中文 🙂 [/] <b>"  # printable text is left as it is
    assert visible(3) == "3"
    for char in CONTROLS:
        assert char not in visible(f"x{char}y", keep="\n\t" if char not in "\n\t" else "")


def test_random_text_never_breaks_the_console_or_the_page():
    rng = random.Random(0)
    pieces = ["[/]", "[bold]", "[link=http://x]", "[/link]", ":smile:", "<script>", "&", "\\", "$", *CONTROLS]
    for _ in range(300):
        text = "".join(rng.choice(pieces) if rng.random() < 0.5 else chr(rng.randrange(0x20, 0x3000))
                       for _ in range(rng.randrange(1, 30)))
        shown = render(console_text(text))
        page = html_text(text)
        for char in CONTROLS:
            if char not in "\n\t":
                assert char not in shown and char not in page
        assert "<" not in page and ">" not in page
        shown.encode("utf-8"), page.encode("utf-8"), tracker_text(text).encode("utf-8")  # no lone surrogate left


def test_markup_is_shown_as_written():
    shown = render(console_text("[/] [bold]x[/bold] [link=http://x]y[/link] :smile:"))
    assert shown == "[/] [bold]x[/bold] [link=http://x]y[/link] :smile:"


def test_the_completions_table_shows_markup_escapes_and_hostile_names_as_text():
    rows = completion_rows(["[/] a \x1b]8;;http://x\x1b\\"], ["[link=http://x]b\x1b[2J\r"], ["f[/]\x1b"],
                           torch.tensor([[1.0]]), [1.0], [0.5], 3, 4, extra={"note[/]": ["\x9b1m"]})
    shown = render(completions_table(rows, 3, 4), width=200)
    assert "[/] a \\x1b]8;;http://x\\x1b\\" in shown and "[link=http://x]b\\x1b[2J\\r" in shown
    assert "f[/]\\x1b" in shown and "note[/]" in shown and "\\x9b1m" in shown
    assert "\x1b" not in shown and "\r" not in shown and "\x9b" not in shown
    assert "[bold]\\x1b mean" in render(metrics_table({"eval/rewards/[bold]\x1b/mean": 0.5}, 1))


def test_chat_prompts_read_as_turns():
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2? [/]"},
              {"role": "assistant", "content": [{"type": "text", "text": "It is"}, {"type": "image"}]}]
    assert display(prompt) == "system: Be brief.\nuser: 2+2? [/]\nassistant: It is <image>"
    rows = completion_rows([prompt], ["4"], ["f"], torch.tensor([[1.0]]), [1.0], [0.5], 1, 4)
    shown = render(completions_table(rows, 1, 4))
    assert "system: Be brief." in shown and "user: 2+2? [/]" in shown and "'role'" not in shown
    page = completions_html(rows)
    assert "system: Be brief.\nuser: 2+2? [/]" in page and "&#x27;role&#x27;" not in page
    assert display("plain") == "plain" and display(0.123456) == "0.1235" and display([1, 2]) == "[1, 2]"


HOSTILE_TOOL_RESULT = "[bold]5[/bold] <script>alert(1)</script> \x1b[2J\r\u202e</td>"
TRAJECTORY = [
    {"role": "assistant", "content": "Let me add.",
     "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
    {"role": "tool", "name": "add", "content": HOSTILE_TOOL_RESULT},
    {"role": "assistant", "content": "It is 5."},
]


def test_a_trajectory_reads_turn_by_turn_with_tool_calls_and_results_marked():
    assert display(TRAJECTORY).split("\n") == [
        "assistant: Let me add.", 'call \u25b8 add {"a": 2, "b": 3}',
        f"tool \u25b8 add \u2192 {HOSTILE_TOOL_RESULT}", "assistant: It is 5."]
    # a turn that only calls shows no empty "assistant:" line; a malformed call's raw arguments show as they came
    only_calls = [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": '{"a": 2,'}}]}]
    assert display(only_calls) == 'call \u25b8 add {"a": 2,'


def test_a_tool_result_with_markup_escapes_and_html_renders_inert():
    """Tool output is untrusted: in the console table, completions.jsonl and the report it is shown as text."""
    rows = completion_rows([[{"role": "user", "content": "2+3?"}]], [TRAJECTORY], ["f"], torch.tensor([[1.0]]), [1.0],
                           [0.5], 1, 4)
    shown = render(completions_table(rows, 1, 4), width=400)
    flat = shown.replace("\u2502", "").replace("\n", "").replace(" ", "")
    assert "tool\u25b8add\u2192[bold]5[/bold]<script>alert(1)</script>\\x1b[2J\\r\\u202e</td>" in flat
    assert "\x1b" not in shown and "\r" not in shown and "\u202e" not in shown
    page = completions_html(rows)
    assert ("tool \u25b8 add \u2192 [bold]5[/bold] &lt;script&gt;alert(1)&lt;/script&gt; \\x1b[2J\\r\\u202e&lt;/td&gt;"
            in page)
    assert "<script>" not in page and "\x1b" not in page
    assert json.loads(json.dumps(rows[0]))["completion"] == TRAJECTORY  # the file keeps the messages as they were


def test_reward_function_log_lines_show_names_and_errors_as_text(caplog):
    from rloo.rewards.scoring import RewardFunction, score_completions

    def broken(completions, **kwargs):
        raise ValueError("bad \x1b[2J completion")

    broken.__name__ = "name\x1b[31m"
    arguments = {"prompts": ["p"], "completions": ["c\x1b"], "completion_ids": [[1]]}
    with caplog.at_level(logging.WARNING):
        score_completions([RewardFunction.wrap(broken)], [1.0], arguments, 1, step=1, error_policy="none")
    assert "name\\x1b[31m" in caplog.text and "bad \\x1b[2J completion" in caplog.text and "\x1b" not in caplog.text


def test_the_command_line_prints_an_error_quoting_a_completion_visibly(monkeypatch, capsys):
    from rloo import cli
    from rloo.config import ConfigError

    def fail(argv):
        raise ConfigError("completion: \x1b[2J[/]\nsecond line")

    monkeypatch.setattr(cli, "run_train", fail)
    with pytest.raises(SystemExit):
        cli.main(["train"])
    assert capsys.readouterr().err == "rloo: error: completion: \\x1b[2J[/]\nsecond line\n"


# ------------------------------------------------------------------ the report of a tampered run


def write_lines(path, rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))


def test_the_report_of_a_tampered_run_is_written_with_every_field_escaped(tmp_path):
    write_lines(tmp_path / "metrics.jsonl", [
        {"step": 1, "episode": 8, "reward": 0.5, "rewards/<script>x$\\frac{$/mean": 0.1, "rewards/ok/mean": 0.2},
        {"step": 2, "episode": "<script>alert(1)</script>", "reward": "<b>x</b>", "lr": [1, 2]},  # values not numbers
        {"step": "<script>alert(2)</script>", "reward": 0.1},  # a step that is not an integer
        {"step": True, "reward": 0.3},
        "not json <script>", "[1, 2]",
        {"step": 3, "episode": 24, "reward": 0.7, "rewards/<script>x$\\frac{$/mean": 0.3, "rewards/ok/mean": 0.1},
    ])
    write_lines(tmp_path / "completions.jsonl", [
        {"step": "<script>alert(3)</script>", "prompt": "p", "completion": "<script>alert(4)</script>\x1b[2J"},
        {"step": 1, "prompt": [{"role": "user", "content": "<i>q</i>"}], "completion": "c", "<th>": 1.5},
        {"step": None, "prompt": "p", "completion": "d"}, "garbage",
    ])
    (tmp_path / "run.json").write_text(json.dumps({
        "model": {"name_or_path": "<script>m</script>", "parameters": "<b>many</b>"},
        "dataset": {"name": "d<script>", "columns": ["<a>", 3]},
        "reward_functions": [{"name": "<script>r</script>", "weight": "<b>2</b>"}, "x", {"weight": 2}]}))
    (tmp_path / "rloo_config.json").write_text(json.dumps({"learning_rate": "<script>lr</script>", "<b>": 1}))
    page = build_report(tmp_path).read_text(encoding="utf-8")
    lowered = page.lower()
    for tag in ("<script", "<b>", "<i>", "<a>", "<th>1"):
        assert tag not in lowered, tag
    assert "\x1b" not in page and "\\x1b[2J" in page
    assert "2 training logs" in page  # steps 1 and 3; the rows with a string or a bool step are left out
    assert "Left out as damaged" in page and "4 from metrics.jsonl" in page and "1 from completions.jsonl" in page
    assert "step &lt;script&gt;alert(3)&lt;/script&gt;" in page and "user: &lt;i&gt;q&lt;/i&gt;" in page
    assert "Reward function: &lt;script&gt;x$\\frac{$" in page  # the panel of a reward named like a formula


def test_a_run_card_of_the_wrong_shape_reads_as_unknown():
    assert describe_run(["not", "a", "dict"]) == []
    lines = describe_run({"model": "x", "dataset": 3, "reward_functions": {"a": 1}})
    assert lines[0].startswith("Model: a model built in memory") and lines[2] == "Reward functions: -"


def test_an_unreadable_run_json_is_left_out_and_named(tmp_path):
    write_lines(tmp_path / "metrics.jsonl", [{"step": 1, "episode": 8, "reward": 0.5}])
    (tmp_path / "run.json").write_text("{not json")
    page = build_report(tmp_path).read_text(encoding="utf-8")
    assert "1 from run.json" in page and "run.json not found" in page

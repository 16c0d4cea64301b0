"""Watching a trajectory (issue 50, item 5): a 2-turn trajectory whose first turn calls one tool that answers and
one that fails reads turn by turn, calls and results marked, in the console table, completions.jsonl, the
trackers' table, eval_samples.jsonl and `rloo report` (collapsible turns, an evaluation samples section); a
single-turn run keeps its look."""

import json
import types

import pytest
from datasets import Dataset
from tool_chat import ScriptedSampler, call, tool_tokenizer

from rloo import RLOOConfig, RLOOTrainer
from rloo.cli.commands import _write_eval
from rloo.run import metrics as run_metrics
from rloo.run.report import build_report
from rloo.toy import build_tiny_model


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def boom(x: int) -> int:
    """Fail on purpose.

    Args:
        x: Anything.
    """
    raise ValueError("no")


def script(text, row):
    """Turn 1: some words, a call of add (answers 3), a call of boom (fails); turn 2: the answer."""
    if "<tool_response>" in text:
        return "it is 3"
    return "let me add" + call("add", a=1, b=2) + call("boom", x=1)


def says_three(completions, **kwargs):
    return [float("it is 3" in json.dumps(c)) for c in completions]


# The records every trajectory of the script holds, as completions.jsonl and eval_samples.jsonl write them.
TURNS = [
    {"turn": 1, "role": "assistant", "text": "let me add", "tool_call": None, "tool_result": None},
    {"turn": 1, "role": "tool", "text": "", "tool_call": {"name": "add", "arguments": {"a": 1, "b": 2}, "error": None},
     "tool_result": {"content": "3", "error": False}},
    {"turn": 1, "role": "tool", "text": "", "tool_call": {"name": "boom", "arguments": {"x": 1}, "error": None},
     "tool_result": {"content": '{"error": "ValueError: no"}', "error": True}},
    {"turn": 2, "role": "assistant", "text": "it is 3", "tool_call": None, "tool_result": None},
]
# How the console and the trackers' table read them.
TEXT = ('turn 1 assistant: let me add\n  call \u25b8 add(a=1, b=2)\n  result \u2192 3\n  call \u25b8 boom(x=1)\n'
        '  error \u2192 {"error": "ValueError: no"}\nturn 2 assistant: it is 3')


def _trainer(tmp_path, tools, sampler_script, prompt):
    tokenizer = tool_tokenizer()
    data = Dataset.from_list([{"prompt": prompt(a)} for a in range(4)])
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=400, learning_rate=1e-2, beta=0.0, max_steps=1, logging_steps=1,
                      save_steps=0, seed=0, log_completions=True, num_completions_to_print=2, overwrite_output_dir=True)
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64)
    return RLOOTrainer(model=model, reward_funcs=[says_three], args=args, train_dataset=data,
                       eval_dataset=data.select(range(2)), processing_class=tokenizer,
                       sampler=ScriptedSampler(tokenizer, sampler_script), tools=tools)


@pytest.fixture
def tool_run(tmp_path, capsys):
    trainer = _trainer(tmp_path, [add, boom], script, lambda a: [{"role": "user", "content": f"{a}+1?"}])
    trainer.train()
    console = capsys.readouterr().out
    trainer.evaluate()  # what `rloo eval` writes: eval_results.json and eval_samples.jsonl beside the run
    _write_eval(tmp_path / "run", {"model": "tiny", "eval/reward": 1.0}, trainer.eval_samples)
    return tmp_path / "run", console


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_console_file_and_trackers_show_the_turns_with_calls_and_results_marked(tool_run, monkeypatch):
    run_dir, console = tool_run
    rows = _jsonl(run_dir / "completions.jsonl")
    assert len(rows) == 2 and all(row["turns"] == TURNS for row in rows)
    assert list(rows[0])[:4] == ["step", "prompt", "completion", "turns"]  # the messages stay, as reward functions saw them
    for line in TEXT.splitlines():
        assert line in console
    assert "'role'" not in console and "<tool_response>" not in console and "'turn'" not in console
    # the trackers' table: the completion column reads turn by turn, no column of raw records
    tables = []
    monkeypatch.setattr(run_metrics, "log_table", lambda tracker, name, columns, table, step, images: tables.append(
        (columns, table)))
    logger = run_metrics.MetricsLogger(types.SimpleNamespace(is_main_process=True, trackers=["a tracker"]),
                                       run_dir / "again", "none", console=False)
    logger.use_trackers = True
    logger.log_completions(rows, 1)
    (columns, table), = tables
    assert "turns" not in columns and table[0][columns.index("completion")] == TEXT


def test_eval_samples_hold_each_trajectory_s_turns(tool_run):
    run_dir, _ = tool_run
    samples = _jsonl(run_dir / "eval_samples.jsonl")
    assert len(samples) == 4  # 2 prompts x 2 samples
    for sample in samples:
        assert sample["turns"] == TURNS
        assert [t["role"] for t in sample["turns"]] == ["assistant", "tool", "tool", "assistant"]


def test_report_shows_collapsible_turns_and_the_eval_samples(tool_run):
    pytest.importorskip("matplotlib", reason="rloo report draws with matplotlib")
    run_dir, _ = tool_run
    page = build_report(run_dir).read_text(encoding="utf-8")
    completions = page[page.index("<h2>Sample completions"):page.index("<h2>Evaluation samples")]
    evals = page[page.index("<h2>Evaluation samples"):page.index("<h2>Config")]
    assert "4 samples in eval_samples.jsonl (written by rloo eval), mean score 1; all shown." in evals
    for section, trajectories in ((completions, 2), (evals, 4)):
        assert section.count('<details class="turn">') == trajectories  # turn 1 closed
        assert section.count('<details class="turn" open>') == trajectories  # the last turn open
        assert section.count("<summary>turn 1 \u00b7 2 tool calls, 1 failed \u00b7 let me add</summary>") == trajectories
        assert section.count("<summary>turn 2 \u00b7 answer \u00b7 it is 3</summary>") == trajectories
        assert section.count('<pre class="call">call \u25b8 add(a=1, b=2)</pre><pre class="result">result \u2192 3</pre>') \
            == trajectories
        assert section.count('<pre class="call">call \u25b8 boom(x=1)</pre><pre class="error">error \u2192 '
                             '{&quot;error&quot;: &quot;ValueError: no&quot;}</pre>') == trajectories
        assert "<th>turns</th>" not in section and "&#x27;role&#x27;" not in section


def test_a_single_turn_run_keeps_its_look(tmp_path, capsys):
    """No tools: rows have no turns, the cells are the completion text, the page has no turns and, without
    eval_samples.jsonl, no evaluation samples section."""
    pytest.importorskip("matplotlib", reason="rloo report draws with matplotlib")
    trainer = _trainer(tmp_path, None, lambda text, row: "it is 3", lambda a: f"{a}+1?")
    trainer.train()
    console = capsys.readouterr().out
    rows = _jsonl(tmp_path / "run" / "completions.jsonl")
    assert list(rows[0]) == ["step", "prompt", "completion", "says_three", "score", "advantage"]
    assert rows[0]["completion"] == "it is 3"
    assert "it is 3" in console and "turn 1" not in console
    page = build_report(tmp_path / "run").read_text(encoding="utf-8")
    assert "<td><pre>it is 3</pre></td>" in page
    assert "<details" not in page and "Evaluation samples" not in page


def test_tampered_turn_records_read_as_text():
    """A completions.jsonl edited by hand: records of the wrong shape, HTML and escapes in them, never raise and never
    reach the page as markup."""
    from rloo.run.report_samples import completions_html

    turns = ["<b>x</b>", {"turn": [1], "role": "tool", "tool_call": "\x1b[2J", "tool_result": {"error": 1}},
             {"turn": 2, "role": "assistant", "text": "<script>"}, {"turn": 2, "role": "tool", "tool_call": {"error": "bad"}}]
    page = completions_html([{"step": 1, "prompt": "p", "completion": "c", "turns": turns}])
    assert "<b>x</b>" not in page and "<script>" not in page and "\x1b" not in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "call \u25b8 malformed: bad" in page
    assert "no result (the trajectory ended with this call)" in page and page.count("<details") == 3

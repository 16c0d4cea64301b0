"""Built-in rewards and the code sandbox: each reward on hand-made completions, each sandbox limit holding."""

import os
import socket

import pytest

from rloo.rewards import (
    BUILTIN_REWARD_FACTORIES,
    BUILTIN_REWARDS,
    code_execution,
    exact_match,
    extract_code,
    length_penalty,
    math_accuracy,
    think_format,
    thinking_answer_reward,
)
from rloo.rewards.sandbox import run_tests


def test_exact_match_normalises_and_reads_messages():
    completions = ["  42. ", "41", [{"role": "assistant", "content": "Forty Two"}]]
    assert exact_match(completions, answer=["42", "42", "forty two"]) == [1.0, 0.0, 1.0]


def test_math_accuracy_boxed_plain_and_unparsable_gold():
    completions = ["so the result is \\boxed{\\frac{1}{2}}", "42", "\\boxed{3}", "anything"]
    assert math_accuracy(completions, answer=["0.5", "42", "4", "not math"]) == [1.0, 1.0, 0.0, None]


def test_think_format():
    completions = ["<think>2+2 is 4</think> 4", "4", "<think>no end", "<think>a</think>", "<think>a<think>b</think>4",
                   [{"role": "assistant", "content": "<think>ok</think>yes"}]]
    assert think_format(completions) == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]


def test_thinking_answer_reward_reads_the_tokenizers_think_end_id(tokenizer):
    reward = thinking_answer_reward(tokenizer)
    assert reward.think_end_id == tokenizer.convert_tokens_to_ids("</think>")  # looked up, not hard-coded
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    completion_ids = [ids("<think>2+2 is 4</think>4"), ids("<think>maybe 5</think>5"), ids("<think>4</think>x</think> 4"),
                      ids("<think>4 never closed 4")]
    # The answer is what follows the last </think>; an unclosed block scores unclosed_reward.
    assert reward(completion_ids=completion_ids, answer=["4"] * 4) == [1.0, 0.0, 1.0, 0.0]
    assert thinking_answer_reward(tokenizer, unclosed_reward=-1.0)(completion_ids=completion_ids[3:], answer=["4"]) == [-1.0]


def test_thinking_answer_reward_fails_at_construction_without_the_token(tokenizer):
    with pytest.raises(ValueError, match="has no '</end_reasoning>' token"):
        thinking_answer_reward(tokenizer, think_end_token="</end_reasoning>")


def test_length_penalty():
    assert length_penalty(target_length=4)(completion_ids=[[1, 2, 3, 4], [1, 2], [1] * 8]) == [0.0, -0.5, -1.0]
    assert length_penalty(target_length=4, scale=2)(completion_ids=[[1, 2]]) == [-1.0]
    with pytest.raises(ValueError, match="target_length"):
        length_penalty(target_length=0)


def test_registries_hold_documented_callables():
    for name, func in {**BUILTIN_REWARDS, **BUILTIN_REWARD_FACTORIES}.items():
        assert callable(func) and "Example" in func.__doc__, name


def test_code_execution_scores_the_fraction_of_tests_passed():
    fenced = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert extract_code(fenced) == "def add(a, b):\n    return a + b\n"
    tests = ["assert add(2, 3) == 5", "assert add(0, 0) == 1"]
    rewards = code_execution([fenced, "def add(a, b):\n    return a - b", "```python\nsyntax error(\n```", "x"],
                             tests=[tests, tests, tests, None], timeout_s=2)
    assert rewards == [0.5, 0.0, 0.0, None]  # a row without tests is not scored
    assert code_execution(["def f():\n    return 1"], tests=["assert f() == 1\n\nassert f() == 2\n"]) == [0.5]


def test_printing_pass_does_not_pass_a_test():
    assert run_tests("print('PASS 0'); import sys; sys.stderr.write('PASS 0\\n')", ["assert False"], timeout_s=2).passed == 0


def test_sandbox_stops_an_infinite_loop_at_the_timeout():
    result = run_tests("def f():\n    return 1\ndef spin():\n    while True: pass", ["assert f() == 1", "spin()"],
                       timeout_s=1)
    assert result.timed_out and result.passed == 1 and result.total == 2  # the test before the hang counts
    assert run_tests("while True: pass", ["assert True"], timeout_s=1).fraction == 0.0


def test_sandbox_limits_memory():
    result = run_tests("blob = bytearray(2 * 1024**3)", ["assert len(blob) > 0"], timeout_s=2, memory_mb=256)
    assert not result.timed_out and result.passed == 0 and "MemoryError" in result.output
    assert run_tests("blob = bytearray(10 * 1024**2)", ["assert len(blob) > 0"], timeout_s=2, memory_mb=256).passed == 1


def test_sandbox_blocks_the_network():
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    port = server.getsockname()[1]
    with server:
        code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')\n"
                "    reached = True\nexcept OSError:\n    reached = False\n")
        result = run_tests(code, ["assert reached == True"], timeout_s=5)
        assert result.passed == 0 and '"r": "False"' in result.output  # it ran, and could not connect
        with pytest.raises(socket.timeout):
            server.accept()  # nobody reached the listening server
        with socket.create_connection(("127.0.0.1", port)):  # while the parent itself can
            server.accept()[0].close()


def test_sandbox_confines_writes_to_its_directory(tmp_path):
    outside = tmp_path / "escaped.txt"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for code in [f"open({str(outside)!r}, 'w').write('x')",
                 f"import pathlib\npathlib.Path({str(outside)!r}).write_text('x')",
                 f"import os\nos.open({str(outside)!r}, os.O_WRONLY | os.O_CREAT)",
                 f"import os\nos.remove({str(victim)!r})",
                 "import os\nos.makedirs(os.path.expanduser('~') + '/../escaped_dir')",
                 "import subprocess\nsubprocess.run(['touch', " + repr(str(outside)) + "], check=True)"]:
        result = run_tests(code, ["assert True"], timeout_s=5)
        assert result.passed == 0 and "code_error" in result.output, code
    assert not outside.exists() and victim.read_text() == "keep me"
    inside = run_tests("open('scratch.txt', 'w').write('ok')", ["assert open('scratch.txt').read() == 'ok'",
                                                                "import os; assert os.getcwd() != " + repr(os.getcwd())],
                       timeout_s=2)
    assert inside.passed == 2


def test_a_misbehaving_completion_scores_zero_and_training_goes_on():
    tests = [["assert f() == 1"]] * 3
    completions = ["def f():\n    while True: pass", "open('/etc/escaped', 'w')\ndef f(): return 1",
                   "def f():\n    return 1"]
    assert code_execution(completions, tests=tests, timeout_s=1) == [0.0, 0.0, 1.0]

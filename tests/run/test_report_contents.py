"""What `rloo report` shows of a run: what was trained, per-reward curves, eval panels by scale,
flat panels left out, completions before the config, and only the settings that matter."""

import json
import re

import pytest
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer
from rloo.run.report import build_report, describe_run, eval_family, is_flat, run_card, used_settings


def digits(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def brevity(completions, **kwargs):
    return [-len(c) / 10 for c in completions]


@pytest.fixture
def run_dir(tmp_path, make_model, tokenizer):
    model_dir = tmp_path / "tiny-qwen2"
    make_model().save_pretrained(model_dir)  # a model with a name, as one loaded from disk or the Hub
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    data = Dataset.from_list([{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(8) for b in range(8)])
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=2,
                      max_completion_length=4, max_steps=4, logging_steps=1, save_steps=0, eval_steps=2,
                      log_completions=True, num_completions_to_print=2, seed=0, beta=0.0,
                      reward_weights=[1.0, 0.5], vllm_gpu_memory_utilization=0.5)  # vLLM set, but not run
    RLOOTrainer(model, [digits, brevity], args=args, train_dataset=data, eval_dataset=data.select(range(4)),
                processing_class=tokenizer).train()
    return tmp_path / "run"


def test_run_json_names_model_dataset_and_rewards(run_dir, tmp_path):
    card = json.loads((run_dir / "run.json").read_text())
    assert card["model"]["name_or_path"] == str(tmp_path / "tiny-qwen2")
    assert card["model"]["class"] == "Qwen2ForCausalLM" and card["model"]["parameters"] > 0
    assert card["dataset"]["rows"] == 64 and card["dataset"]["columns"] == ["prompt", "answer"]
    assert card["reward_functions"] == [{"name": "digits", "weight": 1.0}, {"name": "brevity", "weight": 0.5}]
    assert card["config"]["beta"] == 0.0


def test_report_page_reads_top_to_bottom(run_dir, tmp_path):
    pytest.importorskip("matplotlib", reason="rloo report needs matplotlib (pip install matplotlib)")
    page = build_report(run_dir).read_text()
    head = page[: page.index("<h2>Training")]
    assert f"Model: {tmp_path / 'tiny-qwen2'} (Qwen2ForCausalLM" in head
    assert "64 rows, columns prompt, answer" in head
    assert "Reward functions: digits, brevity (weight 0.5)" in head
    titles = re.findall(r'<img alt="([^"]+)"', page)
    assert "Reward function: digits (band: std)" in titles and "Reward function: brevity (band: std)" in titles
    # beta 0 and one pass per batch: KL and clip fractions are 0 by construction, named, not drawn
    assert "KL to the reference" not in titles and "Clip fractions" not in titles
    assert re.search(r"Left out, the same at every log: [^<]*KL to the reference \(0\)[^<]*Clip fractions \(0\)", page)
    # the eval reward has an axis of its own: no 0-1 rate or length shares it
    assert "eval reward" in titles and "eval reward and rates" not in titles
    assert eval_family("eval/completions/clipped_ratio") == "eval rates (0 to 1)"
    assert page.index("<h2>Sample completions") < page.index("<h2>Config")
    config = page[page.index("<h2>Config"):]
    assert "<th>num_generations</th><td>2</td>" in config and "<th>learning_rate</th>" in config  # core, default or not
    assert "<th>epsilon</th>" not in config  # a default that is not core
    assert "<th>vllm_gpu_memory_utilization</th>" not in config  # set, but vLLM did not run


def test_report_counts_and_shows_the_eval_rloo_eval_wrote(run_dir):
    pytest.importorskip("matplotlib", reason="rloo report needs matplotlib (pip install 'rloo[plots]')")
    assert "2 evals during training." in build_report(run_dir).read_text()  # eval_steps=2 of 4 steps
    (run_dir / "eval_results.json").write_text(json.dumps({
        "model": "runs/x", "dataset": "data", "split": "test", "prompts": 64, "num_generations": 4,
        "eval/reward": 0.4125, "eval/rewards/digits/pass@4": 0.75}))
    page = build_report(run_dir).read_text()
    assert "2 evals during training, and 1 by rloo eval (eval_results.json)." in page
    section = page[page.index("<h2>rloo eval</h2>"):]
    assert "model runs/x, dataset data, split test, prompts 64, num_generations 4" in section
    assert "<th>eval/reward</th><td>0.4125</td>" in section and "<th>eval/rewards/digits/pass@4</th><td>0.75</td>" in section


def test_report_without_run_json_says_so(run_dir):
    pytest.importorskip("matplotlib", reason="rloo report needs matplotlib (pip install matplotlib)")
    (run_dir / "run.json").unlink()
    assert "run.json not found" in build_report(run_dir).read_text()


def test_used_settings_keeps_core_and_changed_values():
    defaults = {"learning_rate": 1e-6, "epsilon": 0.2, "sampler": "fast", "vllm_mode": "colocate", "top_k": 0}
    config = {"learning_rate": 1e-6, "epsilon": 0.2, "sampler": "fast", "vllm_mode": "server", "top_k": 5}
    assert used_settings(config, defaults) == {"learning_rate": 1e-6, "top_k": 5}
    assert used_settings({**config, "sampler": "vllm"}, defaults) == {"learning_rate": 1e-6, "sampler": "vllm",
                                                                      "vllm_mode": "server", "top_k": 5}


def test_flat_panels_and_eval_families():
    assert is_flat([{"kl": 0.0}, {"kl": 0.0}], [("kl", "kl")])
    assert not is_flat([{"kl": 0.0}, {"kl": 0.1}], [("kl", "kl")])
    assert [eval_family(k) for k in ("eval/reward", "eval/rewards/acc/mean", "eval/rewards/acc/pass@4",
                                     "eval/completions/mean_length", "eval/frac_reward_zero_std")] == [
        "eval reward", "eval reward: acc", "eval pass@k", "eval length", "eval rates (0 to 1)"]


def test_run_card_of_a_file_dataset(tmp_path, make_model):
    from datasets import load_dataset

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(5)))
    data = load_dataset("json", data_files=str(path), split="train")
    card = run_card(make_model(), data, ["acc"], [1.0], {})
    assert card["dataset"] == {"name": "json", "config": "default", "split": "train", "rows": 5,
                               "columns": ["prompt", "answer"]}
    assert describe_run(card)[1] == "Dataset: json (config default, split train), 5 rows, columns prompt, answer"

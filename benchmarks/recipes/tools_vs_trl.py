"""A calculator-tool recipe (recipes/gsm8k_tools_cpu.yaml by default): rloo's RLOOTrainer against TRL 1.16's GRPOTrainer.

    python benchmarks/recipes/tools_vs_trl.py --steps 3            # both systems, one fresh process each
    python benchmarks/recipes/tools_vs_trl.py --steps 3 --systems trl trl_defaults
    python benchmarks/recipes/tools_vs_trl.py --recipe recipes/arithmetic_tools_cpu.yaml --steps 30 --seed 0 \
        --systems trl --save-dir runs/arith/trl-s0 --out arithmetic_trl_s0.json
                       # one system, its final model, tokenizer and log history kept in --save-dir for `rloo eval`

TRL's RLOOTrainer takes no tools, so TRL runs as GRPOTrainer, set to the closest match of rloo's RLOO loss:
beta 0 for both; loss_type="dr_grpo" (each completion's token losses summed, averaged over completions, and
divided by the constant max_completion_length: rloo's default "seq-mean-token-sum" up to that constant, where
"grpo" would divide each completion by its own length and "dapo"/"bnpo" by the batch's token count);
scale_rewards="none" (rloo does not divide advantages by a standard deviation). The system "trl_defaults" runs
GRPOTrainer again at TRL's own loss_type ("dapo") and scale_rewards ("group"), beta 0 as well. GRPO's baseline is the group
mean including the completion itself, so its advantages are (K - 1) / K times RLOO's leave-one-out ones (0.75 at
K = 4): the same direction, a constant scale. Same model, template, tool, reward functions, sampling settings,
seed and threads for both; rloo keeps its recipe's own settings (shared_prefix_forward, max_prompt_length).

TRL parses tool calls with transformers' response parsing and knows the response format only of chat templates
it recognises (`trl.chat_template_utils.add_response_schema`); SmolLM2 with recipes/templates/smollm2_tools.jinja
is not one of them. The script records the error TRL raises as is, then sets the tokenizer's `response_template`
to TRL's own Hermes / Qwen3 one (`trl.chat_template_utils.qwen3_template`: `<tool_call>` JSON blocks, the format
the template renders), which is what makes TRL run.

Reports, per system: seconds per optimizer step (train() alone), CPU seconds per step, peak RSS and its growth
during train(), the tools/ metrics both log, each reward function's mean per step. Results:
benchmarks/results/tools_vs_trl.json (--out names another file there).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "memory"))  # benchmarks/memory/memory.py
sys.path.insert(0, str(ROOT / "recipes" / "tools"))

from memory import rss_bytes  # noqa: E402
from recipes import load_model, process_cpu_seconds, reward_functions, step_means, train_dataset  # noqa: E402

RECIPE = "recipes/gsm8k_tools_cpu.yaml"
SHARED = ["num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "max_completion_length",
          "temperature", "learning_rate", "lr_scheduler_type", "max_grad_norm", "beta", "reward_weights",
          "max_steps", "seed", "logging_steps", "max_tool_calling_iterations"]


def build_trainer(system: str, recipe: dict, model, tokenizer, rewards, tools, output_dir: str):
    shared = {k: recipe[k] for k in SHARED if k in recipe}
    if system in ("trl", "trl_defaults"):
        from trl import GRPOConfig, GRPOTrainer

        # "trl" is set to rloo's loss; "trl_defaults" keeps TRL's own loss_type ("dapo") and scale_rewards ("group")
        matched = {"loss_type": "dr_grpo", "scale_rewards": "none"} if system == "trl" else {}
        args = GRPOConfig(**shared, **matched, output_dir=output_dir,
                          gradient_checkpointing=False, disable_dropout=True, use_vllm=False, report_to="none",
                          save_strategy="no", disable_tqdm=True, use_cpu=True, bf16=False, top_p=1.0, top_k=0,
                          dataloader_num_workers=0, warmup_steps=0, weight_decay=0.0)
        return GRPOTrainer(model=model, reward_funcs=rewards, args=args, train_dataset=train_dataset(recipe),
                           processing_class=tokenizer, tools=tools)
    from rloo import RLOOConfig, RLOOTrainer

    args = RLOOConfig(**shared, max_prompt_length=recipe.get("max_prompt_length"), tool_call_timeout=recipe["tool_call_timeout"],
                      shared_prefix_forward=recipe["shared_prefix_forward"], output_dir=output_dir, save_steps=0,
                      bf16=False, top_p=1.0, top_k=0, report_to=[], warmup_steps=0, weight_decay=0.0)
    return RLOOTrainer(model, rewards, args=args, train_dataset=train_dataset(recipe), processing_class=tokenizer,
                       tools=tools)


def trl_without_a_response_template(recipe: dict, model, tokenizer, rewards, tools) -> str | None:
    """The error TRL raises on the template as it is (None if it accepts it)."""
    with tempfile.TemporaryDirectory() as output_dir:
        try:
            build_trainer("trl", recipe, model, tokenizer, rewards, tools, output_dir)
        except Exception as error:  # what TRL says is the result here
            return f"{type(error).__name__}: {error}"
    return None


def run_worker(spec: dict) -> dict:
    import torch
    from calculator import calculator

    torch.set_num_threads(spec["threads"])
    recipe = spec["recipe"]
    model, tokenizer = load_model(recipe)
    rewards = reward_functions(recipe)
    result = {"system": spec["system"], "steps": recipe["max_steps"]}
    if spec["system"] in ("trl", "trl_defaults"):
        result["error_without_response_template"] = trl_without_a_response_template(recipe, model, tokenizer, rewards,
                                                                                    [calculator])
        if getattr(tokenizer, "response_template", None) is None:
            from trl.chat_template_utils import qwen3_template

            tokenizer.response_template = qwen3_template
    with tempfile.TemporaryDirectory() as scratch:
        output_dir = spec.get("save_dir") or scratch
        trainer = build_trainer(spec["system"], recipe, model, tokenizer, rewards, [calculator], output_dir)
        rss_before_train_mb = rss_bytes() / 2**20
        start, cpu_start = time.perf_counter(), process_cpu_seconds()
        trainer.train()
        seconds, cpu_seconds = time.perf_counter() - start, process_cpu_seconds() - cpu_start
        history = trainer.state.log_history
        if spec.get("save_dir"):  # the final model, for `rloo eval --model <save_dir>`
            trainer.save_model(output_dir)
            tokenizer.save_pretrained(output_dir)
            Path(output_dir, "log_history.json").write_text(json.dumps(history, indent=1))
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    per_step = recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"]
    tools = {key: [entry[key] for entry in history if key in entry]
             for key in ("tools/call_frequency", "tools/failure_frequency")}
    return {**result, "seconds_per_step": seconds / recipe["max_steps"],
            "cpu_seconds_per_step": cpu_seconds / recipe["max_steps"],
            "peak_rss_mb": peak_rss_mb, "rss_before_train_mb": rss_before_train_mb,
            "growth_in_train_mb": peak_rss_mb - rss_before_train_mb, "tools": tools,
            "reward_function_curves": {r.__name__: step_means(r.calls, per_step) for r in rewards}}


def spawn(spec: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(spec["threads"]),
           "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True, env=env,
                          cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{spec['system']} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--systems", nargs="+", default=["rloo", "trl", "trl_defaults"],
                        choices=["rloo", "trl", "trl_defaults"],
                        help="trl: GRPOTrainer with loss_type='dr_grpo', scale_rewards='none' (rloo's loss); "
                             "trl_defaults: GRPOTrainer at its own loss_type/scale_rewards ('dapo', 'group'); beta 0 all")
    parser.add_argument("--model", default=None,
                        help="a model folder in place of the recipe's (e.g. recipes/models/smollm2-135m-instruct-sft-tools, "
                             "from `python recipes/prepare.py smollm2-sft-tools`, which calls the calculator)")
    parser.add_argument("--max-completion-length", type=int, default=None, help="in place of the recipe's")
    parser.add_argument("--recipe", default=RECIPE, help="the tool recipe both systems run (a path from the repository root)")
    parser.add_argument("--save-dir", default=None,
                        help="keep the final model, tokenizer and log history here (one system only)")
    parser.add_argument("--out", default="tools_vs_trl.json", help="file name under benchmarks/results/")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        print(json.dumps(run_worker(json.loads(options.worker))))
        return
    if options.save_dir and len(options.systems) != 1:
        parser.error("--save-dir keeps one system's model: give one --systems entry")
    recipe = {**yaml.safe_load((ROOT / options.recipe).read_text()), "max_steps": options.steps, "seed": options.seed}
    if options.model:
        recipe["model_name_or_path"] = options.model
    if options.max_completion_length:
        recipe["max_completion_length"] = options.max_completion_length
    results = []
    for system in options.systems:
        try:
            result = spawn({"system": system, "recipe": recipe, "threads": options.threads,
                            "save_dir": str(ROOT / options.save_dir) if options.save_dir else None})
        except RuntimeError as error:  # one system failing still leaves the others' figures
            print(error)
            results.append({"system": system, "error": str(error)[-2000:]})
            continue
        results.append(result)
        print(f"{system}: {result['seconds_per_step']:.1f} s/step wall, {result['cpu_seconds_per_step']:.1f} CPU s/step, "
              f"peak RSS {result['peak_rss_mb']:.0f} MB (+{result['growth_in_train_mb']:.0f} MB in train()), "
              f"tools {result['tools']}")
        if result.get("error_without_response_template"):
            print(f"  TRL without a response template: {result['error_without_response_template']}")
    out = HERE.parent / "results" / options.out
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(sys.argv), "recipe": recipe, "results": results}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""rloo against TRL's RLOOTrainer on identical work, side by side, one process per run.

    python benchmarks/speed/vs_trl.py      # full run at beta 0 and 0.05 (the beta-0 half: about 25 min on 2 quiet cores)
    python benchmarks/speed/vs_trl.py --scenario short-k4 --repeats 1 --episodes 1024 --betas 0   # a quick check

Every run trains the same local model (saved once to --cache-dir) on the same prompts with the same
hyper-parameters, in a fresh process with one intra-op thread, alternating TRL and rloo. Each run
reports episodes/s and generated tokens/s of `train()` alone (model loading and evaluation are
outside the clock), peak RSS, the mean reward of the first and last tenth of the run, held-out
greedy accuracy before and after, and useful model FLOP/s (2N per prompt or generated token, 6N per
trained token) as a fraction of the measured single-thread matmul peak. The summary prints medians
per system and the ratios rloo/TRL, and writes JSON and a markdown table to --out.

The tokenizer prepends BOS to every prompt (a post-processor, as Llama's, Mistral's and Gemma's
do; `--no-bos` for the plain toy tokenizer), and the warm start learns from BOS-prefixed prompts.
Every scenario runs at each of `--betas` (default 0 and the library default 0.05): at beta 0 rloo
skips the reference pass, which flatters it; at 0.05 both systems pay for the KL.

Scenarios (episodes = completions generated and trained on):
  short-k4, short-k8  two-digit addition, the warm-started 2.2M-parameter toy model, completions <= 8 tokens
  long                reverse a 32-64 character string, completions <= 96 tokens, dense per-character
                      reward, the 2.2M model from random init (throughput only: rewards stay near 0)
  wide                two-digit addition with a 25M-parameter model from random init, completions <= 8 tokens
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))  # this checkout's rloo wins over any installed copy

THREADS = 1  # one intra-op thread for both systems: spinning OpenMP threads wreck timings on shared cores
WIDE_MODEL = dict(hidden_size=512, num_layers=7, num_heads=8, num_kv_heads=4, intermediate_size=2048)


@dataclass
class Scenario:
    """One workload; both systems get exactly these hyper-parameters."""

    name: str
    task: str  # "addition" or "reverse"
    model: str  # "warm" (cached warm start), "small" (2.2M random init) or "wide" (25M random init)
    num_generations: int
    completions_per_step: int  # per_device_train_batch_size of both trainers (counted in completions)
    max_completion_length: int
    episodes: int  # default; --episodes overrides
    learning_rate: float
    num_eval: int  # held-out prompts for greedy accuracy
    beta: float = 0.0
    temperature: float = 1.0
    bf16: bool = False  # bf16 autocast in both trainers (--bf16); fp32 otherwise
    bos: bool = True  # the tokenizer prepends BOS to prompts, as most real tokenizers do (--no-bos: it does not)


SCENARIOS = {
    s.name: s
    for s in [
        Scenario("short-k4", "addition", "warm", 4, 32, 8, episodes=8192, learning_rate=3e-5, num_eval=500),
        Scenario("short-k8", "addition", "warm", 8, 64, 8, episodes=8192, learning_rate=3e-5, num_eval=500),
        Scenario("long", "reverse", "small", 4, 32, 96, episodes=512, learning_rate=3e-5, num_eval=64),
        Scenario("wide", "addition", "wide", 4, 32, 8, episodes=1024, learning_rate=3e-5, num_eval=200),
    ]
}


# ---------------------------------------------------------------------------------------------
# Shared pieces: the model on disk, the data, the reward that also counts the work done
# ---------------------------------------------------------------------------------------------


def prepare_model(scenario: Scenario, cache_dir: Path) -> Path:
    """Save the scenario's starting model and tokenizer once; every run loads this directory."""
    from rloo.toy import build_char_tokenizer, build_tiny_model, warm_started_addition_model

    path = cache_dir / f"model-{scenario.model}{'-bos' if scenario.bos else ''}"
    if path.is_dir():
        return path
    if scenario.model == "warm":
        model, tokenizer = warm_started_addition_model(cache_dir / "warm-start", add_bos=scenario.bos)
    else:
        tokenizer = build_char_tokenizer(add_bos=scenario.bos)
        model = build_tiny_model(tokenizer, seed=0, **(WIDE_MODEL if scenario.model == "wide" else {}))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def datasets_for(scenario: Scenario):
    """(train, held-out) Datasets with "prompt" and "answer" columns."""
    from rloo.toy import ADDITION_NUM_EVAL, ADDITION_NUM_TRAIN, addition_split, reverse_dataset

    if scenario.task == "addition":  # the warm start's own split: its held-out set was never trained on
        train, held_out = addition_split(ADDITION_NUM_TRAIN, ADDITION_NUM_EVAL)
        return train, held_out.select(range(min(scenario.num_eval, len(held_out))))
    return reverse_dataset(4096, seed=0), reverse_dataset(scenario.num_eval, seed=1)


class CountingReward:
    """The scenario's reward, in TRL's shape f(prompts, completions, completion_ids, **columns),
    recording each call's mean reward and token counts so that both systems are measured alike."""

    def __init__(self, task: str, tokenizer):
        from rloo.toy import char_match_reward, exact_match_reward

        self.reward = exact_match_reward if task == "addition" else char_match_reward
        self.__name__ = self.reward.__name__
        self.tokenizer = tokenizer
        self.calls: list[dict] = []

    def __call__(self, prompts, completions, completion_ids, answer, **kwargs):
        rewards = self.reward(completions, answer)
        prompt_tokens = [len(self.tokenizer(p)["input_ids"]) for p in prompts]  # as both trainers tokenize them (BOS too)
        self.calls.append({
            "reward": sum(rewards) / len(rewards),
            "completion_tokens": sum(len(ids) for ids in completion_ids),  # up to and including EOS
            "prompt_tokens": sum(prompt_tokens),  # every completion's copy of its prompt
            "distinct_prompt_tokens": sum(dict(zip(prompts, prompt_tokens)).values()),
        })
        return rewards


def held_out_score(model, tokenizer, scenario: Scenario, held_out) -> float:
    """Greedy exact-match accuracy (addition) or mean per-character reward (reverse)."""
    from rloo.toy import char_match_reward, greedy_completions

    texts = greedy_completions(model, tokenizer, list(held_out["prompt"]), max_new_tokens=scenario.max_completion_length)
    answers = list(held_out["answer"])
    if scenario.task == "addition":
        return sum(t == a for t, a in zip(texts, answers)) / len(answers)
    return sum(char_match_reward(texts, answers)) / len(answers)


# ---------------------------------------------------------------------------------------------
# The two trainers, configured identically
# ---------------------------------------------------------------------------------------------


def shared_hyperparameters(scenario: Scenario, output_dir: str, seed: int) -> dict:
    """The settings both trainers get, under the field names both configs share: one dict, so the
    two runs cannot drift apart."""
    steps = scenario.episodes // scenario.completions_per_step
    return dict(
        output_dir=output_dir,
        per_device_train_batch_size=scenario.completions_per_step,  # counted in completions by both
        gradient_accumulation_steps=1,
        num_generations=scenario.num_generations,
        max_completion_length=scenario.max_completion_length,
        temperature=scenario.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=scenario.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=scenario.beta,
        num_iterations=1,
        epsilon=0.2,
        max_steps=steps,
        seed=seed,
        bf16=scenario.bf16,  # TRL defaults to bf16, rloo to fp32: set explicitly, the same for both
        logging_steps=max(steps, 1),  # log once: the console is not what is measured
    )


def build_trl_trainer(scenario: Scenario, model, tokenizer, train, reward, output_dir: str, seed: int):
    from trl import RLOOConfig, RLOOTrainer

    config = RLOOConfig(
        **shared_hyperparameters(scenario, output_dir, seed),
        gradient_checkpointing=False,  # TRL defaults to True; rloo to False (recompute is pure overhead here)
        disable_dropout=True,  # rloo's default (the toy models have no dropout anyway)
        use_vllm=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
    )
    return RLOOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=train, processing_class=tokenizer)


def build_rloo_trainer(scenario: Scenario, model, tokenizer, train, reward, output_dir: str, seed: int):
    from rloo import RLOOConfig, RLOOTrainer

    config = RLOOConfig(**shared_hyperparameters(scenario, output_dir, seed), save_steps=0)
    return RLOOTrainer(model, reward, args=config, train_dataset=train, processing_class=tokenizer)


def run_one(system: str, scenario: Scenario, model_dir: str, seed: int) -> dict:
    """Train once in this process and return its measurements (the worker side)."""
    import transformers

    torch.set_num_threads(THREADS)
    transformers.logging.set_verbosity_error()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    train, held_out = datasets_for(scenario)
    reward = CountingReward(scenario.task, tokenizer)
    accuracy_before = held_out_score(model, tokenizer, scenario, held_out)
    build = build_trl_trainer if system == "trl" else build_rloo_trainer
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = build(scenario, model, tokenizer, train, reward, output_dir, seed)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    accuracy_after = held_out_score(model, tokenizer, scenario, held_out)  # both trainers train `model` in place

    calls = reward.calls
    tenth = max(1, len(calls) // 10)
    episodes = scenario.episodes // scenario.completions_per_step * scenario.completions_per_step
    generated = sum(c["completion_tokens"] for c in calls)
    num_params = sum(p.numel() for p in model.parameters())
    # Useful work: each distinct prompt prefilled once, each generated token decoded once, and a
    # forward + backward over every completion with its prompt.
    useful_flops = (2 * num_params * sum(c["distinct_prompt_tokens"] + c["completion_tokens"] for c in calls)
                    + 6 * num_params * sum(c["prompt_tokens"] + c["completion_tokens"] for c in calls))
    return {
        "system": system,
        "scenario": scenario.name,
        "beta": scenario.beta,
        "seed": seed,
        "seconds": seconds,
        "episodes": episodes,
        "episodes_per_s": episodes / seconds,
        "generated_tokens_per_s": generated / seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "reward_start": sum(c["reward"] for c in calls[:tenth]) / tenth,
        "reward_end": sum(c["reward"] for c in calls[-tenth:]) / tenth,
        "held_out_before": accuracy_before,
        "held_out_after": accuracy_after,
        "useful_gflop_per_s": useful_flops / seconds / 1e9,
        "num_params": num_params,
    }


# ---------------------------------------------------------------------------------------------
# The driver: prepare, alternate runs in subprocesses, summarise
# ---------------------------------------------------------------------------------------------


def matmul_peak_gflops(dtype: torch.dtype, size: int = 1024, repeats: int = 10) -> float:
    """Best observed GFLOP/s of a square matmul with THREADS threads: the hardware's practical peak."""
    torch.set_num_threads(THREADS)
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    torch.matmul(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def spawn(system: str, scenario: Scenario, model_dir: Path, seed: int) -> dict:
    """Run one training in a fresh Python process and parse its JSON line."""
    spec = json.dumps({"system": system, "scenario": asdict(scenario), "model_dir": str(model_dir), "seed": seed})
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, __file__, "--worker", spec], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{system} run on {scenario.name} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


METRICS = ["episodes_per_s", "generated_tokens_per_s", "peak_rss_mb", "reward_start", "reward_end",
           "held_out_before", "held_out_after", "useful_gflop_per_s"]


def summarise(runs: list[dict], peaks: dict[str, float]) -> dict:
    """Medians per (scenario, system), ratios rloo/TRL, and FLOP utilisation against the fp32 peak."""
    summary = {}
    for scenario in dict.fromkeys(r["scenario"] for r in runs):
        row = {}
        for system in ("trl", "rloo"):
            mine = [r for r in runs if r["scenario"] == scenario and r["system"] == system]
            row[system] = {m: statistics.median(r[m] for r in mine) for m in METRICS}
            row[system]["fp32_peak_fraction"] = row[system]["useful_gflop_per_s"] / peaks["fp32"]
        row["ratio"] = {m: row["rloo"][m] / row["trl"][m] for m in ("episodes_per_s", "generated_tokens_per_s", "peak_rss_mb")}
        summary[scenario] = row
    return summary


def markdown_table(summary: dict, peaks: dict[str, float], header: str) -> str:
    lines = [header, "",
             "| scenario | system | episodes/s | gen tokens/s | peak RSS MB | reward start → end | held-out before → after "
             "| useful GFLOP/s (% fp32 peak) |",
             "|---|---|---:|---:|---:|---|---|---:|"]
    for scenario, row in summary.items():
        for system in ("trl", "rloo"):
            m = row[system]
            lines.append(
                f"| {scenario} | {system} | {m['episodes_per_s']:.1f} | {m['generated_tokens_per_s']:.0f} "
                f"| {m['peak_rss_mb']:.0f} "
                f"| {m['reward_start']:.3f} → {m['reward_end']:.3f} | {m['held_out_before']:.3f} → {m['held_out_after']:.3f} "
                f"| {m['useful_gflop_per_s']:.1f} ({100 * m['fp32_peak_fraction']:.0f}%) |")
        r = row["ratio"]
        lines.append(f"| {scenario} | **rloo/TRL** | **{r['episodes_per_s']:.2f}x** | {r['generated_tokens_per_s']:.2f}x "
                     f"| {r['peak_rss_mb']:.2f}x | | | |")
    lines += ["", f"Measured matmul peak ({THREADS} thread, 1024x1024): fp32 {peaks['fp32']:.1f} GFLOP/s, "
                  f"bf16 {peaks['bf16']:.1f} GFLOP/s."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=["all", *SCENARIOS], default="all")
    parser.add_argument("--repeats", type=int, default=3, help="alternating TRL/rloo pairs per scenario")
    parser.add_argument("--episodes", type=int, default=None, help="override every scenario's episode count")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every scenario's default episode count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast in both trainers (default fp32)")
    parser.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.05],
                        help="run every scenario at each of these KL coefficients (0.05 is rloo's default)")
    parser.add_argument("--no-bos", action="store_true", help="the plain toy tokenizer, which adds no BOS")
    parser.add_argument("--cache-dir", type=Path, default=HERE.parent / ".cache")
    parser.add_argument("--out", type=Path, default=HERE.parent / "results")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    options = parser.parse_args()

    if options.worker:  # child process: one training run, one JSON line on stdout
        spec = json.loads(options.worker)
        print(json.dumps(run_one(spec["system"], Scenario(**spec["scenario"]), spec["model_dir"], spec["seed"])))
        return

    scenarios = list(SCENARIOS.values()) if options.scenario == "all" else [SCENARIOS[options.scenario]]
    def episodes(s: Scenario) -> int:  # whole optimizer steps
        wanted = options.episodes or s.episodes * options.scale
        return max(1, round(wanted / s.completions_per_step)) * s.completions_per_step

    def named(s: Scenario, beta: float) -> str:  # "short-k4" at beta 0, "short-k4-b0.05" otherwise
        return s.name if beta == 0 else f"{s.name}-b{beta:g}"

    scenarios = [Scenario(**{**asdict(s), "name": named(s, beta), "beta": beta, "episodes": episodes(s),
                             "bf16": options.bf16, "bos": not options.no_bos})
                 for s in scenarios for beta in options.betas]
    peaks = {"fp32": matmul_peak_gflops(torch.float32), "bf16": matmul_peak_gflops(torch.bfloat16)}
    print(f"matmul peak with {THREADS} thread: fp32 {peaks['fp32']:.1f} GFLOP/s, bf16 {peaks['bf16']:.1f} GFLOP/s", flush=True)
    runs = []
    for scenario in scenarios:
        model_dir = prepare_model(scenario, options.cache_dir)
        for repeat in range(options.repeats):
            for system in ("trl", "rloo"):  # alternate, so that drifting machine load hits both alike
                run = spawn(system, scenario, model_dir, options.seed + repeat)
                runs.append(run)
                print(f"{scenario.name:9s} {system:4s} repeat {repeat}: {run['episodes_per_s']:7.1f} episodes/s, "
                      f"{run['generated_tokens_per_s']:7.0f} tokens/s, RSS {run['peak_rss_mb']:.0f} MB, "
                      f"reward {run['reward_start']:.3f} -> {run['reward_end']:.3f}, "
                      f"held-out {run['held_out_before']:.3f} -> {run['held_out_after']:.3f}", flush=True)

    summary = summarise(runs, peaks)
    header = (f"rloo vs TRL {__import__('trl').__version__}, medians of {options.repeats} alternating repeats, "
              f"{THREADS} intra-op thread each, {'bf16 autocast' if options.bf16 else 'fp32'}, torch {torch.__version__}, "
              f"{'CUDA ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}, "
              f"tokenizer {'without' if options.no_bos else 'adding'} BOS; episodes: "
              + ", ".join(f"{s.name} {s.episodes}" for s in scenarios))
    table = markdown_table(summary, peaks, header)
    print("\n" + table)
    options.out.mkdir(parents=True, exist_ok=True)
    stem = (("vs_trl" if options.scenario == "all" else f"vs_trl_{options.scenario}") + ("_bf16" if options.bf16 else "")
            + ("_nobos" if options.no_bos else "")
            + ("" if options.betas == [0.0, 0.05] else "_beta" + "_".join(f"{b:g}" for b in options.betas)))
    (options.out / f"{stem}.json").write_text(json.dumps({"peaks_gflops": peaks, "summary": summary, "runs": runs,
                                                          "scenarios": [asdict(s) for s in scenarios]}, indent=2))
    (options.out / f"{stem}.md").write_text(table + "\n")


if __name__ == "__main__":
    main()

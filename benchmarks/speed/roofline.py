"""Where a CPU step's time goes against this machine's limit, rloo and TRL side by side.

    python recipes/prepare.py gsm8k smollm2 --gsm8k-dir ../shared/data/gsm8k
    python benchmarks/speed/roofline.py          # the full run, on an idle machine (docs/benchmarks.md, "The limit on CPU")
    python benchmarks/speed/roofline.py --tiny   # a quick check of the script: 16 new tokens, 1 timed step, 1 round

Three parts, written to benchmarks/results/roofline[_<tag>].json:

- peak: this machine's fp32 matrix-multiply rate (a 2048^3 product, median of 10 after 3 warm-ups), with torch's
  threads = the cores and with one thread;
- recipe: the SmolLM2 gsm8k recipe step (recipes/gsm8k_cpu.yaml, the settings benchmarks/recipes/recipes.py gives both
  trainers), each system in a fresh process with threads = cores, after --warmup steps: seconds and model FLOPs in
  generation (rloo's sampler, TRL's `generate`), the no-grad passes (reference / old log-probs: none at the
  recipe's beta 0 with one iteration) and the training pass (forward and backward with grad), and the achieved
  FLOP/s as a fraction of the measured peak. FLOPs are those each system executes: 2 N_decoder per token through
  the decoder, 2 V H per completion token through the head, causal attention; a prompt counts once per group where
  the system runs it once (rloo's one prefill per prompt, its shared-prefix training forward) and once per row where
  it runs it per row (TRL); completions count at the length the batch is padded to (the longest of the step for
  TRL's `generate` and training batch, of each group for rloo, whose micro-batch is one group in this recipe);
- contention: one step's generation (the recipe's 2 prompts x K = 4, its temperature) by rloo's FastSampler and by
  `generate` on the K-times repeated prompts (TRL's way), with threads = cores, alone and while another process
  spins on one core; and rloo with one thread fewer under the same neighbour (is fewer threads the better choice on
  a shared machine?). Rounds alternate the conditions; medians are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's rloo wins over any installed copy
sys.path.insert(0, str(HERE.parent / "gpu"))  # benchmarks/gpu/gpu_check.py
sys.path.insert(0, str(HERE.parent / "recipes"))  # benchmarks/recipes/recipes.py

from gpu_check import Budget, Phases, decoder_matrix_parameters, matmul_peak, step_clock  # noqa: E402


def model_shape(config) -> dict:
    """The config values the FLOP count reads, from a transformers config."""
    values = config.to_dict()
    if values.get("head_dim") is None:
        values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    return values


def pass_flops(shape: dict, prompt_runs: float, prompt_tokens: float, rows: float, completion_tokens: float) -> float:
    """Model FLOPs of one forward: `prompt_runs` prompts of `prompt_tokens` run through the decoder, `rows`
    completions of `completion_tokens` through the decoder and the head, each completion attending to its prompt
    and causally to itself. A generation (prefill + decode) is one such forward; a training pass is 3 of them."""
    decoder = 2 * decoder_matrix_parameters(shape) * (prompt_runs * prompt_tokens + rows * completion_tokens)
    head = 2 * shape["vocab_size"] * shape["hidden_size"] * rows * completion_tokens
    width, layers = shape["num_attention_heads"] * shape["head_dim"], shape["num_hidden_layers"]
    attention_pairs = (prompt_runs * prompt_tokens * (prompt_tokens + 1) / 2
                       + rows * (completion_tokens * prompt_tokens + completion_tokens * (completion_tokens + 1) / 2))
    return decoder + head + 4 * width * layers * attention_pairs


# ---------------------------------------------------------------------------------------------
# The recipe step, one system per process
# ---------------------------------------------------------------------------------------------


def recipe_worker(spec: dict) -> dict:
    """Train `spec["system"]` on the recipe for warm-up + timed steps and return each step's phase seconds and FLOPs."""
    import recipes as recipe_bench  # benchmarks/recipes/recipes.py: the same settings, model and rewards for both systems

    torch.set_num_threads(spec["threads"])
    recipe = recipe_bench.load_recipe("gsm8k", spec["warmup"] + spec["steps"], [], spec["settings"])
    model, tokenizer = recipe_bench.load_model(recipe)
    shape = model_shape(model.config)
    rewards = recipe_bench.reward_functions(recipe)
    tap_lengths(rewards[0])
    k = recipe["num_generations"]
    phases = Phases("cpu")
    prompts_seen: list[list[int]] = []  # each step's prompt lengths, one per distinct prompt

    clock = step_clock("cpu", phases, NoTokenCount(), spec["warmup"], Budget(float("inf")))
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = recipe_bench.build_trainer(spec["system"], recipe, model, tokenizer, rewards, output_dir)
        (trainer.callback_handler if spec["system"] == "rloo" else trainer).add_callback(clock)
        if spec["system"] == "rloo":
            original_sample = trainer.sampler.sample

            def sample(policy, prompts, num_generations):
                prompts_seen.append([len(p) for p in prompts])
                return original_sample(policy, prompts, num_generations)

            trainer.sampler.sample = sample
            phases.wrap(trainer.sampler, "sample", "generation")
            phases.wrap(trainer.collector, "logprobs", "no_grad_passes")
            phases.wrap(trainer.learner, "accumulate_gradients", "training_pass")
        else:
            original_generate = trainer.model.generate

            def generate(*args, **kwargs):
                mask = kwargs["attention_mask"]
                prompts_seen.append(mask.sum(dim=1)[::k].tolist())  # TRL repeats each prompt K times, contiguously
                return original_generate(*args, **kwargs)

            trainer.model.generate = generate
            phases.wrap(trainer.model, "generate", "generation")
            phases.wrap(trainer, "_get_per_token_logps_and_entropies", "no_grad_passes", only_without_grad=True)
            phases.wrap(trainer, "compute_loss", "training_pass")
            phases.wrap(trainer.accelerator, "backward", "training_pass")
        if spec["system"] == "rloo":
            trainer.save_model = lambda *a, **kw: None  # no final save: TRL runs with save_strategy="no"
        trainer.train()
    per_step = recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"]
    completions = rewards[0].lengths
    steps = []
    for index, step in enumerate(clock.steps):
        step_lengths = completions[index * per_step:(index + 1) * per_step]
        prompt_lengths = prompts_seen[index]
        steps.append({**step, **step_flops(spec["system"], shape, prompt_lengths, step_lengths, k, recipe)})
    return {"system": spec["system"], "threads": spec["threads"], "steps": steps, "warmup": spec["warmup"],
            "model_parameters": sum(p.numel() for p in model.parameters()),
            "decoder_matrix_parameters": decoder_matrix_parameters(shape)}


class NoTokenCount:
    """The step clock's token tap, unused here: `tap_lengths` records every completion's length instead."""

    def take(self) -> tuple[int, int]:
        return 0, 0


def step_flops(system: str, shape: dict, prompt_lengths: list[int], completion_lengths: list[int], k: int,
               recipe: dict) -> dict:
    """The FLOPs a step executes in generation, the no-grad passes and the training pass (module docstring)."""
    groups = len(prompt_lengths)
    rows = groups * k
    prompt = sum(prompt_lengths) / groups
    longest = max(completion_lengths)
    group_longest = [max(completion_lengths[g * k:(g + 1) * k]) for g in range(groups)]
    if system == "rloo":
        generation = pass_flops(shape, groups, prompt, rows, longest)  # one prefill per prompt; decode to the longest
        shared = bool(recipe.get("shared_prefix_forward"))
        training = 3 * sum(pass_flops(shape, 1 if shared else k, prompt, k, c) for c in group_longest)
        no_grad = sum(pass_flops(shape, 1, prompt, k, c) for c in group_longest)  # grouped, when it runs
    else:
        generation = pass_flops(shape, rows, prompt, rows, longest)  # each row prefilled
        training = 3 * pass_flops(shape, rows, prompt, rows, longest)
        no_grad = pass_flops(shape, rows, prompt, rows, longest)
    return {"generation_flops": generation, "training_pass_flops": training, "no_grad_pass_flops": no_grad,
            "prompt_tokens_mean": prompt, "completion_tokens_mean": sum(completion_lengths) / rows,
            "completion_tokens_longest": longest}


def tap_lengths(reward) -> None:
    """Make a RecordingReward (benchmarks/recipes/recipes.py) keep every completion's token count, in the order it saw them."""
    reward.lengths = []
    original = reward.function

    def function(**kwargs):
        reward.lengths.extend(len(ids) for ids in kwargs.get("completion_ids") or [])
        return original(**kwargs)

    reward.function = function


def summarise_recipe(result: dict, peak_flops: float) -> dict:
    timed = result["steps"][result["warmup"]:]
    summary = {"timed_steps": len(timed)}
    if not timed:
        return summary
    summary["seconds_per_step"] = sum(s["seconds"] for s in timed) / len(timed)
    for phase, flops_key in (("generation", "generation_flops"), ("no_grad_passes", "no_grad_pass_flops"),
                             ("training_pass", "training_pass_flops")):
        seconds = sum(s.get(phase, 0.0) for s in timed)
        flops = sum(s[flops_key] for s in timed) if seconds else 0.0
        summary[phase] = {"seconds_per_step": seconds / len(timed), "gflops_per_step": flops / len(timed) / 1e9,
                          "achieved_gflop_per_s": flops / seconds / 1e9 if seconds else None,
                          "fraction_of_peak": flops / seconds / peak_flops if seconds else None}
    other = summary["seconds_per_step"] - sum(summary[p]["seconds_per_step"]
                                              for p in ("generation", "no_grad_passes", "training_pass"))
    summary["other_seconds_per_step"] = other
    summary["completion_tokens_mean"] = statistics.mean(s["completion_tokens_mean"] for s in timed)
    return summary


# ---------------------------------------------------------------------------------------------
# Generation under a neighbour
# ---------------------------------------------------------------------------------------------


def contention_worker(spec: dict) -> dict:
    """Generation seconds of one recipe step's prompts by FastSampler and by `generate`, alone and with a neighbour."""
    import recipes as recipe_bench

    from rloo.data.prompts import tokenize_prompts
    from rloo.generation.fast import FastSampler

    recipe = recipe_bench.load_recipe("gsm8k", 1, [], spec["settings"])
    model, tokenizer = recipe_bench.load_model(recipe)
    model.eval()
    dataset = recipe_bench.train_dataset(recipe)
    k, new_tokens, temperature = recipe["num_generations"], recipe["max_completion_length"], recipe["temperature"]
    prompts = tokenize_prompts([dataset[i]["prompt"] for i in range(2)], tokenizer, recipe["max_prompt_length"], None)
    eos = [tokenizer.eos_token_id]

    def run_fast(threads: int) -> float:
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        begin = time.perf_counter()
        FastSampler(tokenizer.pad_token_id, eos, new_tokens, temperature=temperature).sample(model, prompts, k)
        return time.perf_counter() - begin

    def run_generate(threads: int) -> float:
        from rloo.generation.base import left_pad

        torch.set_num_threads(threads)
        torch.manual_seed(0)
        ids, mask = left_pad([p for p in prompts for _ in range(k)], tokenizer.pad_token_id)
        begin = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature, top_k=0,
                           top_p=1.0, max_new_tokens=new_tokens, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
        return time.perf_counter() - begin

    cores = spec["threads"]
    runs = {"fast": (run_fast, cores), "generate": (run_generate, cores)}
    if cores > 1:
        runs["fast_one_thread_fewer"] = (run_fast, cores - 1)
    times: dict[str, dict[str, list[float]]] = {name: {"alone": [], "neighbour": []} for name in runs}
    run_fast(cores)  # warm-up (allocator, kernels)
    for _ in range(spec["rounds"]):
        for condition in ("alone", "neighbour"):
            neighbour = spinning_neighbour() if condition == "neighbour" else None
            try:
                for name, (function, threads) in runs.items():
                    times[name][condition].append(function(threads))
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()
    result = {"cores": cores, "rounds": spec["rounds"], "new_tokens": new_tokens, "rows": 2 * k, "seconds": times,
              "load_average_at_end": os.getloadavg()}
    for name in runs:
        alone, loaded = statistics.median(times[name]["alone"]), statistics.median(times[name]["neighbour"])
        result[name] = {"alone_s": alone, "neighbour_s": loaded, "slowdown": loaded / alone}
    return result


def spinning_neighbour() -> subprocess.Popen:
    """Another process holding one core: a Python busy loop (it ends when killed)."""
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.5)  # let it get scheduled
    return process


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def spawn(kind: str, spec: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(spec["threads"]),
           "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, __file__, "--worker", kind, json.dumps(spec)], capture_output=True, text=True,
                          env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} {spec.get('system', '')} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: the cores)")
    parser.add_argument("--steps", type=int, default=3, help="timed recipe steps per system")
    parser.add_argument("--warmup", type=int, default=1, help="recipe steps before the timed ones")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the contention part")
    parser.add_argument("--parts", default="peak,recipe,contention")
    parser.add_argument("--tiny", action="store_true", help="check the script: 16 new tokens, 1 timed step, 1 round")
    parser.add_argument("--tag", default="")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, spec = args.worker[0], json.loads(args.worker[1])
        print(json.dumps(recipe_worker(spec) if kind == "recipe" else contention_worker(spec)))
        return

    settings = {"max_completion_length": 16} if args.tiny else {}
    steps, rounds = (1, 1) if args.tiny else (args.steps, args.rounds)
    tag = args.tag or ("tiny" if args.tiny else "")
    out = HERE.parent / "results" / f"roofline{'_' + tag if tag else ''}.json"
    parts = set(args.parts.split(","))
    result = {"command": " ".join(["python", "benchmarks/speed/roofline.py", *sys.argv[1:]]), "threads": args.threads,
              "cores": os.cpu_count(), "load_average_at_start": os.getloadavg(), "torch": torch.__version__}
    torch.set_num_threads(args.threads)
    result["peak"] = {"threads_cores": matmul_peak("cpu", 256 if args.tiny else 2048, torch.float32)}
    torch.set_num_threads(1)
    result["peak"]["one_thread"] = matmul_peak("cpu", 256 if args.tiny else 2048, torch.float32)
    peak_flops = result["peak"]["threads_cores"]["tflops"] * 1e12
    print(f"fp32 matmul peak: {result['peak']['threads_cores']['tflops'] * 1e3:.1f} GFLOP/s with {args.threads} "
          f"threads, {result['peak']['one_thread']['tflops'] * 1e3:.1f} with one", flush=True)
    if "recipe" in parts:
        result["recipe"] = {}
        for system in ("rloo", "trl"):
            spec = {"system": system, "threads": args.threads, "warmup": args.warmup, "steps": steps,
                    "settings": settings}
            raw = spawn("recipe", spec)
            result["recipe"][system] = {**summarise_recipe(raw, peak_flops), "raw": raw}
            print(f"{system}: {json.dumps({k: v for k, v in result['recipe'][system].items() if k != 'raw'})}",
                  flush=True)
    if "contention" in parts:
        spec = {"threads": args.threads, "rounds": rounds, "settings": settings}
        result["contention"] = spawn("contention", spec)
        print(f"contention: {json.dumps({k: result['contention'][k] for k in result['contention'] if k != 'seconds'})}",
              flush=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

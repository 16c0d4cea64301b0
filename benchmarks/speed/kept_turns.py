"""A 4-turn tool rollout with each trajectory's KV cache kept across its calls, against re-prefilling every turn
and against the same tokens in one turn (issue #50 item 4).

    ln -s /work/main/recipes/models recipes/models     # or: python recipes/prepare.py arithmetic smollm2-arith-sft-tools
    flock /tmp/rloo-heavy.lock python benchmarks/speed/kept_turns.py --out benchmarks/results/kept_turns.json

The arithmetic tool recipe's shape (recipes/arithmetic_tools_cpu.yaml): its warm start
(recipes/models/smollm2-135m-instruct-arith-sft-tools, SmolLM2-135M-Instruct), its prompts (system message,
calculator schema, a 3-operation question from `rloo.assets.arithmetic`), num_generations 4, 2 prompts (8
trajectories) per rollout, the calculator tool, through the trainer's collector (`collector.sample_rows`: the
rollout, the tool calls and their messages' tokens). The turns are forced so that every trajectory has the same
shape: a calculator call per operation (3 calls; the real tool answers), then the worked answer, each turn ended
by <|im_end|>; the log-probs are the model's own. A random or warm-start model would call a varying number of
times, and the three paths would not be timing the same work.

  kept cache    FastSampler(keep_turn_cache=True): a later turn runs the tool message's tokens only
  re-prefill    keep_turn_cache=False: a later turn samples the whole trajectory again as a prompt
  one turn      the same prompts, the 4-turn trajectories' every token (the model's and the tools', <|im_end|>
                inside a trajectory replaced by a newline) decoded in one call of the sampler (collector.sample_ids)

After an untimed pass of each, the three paths take turns within each of --repeats repeats (a busy machine slows
them alike). Prints seconds per rollout (best and median), tokens per trajectory and the ratios to one turn (the
median over repeats of each repeat's ratio); checks that the kept cache and the re-prefill path give the same ids
and log-probs within 1e-4.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE.parents[1] / "recipes" / "tools"))
MODEL = HERE.parents[1] / "recipes" / "models" / "smollm2-135m-instruct-arith-sft-tools"


def problems(count: int, operations: int, seed: int = 0) -> list[tuple[list[dict], list[tuple]]]:
    """`count` (prompt, steps) pairs of `operations` operations each, as the recipe's rows."""
    from rloo.assets.arithmetic import arithmetic_problem, arithmetic_prompt

    rng = random.Random(f"kept_turns/{seed}")
    pairs = []
    for _ in range(count):
        expression, steps = arithmetic_problem(rng, operations)
        pairs.append((arithmetic_prompt(f"What is {expression}?"), steps))
    return pairs


def turn_texts(steps: list[tuple]) -> list[str]:
    """One call per operation, then the worked answer: the turns of one trajectory."""
    calls = [f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{a} {op} {b}"}}}}\n</tool_call>'
             for a, op, b, _ in steps]
    answer = "\n".join(f"{a} {op} {b} = {r}" for a, op, b, r in steps) + f"\n#### {steps[-1][3]}"
    return [*calls, answer]


def forced_sampler(tokenizer, script, **settings):
    """A FastSampler whose turn t writes script[t][row] (ids, ending in <|im_end|>) for each row it decodes."""
    import torch

    from rloo.generation.fast import FastSampler

    class Forced(FastSampler):
        def _decode_from(self, *args, **kwargs):  # once per turn on every path
            self.forced, self.step, self.turn = self.script[self.turn], 0, self.turn + 1
            return super()._decode_from(*args, **kwargs)

        def _next_token(self, logits, suppressed=None):
            log_probs = torch.log_softmax(logits.float() / self.temperature, dim=-1)  # as the real step computes
            token = torch.tensor([ids[min(self.step, len(ids) - 1)] for ids in self.forced], device=logits.device)
            self.step += 1
            return token, log_probs.gather(1, token.unsqueeze(1)).squeeze(1)

    sampler = Forced(tokenizer.pad_token_id, [tokenizer.eos_token_id], do_sample=False, **settings)
    sampler.script, sampler.turn = script, 0
    return sampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    options = parser.parse_args()

    import torch
    from calculator import calculator
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rloo import RLOOConfig, RLOOTrainer

    torch.set_num_threads(options.threads)
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    k, pairs = options.num_generations, problems(options.prompts, operations=3)
    end = tokenizer.eos_token_id
    turns = [[tokenizer.encode(text, add_special_tokens=False) + [end] for text in turn_texts(steps)]
             for _, steps in pairs]  # per prompt, per turn
    script = [[turns[row // k][t] for row in range(len(pairs) * k)] for t in range(4)]  # per turn, per row
    budget = 1024
    dataset = Dataset.from_list([{"prompt": prompt} for prompt, _ in pairs])
    rows = dataset.to_list()

    def trainer_for(sampler):
        config = RLOOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=len(pairs) * k,
                            num_generations=k, max_completion_length=budget, max_tool_calling_iterations=4,
                            beta=0.0, max_steps=1, save_steps=0, seed=0, report_to=[])
        return RLOOTrainer(model=model, reward_funcs=[lambda completions, **kwargs: [0.0] * len(completions)],
                           args=config, train_dataset=dataset, processing_class=tokenizer, sampler=sampler,
                           tools=[calculator])

    def rollout_with(keep):
        sampler = forced_sampler(tokenizer, script, max_new_tokens=budget, keep_turn_cache=keep)
        collector = trainer_for(sampler).collector

        def rollout():
            sampler.turn = 0
            batch, episodes = collector.sample_rows(rows)
            assert episodes.tool_calls == 3 * len(pairs) * k and episodes.tool_failures == 0, episodes.metrics()
            assert sampler.turn == 4
            return batch
        return rollout

    runs = {"kept cache": rollout_with(True), "re-prefill": rollout_with(False)}
    batches = {name: run() for name, run in runs.items()}  # a first, untimed pass of each (warm-up, shapes)
    kept, again = batches["kept cache"], batches["re-prefill"]
    assert torch.equal(kept.completion_ids, again.completion_ids) and torch.equal(kept.tool_mask, again.tool_mask)
    gap = (kept.logprobs - again.logprobs).abs().max().item()
    assert gap < 1e-4, gap

    # One turn: each trajectory's every token, the turns' inner ends made newlines, decoded in one sampler call.
    newline = tokenizer.encode("\n", add_special_tokens=False)[0]
    lengths = kept.completion_mask.sum(dim=1).tolist()
    whole = [[newline if t == end else t for t in kept.completion_ids[row, :n].tolist()[:-1]] + [end]
             for row, n in enumerate(lengths)]
    single_sampler = forced_sampler(tokenizer, [whole], max_new_tokens=max(lengths))
    single_collector = trainer_for(single_sampler).collector
    prompts = [ids[mask.bool()].tolist() for ids, mask in zip(kept.prompt_ids[::k], kept.prompt_mask[::k])]

    def one_turn():
        single_sampler.turn = 0
        batch = single_collector.sample_ids(prompts, k)
        assert batch.completion_mask.sum(dim=1).tolist() == lengths
        return batch
    runs["one turn"] = one_turn

    # The paths take turns within each repeat, so that a busy machine slows them alike.
    seconds = {name: [] for name in runs}
    for repeat in range(options.repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
        print(f"repeat {repeat}: " + ", ".join(f"{name} {s[-1]:.2f} s" for name, s in seconds.items()), flush=True)
    results = {name: {"best_s": round(min(s), 3), "median_s": round(statistics.median(s), 3),
                      "all_s": [round(x, 3) for x in s]} for name, s in seconds.items()}
    for name, result in results.items():
        print(f"{name:>10}: {result['best_s']:6.2f} s per rollout (best of {options.repeats}; "
              f"median {result['median_s']:.2f})")

    model_tokens = int((kept.completion_mask * kept.tool_mask).sum(dim=1)[0])
    ratios = {f"{name} / one turn": round(statistics.median(
        a / b for a, b in zip(seconds[name], seconds["one turn"])), 3) for name in ("kept cache", "re-prefill")}
    record = {
        "benchmark": "kept_turns", "model": str(MODEL.relative_to(HERE.parents[1])),
        "trajectories": len(pairs) * k, "prompts": len(pairs), "num_generations": k, "turns": 4, "tool_calls": 3,
        "prompt_tokens": len(prompts[0]), "completion_tokens_per_trajectory": lengths,
        "model_tokens_first_trajectory": model_tokens, "logprob_gap_kept_vs_reprefill": gap,
        "threads": options.threads, "device": "cpu", "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__, "seconds": results, "ratios_median_of_repeats": ratios,
        "command": "flock /tmp/rloo-heavy.lock python benchmarks/speed/kept_turns.py " + " ".join(sys.argv[1:]),
    }
    print(f"prompt {len(prompts[0])} tokens; {lengths[0]} completion tokens per trajectory ({model_tokens} the "
          f"model's); ratios to one turn: {ratios}; log-prob gap kept vs re-prefill {gap:.1e}")
    if options.out:
        Path(options.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()

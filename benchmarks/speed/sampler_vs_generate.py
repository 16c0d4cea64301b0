"""rloo's sampler against TRL's (transformers' `generate`) on the gsm8k CPU recipe's real prompts.

    python recipes/prepare.py gsm8k smollm2 --gsm8k-dir ../shared/data/gsm8k
    python benchmarks/speed/sampler_vs_generate.py --prompts 24

Each side builds its trainer on recipes/gsm8k_cpu.yaml (as benchmarks/recipes/recipes.py does: SmolLM2-135M-Instruct,
temperature 0.8, no top-k or top-p, at most 128 tokens), then samples K=8 completions of each of the first
--prompts training prompts, one prompt at a time, from the same random seed: rloo with the trainer's own
sampler, TRL with `generate` and the trainer's generation config, as TRL's RLOOTrainer samples. Both run at
once in processes of their own, one thread each. Reported per side: the texts' "#### n" format rate and
accuracy, mean length and EOS rate, and seconds; and whether the two drew the same texts. Written to
benchmarks/results/sampler_vs_generate.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "recipes"))  # benchmarks/recipes/recipes.py
sys.path.insert(0, str(HERE.parents[1] / "src"))

import recipes  # noqa: E402  (benchmarks/recipes/recipes.py: recipe loading, model loading and trainer building)

K = 8


def draw(system: str, prompts: int, seed: int) -> dict:
    """One side: the trainer's sampler (rloo) or `generate` with the trainer's generation config (TRL)."""
    import torch

    from rloo.generation import completion_mask_from_eos

    torch.set_num_threads(1)
    recipe = recipes.load_recipe("gsm8k", 1, [], {})
    model, tokenizer = recipes.load_model(recipe)
    trainer = recipes.build_trainer(system, recipe, model, tokenizer, recipes.reward_functions(recipe), tempfile.mkdtemp())
    rows = list(recipes.train_dataset(recipe).select(range(prompts)))
    texts, lengths, ended = [], [], []
    torch.manual_seed(seed)
    start = time.perf_counter()
    for row in rows:
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if system == "rloo":
            batch = trainer.sampler.sample(model, [ids], K)
            completion_ids, mask, has_eos = batch.completion_ids, batch.completion_mask, batch.has_eos
        else:
            config = trainer.generation_config
            stop = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
            with torch.no_grad():
                completion_ids = model.generate(torch.tensor([ids] * K), attention_mask=torch.ones(K, len(ids), dtype=torch.long),
                                                generation_config=config)[:, len(ids):]
            mask, has_eos = completion_mask_from_eos(completion_ids, stop)
        rows_ids = [c[:int(m.sum())].tolist() for c, m in zip(completion_ids, mask)]
        ended += has_eos.tolist()
        lengths += [len(c) for c in rows_ids]
        texts += tokenizer.batch_decode(rows_ids, skip_special_tokens=True)
    seconds = time.perf_counter() - start
    columns = {"prompts": [r["prompt"] for r in rows for _ in range(K)], "answer": [r["answer"] for r in rows for _ in range(K)]}
    scores = {name: recipes.scorer(name)(completions=texts, **columns) for name in ("gsm8k_format", "gsm8k_accuracy")}
    return {"system": system, "completions": len(texts), "seconds": seconds,
            "format": sum(scores["gsm8k_format"]) / len(texts), "accuracy": sum(scores["gsm8k_accuracy"]) / len(texts),
            "mean_length": sum(lengths) / len(lengths), "eos_rate": sum(ended) / len(ended), "texts": texts}


def spawn(system: str, prompts: int, seed: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, __file__, "--worker", system, "--prompts", str(prompts), "--seed", str(seed)],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{system} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", choices=["rloo", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    if options.worker:
        print(json.dumps(draw(options.worker, options.prompts, options.seed)))
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        rloo, trl = pool.map(lambda system: spawn(system, options.prompts, options.seed), ["rloo", "trl"])
    same = sum(a == b for a, b in zip(rloo["texts"], trl["texts"]))
    for side in (rloo, trl):
        print(f"{side['system']}: {side['completions']} completions in {side['seconds']:.1f} s, format {side['format']:.3f}, "
              f"accuracy {side['accuracy']:.3f}, mean length {side['mean_length']:.1f} tokens, EOS {side['eos_rate']:.3f}")
    print(f"identical texts: {same} of {len(rloo['texts'])}")
    out = HERE.parent / "results" / "sampler_vs_generate.json"
    out.write_text(json.dumps({"prompts": options.prompts, "k": K, "seed": options.seed, "identical_texts": same,
                               "rloo": {k: v for k, v in rloo.items() if k != "texts"},
                               "trl": {k: v for k, v in trl.items() if k != "texts"},
                               "first_texts": rloo["texts"][:3]}, indent=1) + "\n")
    print(f"wrote {out.relative_to(HERE.parents[1])}")


if __name__ == "__main__":
    main()

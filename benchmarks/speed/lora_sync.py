"""What one weight sync costs under LoRA, merged push against adapters alone (vllm_lora_sync), on vLLM's CPU engine.

    V=$(ls -d ~/.cache/rloo/vllm-venv-*)   # built by scripts/test_vllm.sh
    PYTHONPATH=src VLLM_CPU_KVCACHE_SPACE=1 $V/bin/python benchmarks/speed/lora_sync.py \\
        --models tiny smollm2 --ranks 16 64 --json benchmarks/results/lora_sync.json

For each model and rank, a child process of its own (one colocated engine per process) wraps the model in LoRA
adapters on q/k/v/o and the MLP projections (alpha = 2r, random adapters), starts a vLLM engine with enable_lora,
and then, `--syncs` times each: one AdamW step on the adapters, one sync, one sampling of 4 prompts x 4 completions.
Adapters alone first (the engine's base stays the checkpoint's), then merged (every weight pushed, adapters merged
in). Reported per mode: bytes and seconds of a sync (median; seconds from the start of the push to its return:
adapter written and registered, or weights reloaded), and the largest |engine - trainer| log-prob gap over the
samples, fp32, temperature 1. Models: "tiny" (rloo.toy Qwen2, hidden 128, 2 layers), "smollm2" (SmolLM2-135M,
rloo.assets.smollm2), "qwen3-0.6b" (a random model of Qwen3-0.6B's shape).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def build_model(name: str, folder: str):
    import torch
    import transformers

    from rloo.toy import build_char_tokenizer, build_tiny_model

    if name == "tiny":
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                                 intermediate_size=256, max_position_embeddings=512, seed=0)
    elif name == "smollm2":
        from rloo.assets.smollm2 import smollm2_folder

        source = smollm2_folder()
        model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    elif name == "qwen3-0.6b":
        from rloo.assets.smollm2 import smollm2_folder

        tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_folder())  # any tokenizer: ids only
        config = transformers.Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                          num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                                          head_dim=128, tie_word_embeddings=True, max_position_embeddings=2048)
        torch.manual_seed(0)
        model = transformers.Qwen3ForCausalLM(config)
    else:
        raise SystemExit(f"unknown model {name}")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model.config._name_or_path = folder
    return model, tokenizer


def run_one(opts: argparse.Namespace) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model

    from rloo import RLOOConfig
    from rloo.generation.vllm import VLLMSampler

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "generation"))
    from test_vllm_lora import gap, optimizer_step

    folder = tempfile.mkdtemp(prefix="rloo-lora-sync-")
    base, tokenizer = build_model(opts.model, folder)
    torch.manual_seed(1)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    policy = get_peft_model(base, LoraConfig(r=opts.rank, lora_alpha=2 * opts.rank, target_modules=targets,
                                             init_lora_weights=False))
    args = RLOOConfig(output_dir=folder, sampler="vllm", seed=0, vllm_lora_sync="adapters")
    sampler = VLLMSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[], max_new_tokens=16, args=args,
                          generation_kwargs={"ignore_eos": True})
    prompts = [tokenizer(f"{i} plus {2 * i} is", add_special_tokens=False)["input_ids"] for i in range(4)]
    batch = sampler.sample(policy, prompts, 4)  # the engine starts (with LoRA) and takes version 1
    result = {"model": opts.model, "rank": opts.rank,
              "base_parameters": sum(p.numel() for n, p in policy.named_parameters() if "lora_" not in n)}
    for mode in ("adapters", "merged"):
        sampler.lora_sync = mode
        syncs, gaps = [], []
        for _ in range(opts.syncs):
            optimizer_step(policy, batch, lr=1e-3)
            sampler.on_optimizer_step(policy)
            batch = sampler.sample(policy, prompts, 4)
            syncs.append(sampler.last_sync)
            gaps.append(gap(policy, batch))
        result[mode] = {"bytes": syncs[-1]["bytes"], "seconds": statistics.median(s["seconds"] for s in syncs),
                        "max_logprob_gap": max(gaps)}
    sampler.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny"])
    parser.add_argument("--ranks", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: --models M --ranks R
    opts = parser.parse_args()
    if opts.one:
        opts.model, opts.rank = opts.models[0], opts.ranks[0]
        print("RESULT " + json.dumps(run_one(opts)), flush=True)
        return
    results = []
    for model in opts.models:
        for rank in opts.ranks:
            child = subprocess.run([sys.executable, __file__, "--one", "--models", model, "--ranks", str(rank),
                                    "--syncs", str(opts.syncs)], capture_output=True, text=True)
            lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
            if not lines:
                print(f"{model} r={rank} failed:\n{child.stderr[-3000:]}", file=sys.stderr)
                continue
            result = json.loads(lines[0][len("RESULT "):])
            results.append(result)
            a, m = result["adapters"], result["merged"]
            print(f"{model:10s} r={rank:3d}  adapters {a['bytes'] / 2**20:8.2f} MiB {a['seconds']:7.3f} s gap "
                  f"{a['max_logprob_gap']:.1e} | merged {m['bytes'] / 2**20:8.2f} MiB {m['seconds']:7.3f} s gap "
                  f"{m['max_logprob_gap']:.1e}", flush=True)
    if opts.json:
        with open(opts.json, "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()

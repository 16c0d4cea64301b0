"""The memory one image costs per group: the processor's vision tensors for one prompt, and the K copies the
passes carry (`data.images.VisionInputs`: one copy per completion row). Run: python benchmarks/vision_memory.py"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vision"))
import standin_vlms  # noqa: E402

from rloo.data.images import ImagePromptEncoder  # noqa: E402

for family in ("gemma3", "gemma4", "llava_next"):
    processor = standin_vlms.processor(family)
    encoder = ImagePromptEncoder(processor, "image", 100_000, None)
    row = {"prompt": [{"role": "user", "content": "How many squares?"}], "image": standin_vlms.images(1)[0]}
    ids, vision = encoder.encode([row])
    tensors = vision.per_prompt[0]
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    print(f"{family}: {len(ids[0])} prompt tokens, {shapes}, {size / 2**20:.2f} MiB per prompt, "
          f"x K=8 copies: {8 * size / 2**20:.2f} MiB per group")

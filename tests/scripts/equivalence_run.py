"""One process with B completions or two with B/2 each must give the same gradient.

`gradients(num_processes, rank, out)` builds a trainer, collects this process's share of a fixed
set of prompts through a deterministic sampler (completions depend on the prompt only, not on the
process or the random state), and returns the accumulated gradient before the optimizer step, for
each loss variant. test_equivalence.py runs it in-process (one process) and under torchrun (two).
"""

import sys
from pathlib import Path

import torch
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer
from rloo.generation.base import SampledBatch, completion_mask_from_eos, left_pad
from rloo.toy import build_char_tokenizer, build_tiny_model

VARIANTS = {
    "default": {},
    "token-mean-whitened": dict(loss_agg_mode="token-mean", normalize_advantages=True),
}
PROMPTS = [f"{a}+{a + 1}=" for a in range(4)]  # 4 prompts x K=4: B = 16 completions
COMPLETION_LENGTH = 6


class PromptSeededSampler:
    """Completions drawn from a generator seeded by the prompt's tokens: the same on every process."""

    def __init__(self, tokenizer):
        self.pad, self.eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        self.digits = tokenizer.convert_tokens_to_ids(list("0123456789"))

    def sample(self, model, prompts, num_generations):
        rows = []
        for prompt in prompts:
            generator = torch.Generator().manual_seed(sum((i + 1) * t for i, t in enumerate(prompt)))
            for _ in range(num_generations):
                tokens = [self.digits[int(i)] for i in torch.randint(0, 10, (COMPLETION_LENGTH,), generator=generator)]
                end = int(torch.randint(1, COMPLETION_LENGTH + 1, (1,), generator=generator))
                rows.append(tokens[: end - 1] + [self.eos] + tokens[end:] if end < COMPLETION_LENGTH else tokens)
        device = next(model.parameters()).device
        prompt_ids, prompt_mask = left_pad([p for p in prompts for _ in range(num_generations)], self.pad, device)
        completion_ids = torch.tensor(rows, device=device)
        completion_mask, has_eos = completion_mask_from_eos(completion_ids, [self.eos])
        return SampledBatch(prompt_ids, prompt_mask, completion_ids.masked_fill(completion_mask == 0, self.pad),
                            completion_mask, has_eos)

    def on_optimizer_step(self, model):
        pass


def digit_value(completions, **kwargs):
    return [sum(int(ch) for ch in c if ch.isdigit()) / 10 for c in completions]


def gradients(num_processes: int, rank: int, out: Path) -> dict[str, list[torch.Tensor]]:
    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    per_process = len(PROMPTS) // num_processes
    rows = [{"prompt": p} for p in PROMPTS]
    result = {}
    for name, options in VARIANTS.items():
        model = build_tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                 intermediate_size=64)
        args = RLOOConfig(output_dir=str(out / "run"), per_device_train_batch_size=16 // num_processes // 2,
                          gradient_accumulation_steps=2, num_generations=4, max_completion_length=COMPLETION_LENGTH,
                          beta=0.0, max_steps=1, save_steps=0, max_grad_norm=0.0, **options)
        trainer = RLOOTrainer(model, digit_value, args=args, train_dataset=Dataset.from_list(rows),
                              processing_class=tokenizer, sampler=PromptSeededSampler(tokenizer))
        assert trainer.accelerator.num_processes == num_processes
        own_rows = rows[rank * per_process : (rank + 1) * per_process]
        rollout, _ = trainer.collector.collect(own_rows, trainer.global_step, trainer.episode)
        trainer.learner.accumulate_gradients(rollout)
        result[name] = [p.grad.detach().cpu().clone() for p in trainer.model.parameters()]
    return result


if __name__ == "__main__":
    import os

    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])  # set by torchrun
    grads = gradients(world, rank, out)
    torch.save(grads, out / f"grads{rank}.pt")

"""The multi-turn run that tests/generation/test_vllm_tools.py checks: a trainer with a tool sampling through a
real vLLM engine, every engine call recorded, one collected rollout, then two training steps; written out as
plain lists (JSON).

Run as a script for colocate mode (a process of its own: one colocated engine per process, and the vLLM tier's
pytest process already holds test_vllm_engine's), imported for server mode. Not a test module itself.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer
from rloo.toy.models import build_tiny_model
from rloo.toy.tool_task import build_tool_tokenizer, warm_start_rows
from rloo.toy.warm_start import supervised_warm_start

K = 4


def tool_dataset() -> Dataset:
    """Eight one-digit additions as conversations, with their answers."""
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b)}
                              for a in range(1, 5) for b in range(1, 3)])


def save_tool_model(folder: str, steps: int = 120) -> None:
    """A tiny Qwen2 (head_dim 64: vLLM's CPU attention refuses smaller) warm-started on the toy tool task's whole
    exchange on every row (`rloo.toy.tool_task`: a Hermes `<tool_call>` to `add`, EOS, the tool's message, the
    answer), so that sampled at temperature 1 it calls the tool on its first turn and answers after the result.
    A random tiny model never writes a parsable call, and a rollout without calls would test nothing."""
    tokenizer = build_tool_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=256, max_position_embeddings=512, seed=0)
    supervised_warm_start(model, tokenizer, warm_start_rows(tokenizer, tool_dataset(), tool_fraction=1.0, answer_rows=False),
                          steps=steps, batch_size=8, learning_rate=3e-3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)  # for the engine; the trainer gets build_tool_tokenizer() itself (see below)


# The trainer is given the tokenizer object, not the folder's: transformers 5 reloads a saved tokenizer of a qwen2
# model as its Qwen2Tokenizer, whose pre-tokenizer replaces the toy's and drops spaces and newlines (transformers
# issue 45920). The engine loads the folder's, but it takes and returns token ids only.


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return int(a) + int(b)


class Calculator:
    """An environment whose tool is its `add` method; it counts the calls it served, and rewards each."""

    def reset(self, **row: Any) -> None:
        self.calls: list[tuple[int, int]] = []

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.calls.append((a, b))
        return int(a) + int(b)

    def get_reward(self) -> float:
        return float(len(self.calls))


def alternating(completions: list, **kwargs: Any) -> list[float]:
    """1 on odd rows: every group has nonzero advantages, so a step always moves the weights."""
    return [float(i % 2) for i in range(len(completions))]


def tool_config(output_dir: str, **overrides: Any) -> RLOOConfig:
    values = dict(output_dir=output_dir, sampler="vllm", num_generations=K, per_device_train_batch_size=2 * K,
                  max_completion_length=96, max_steps=2, learning_rate=1e-5, beta=0.0, logging_steps=1, save_steps=0,
                  report_to=[], seed=0, temperature=1.0, vllm_importance_sampling_correction=True)
    return RLOOConfig(**{**values, **overrides})


def record_engine_calls(engine: Any) -> list[dict[str, Any]]:
    """Wrap `engine.generate` so that every call's prompts and (ids, log-probs) outputs land in the returned list."""
    calls: list[dict[str, Any]] = []
    generate = engine.generate

    def recorded(prompts, n, params):
        outputs = generate(prompts, n, params)
        calls.append({"prompts": [list(p) for p in prompts],
                      "outputs": [[[list(ids), list(logps)] for ids, logps in request] for request in outputs]})
        return outputs

    engine.generate = recorded
    return calls


def rows_of(values: torch.Tensor, mask: torch.Tensor) -> list[list]:
    return [row[keep.bool()].tolist() for row, keep in zip(values, mask)]


def run_and_record(trainer: RLOOTrainer) -> dict[str, Any]:
    """One rollout of two prompts (K trajectories each) through `trainer.collector.collect`, what the engine
    drew for it, and the trainer's own view of it; then `trainer.train()` (two steps)."""
    collector = trainer.collector
    policy = trainer.accelerator.unwrap_model(trainer.model)
    collector.sampler.prepare(policy)  # builds the engine (colocate) or its HTTP client (server)
    engine_calls = record_engine_calls(collector.sampler.engine)
    captured: dict[str, Any] = {}
    sample_rows = collector.sample_rows

    def capturing(rows, num_generations=None):
        captured["sampled"], captured["episodes"] = sample_rows(rows, num_generations)
        return captured["sampled"], captured["episodes"]

    collector.sample_rows = capturing
    try:
        rollout, _ = collector.collect(trainer.train_dataset.select(range(2)).to_list())
    finally:
        del collector.sample_rows
    sampled, episodes = captured["sampled"], captured["episodes"]
    completion_mask = sampled.completion_mask
    record = {
        "prompt_ids": rows_of(sampled.prompt_ids, sampled.prompt_mask),
        "completion_ids": rows_of(sampled.completion_ids, completion_mask),
        "tool_mask": rows_of(sampled.tool_mask, completion_mask),
        "logprobs": rows_of(sampled.logprobs, completion_mask),
        "trainer_logprobs": rows_of(collector.logprobs(policy, sampled), completion_mask),
        "loss_mask": rows_of(rollout.loss_mask(), completion_mask),
        "is_weights": rows_of(rollout.is_weights, completion_mask),
        "messages": episodes.messages,
        "tool_calls": episodes.tool_calls,
        "tool_failures": episodes.tool_failures,
        "environment_calls": None if episodes.environments is None else [len(e.calls) for e in episodes.environments],
        "engine_calls": list(engine_calls),
    }
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    trainer.train()
    record["log_history"] = trainer.state.log_history
    record["weights_changed"] = any(not torch.equal(p, before[name]) for name, p in policy.named_parameters())
    return record


if __name__ == "__main__":  # colocate: python vllm_tool_rollout.py MODEL_FOLDER OUT_DIR RECORD_JSON
    folder, out, record_path = sys.argv[1:4]
    trainer = RLOOTrainer(model=folder, reward_funcs=[alternating], args=tool_config(out, vllm_mode="colocate"),
                          train_dataset=tool_dataset(), processing_class=build_tool_tokenizer(),
                          environment_factory=Calculator)
    with open(record_path, "w") as file:
        json.dump(run_and_record(trainer), file)
    print("RECORDED")

"""Shared fixtures: a character tokenizer and tiny random models, built locally in milliseconds."""

import pytest
import torch
from datasets import Dataset

from rloo.toy import build_char_tokenizer, build_tiny_model

# One intra-op thread: tiny models gain nothing from more, and a busy machine makes spinning
# OpenMP threads dozens of times slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture
def make_model(tokenizer):
    """A fresh tiny Qwen2 (about 20k parameters); the same seed gives the same weights."""

    def make(seed: int = 0, **overrides):
        sizes = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
        return build_tiny_model(tokenizer, seed=seed, **{**sizes, **overrides})

    return make


@pytest.fixture
def digit_dataset():
    """Prompts with an `answer` column; the reward below only looks at the completions."""
    return Dataset.from_list([{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(8) for b in range(8)])


def digit_fraction(completions, **kwargs):
    """Fraction of characters that are digits: easy to raise from a random init."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

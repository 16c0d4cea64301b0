"""Everything an offline RLOO demo, test or benchmark needs, built locally in seconds.

No Hugging Face Hub access is needed. The real offline assets (SmolLM2, GSM8K, HumanEval, GGUF
tokenizers) are in `rloo.assets`; this package holds the synthetic ones. The toy sits outside the
core: nothing in `rloo` imports it (except `rloo demo`, lazily), and it is built from the library's
own pieces.

- `tokenizer`: a character-level tokenizer (`build_char_tokenizer`), one token per character,
  with a "role: content" chat template (`CHAT_TEMPLATE`).
- `models`: tiny causal LMs with seeded random weights from a `transformers` config
  (`build_tiny_model`).
- `tasks`: synthetic tasks with verifiable answers (`addition_dataset`, `addition_split`,
  `reverse_dataset`) and their rewards: `exact_match_reward` (the built-in
  `rloo.rewards.exact_match`) and the dense `char_match_reward`.
- `greedy_accuracy`: greedy completions and accuracy (`greedy_completions`, `greedy_accuracy`),
  decoded by `rloo.generation.FastSampler` with sampling off.
- `warm_start`: a short supervised warm start (`supervised_warm_start`) and
  `warm_started_addition_model`, a cached warm-started model for two-digit addition whose
  defaults are calibrated so that held-out greedy accuracy is partial (about 0.3): RL then has
  successes to learn from and room to improve.
- `early_stopping`: the warm start's stop on the greedy accuracy of recent training rows.
- `demo`: the `rloo demo` command.
- `tool_task`, `tool_demo`: a task that needs a tool (four-digit additions with an `add` tool) and
  `rloo demo --task add_tool`.
- `vision_task`: a visual task (count the squares in a seeded image) with a tiny LLaVA and its
  processor (`build_counting_vlm`), a warm start and greedy accuracy; imported by name, not re-exported.

This package re-exports the names the tests, benchmarks and docs use; the rest (the special
tokens, the warm start's calibrated defaults) live in the submodules.
"""

from rloo.toy.greedy_accuracy import greedy_accuracy, greedy_completions
from rloo.toy.models import build_tiny_model
from rloo.toy.tasks import addition_dataset, addition_split, char_match_reward, exact_match_reward, reverse_dataset
from rloo.toy.tokenizer import CHARACTERS, CHAT_TEMPLATE, build_char_tokenizer
from rloo.toy.warm_start import ADDITION_NUM_EVAL, ADDITION_NUM_TRAIN, supervised_warm_start, warm_started_addition_model

__all__ = [
    "ADDITION_NUM_EVAL", "ADDITION_NUM_TRAIN", "CHARACTERS", "CHAT_TEMPLATE",
    "addition_dataset", "addition_split", "build_char_tokenizer", "build_tiny_model", "char_match_reward",
    "exact_match_reward", "greedy_accuracy", "greedy_completions", "reverse_dataset", "supervised_warm_start",
    "warm_started_addition_model",
]

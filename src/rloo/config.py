"""`RLOOConfig`: every knob of an RLOO run, documented and validated at construction.

Batch sizes count *completions*, as in TRL: `per_device_train_batch_size=32` with
`num_generations=4` means 8 prompts per micro-batch. One optimizer step on one process
consumes `per_device_train_batch_size * gradient_accumulation_steps` completions, which is
`prompts_per_step` whole groups of `num_generations` completions. A group is generated,
scored and baselined together and never straddles two processes or two optimizer steps.

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
import textwrap
from dataclasses import dataclass
from typing import Any

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
)
OPTIMIZERS = ("adamw_torch", "adamw_8bit")
REPORT_TO = ("none", "tensorboard", "wandb")
TRUNCATE_PROMPTS = ("left", "error")
SAMPLERS = ("fast", "generate")


class ConfigError(ValueError):
    """A config value is invalid. The message names the field(s) and how to fix them."""


@dataclass
class RLOOConfig:
    """Hyper-parameters of an RLOO run. See the module docstring for how batch sizes count."""

    # --- where and how to run ---
    output_dir: str = "outputs/rloo"
    """Directory for metrics.jsonl, checkpoints and the final model and tokenizer."""
    seed: int = 42
    """Seed for sampling, data order and initialisation; a run is reproducible given the seed."""
    run_name: str | None = None
    """Name of the run in trackers (TensorBoard, W&B); defaults to the output directory's name."""
    report_to: str = "none"
    """Tracker for metrics besides the console and metrics.jsonl: "none", "tensorboard" or "wandb"."""

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
    bf16: bool = False
    """Run forward and backward passes under bf16 autocast (accelerate mixed precision)."""
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
    the mean reward of the other K-1, so K must be at least 2. TRL v0 called it rloo_k."""

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
    """Sampling temperature. Log-probs in the loss and the KL are taken at the same temperature,
    so the ratio and the KL refer to the distribution that was sampled."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p; 1 disables."""
    top_k: int = 0
    """Sample only among the top_k most likely tokens; 0 disables."""
    sampler: str = "fast"
    """Sampling backend: "fast" prefills each prompt once, shares its KV cache across its K samples
    and decodes in a lean loop (rloo.decoding.FastSampler); "generate" calls Hugging Face
    `generate` (slower, the reference). Both draw from the same distribution."""

    # --- the RLOO objective ---
    beta: float = 0.05
    """KL coefficient. The reward is score - beta * sum_t (log pi - log pi_ref), folded in before
    the baseline as in the paper. With beta = 0 no reference model is loaded. TRL v0: kl_coef."""
    num_iterations: int = 1
    """Optimizer passes over each generated batch. Above 1 the loss uses the PPO-style clipped
    sequence ratio against the log-probs at generation time. TRL v0: num_ppo_epochs."""
    epsilon: float = 0.2
    """Clip range of the sequence ratio pi/pi_old (1 - epsilon, 1 + epsilon). TRL v0: cliprange."""
    reward_weights: list[float] | None = None
    """Weight of each reward function in the summed score, in the order given; None weighs all 1."""

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

    def __post_init__(self) -> None:
        _validate(self)

    # --- derived sizes (per process) ---
    @property
    def completions_per_step(self) -> int:
        """Completions one process consumes per optimizer step."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def prompts_per_step(self) -> int:
        """Prompts (groups) one process generates per optimizer step."""
        return self.completions_per_step // self.num_generations

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _accept_aliases(cls: type) -> type:
    """Let the dataclass take TRL v0 names as keyword aliases of its canonical fields."""
    original_init = cls.__init__

    @functools.wraps(original_init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **resolve_aliases(kwargs))

    cls.__init__ = __init__
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

    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "max_prompt_length",
                 "max_completion_length", "num_iterations", "logging_steps", "num_completions_to_print"):
        value = getattr(c, name)
        require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                f"{name} must be a positive integer, got {value!r}.")
    require(isinstance(c.num_generations, int) and c.num_generations >= 2,
            f"num_generations (K) must be at least 2: the leave-one-out baseline of each completion "
            f"averages the other K-1 completions of its prompt, so K={c.num_generations!r} leaves none "
            f"and nothing would be learned. Set num_generations >= 2 (4 is typical).")
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
    require(c.max_steps == -1 or c.max_steps >= 1, f"max_steps must be -1 or >= 1, got {c.max_steps!r}.")
    require(c.num_train_epochs > 0, f"num_train_epochs must be > 0, got {c.num_train_epochs!r}.")
    require(c.total_episodes is None or c.total_episodes >= 1,
            f"total_episodes must be >= 1 or unset, got {c.total_episodes!r}.")
    require(not (c.max_steps > 0 and c.total_episodes is not None),
            f"max_steps={c.max_steps} and total_episodes={c.total_episodes} both set the run's length; give one.")
    require(c.save_steps >= 0, f"save_steps must be >= 0 (0 disables checkpoints), got {c.save_steps!r}.")
    if c.save_steps > 0:
        _exact_div(
            c.save_steps, c.num_iterations,
            f"save_steps={c.save_steps} must be a multiple of num_iterations={c.num_iterations}: a checkpoint "
            f"is written between generated batches so that resuming repeats nothing. Change save_steps.",
        )
    require(c.save_total_limit is None or c.save_total_limit >= 1,
            f"save_total_limit must be >= 1 or unset, got {c.save_total_limit!r}.")
    require(c.eval_steps >= 0, f"eval_steps must be >= 0, got {c.eval_steps!r}.")
    require(c.reward_weights is None or (len(c.reward_weights) > 0 and all(isinstance(w, (int, float)) for w in c.reward_weights)),
            f"reward_weights must be a non-empty list of numbers or unset, got {c.reward_weights!r}.")
    require(c.truncate_prompts in TRUNCATE_PROMPTS,
            f"truncate_prompts must be one of {TRUNCATE_PROMPTS}, got {c.truncate_prompts!r}.")
    require(c.chat_template_kwargs is None or isinstance(c.chat_template_kwargs, dict),
            f"chat_template_kwargs must be a mapping of argument names to values or unset, got "
            f"{c.chat_template_kwargs!r}.")
    require(c.report_to in REPORT_TO, f"report_to must be one of {REPORT_TO}, got {c.report_to!r}.")


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


__all__ = ["RLOOConfig", "ConfigError", "ALIASES", "field_docs", "resolve_aliases"]

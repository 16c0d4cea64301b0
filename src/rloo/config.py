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

The module is the dataclass with a docstring under every field (over 500 lines, kept whole
so that one file documents every option); the checks live in `config_checks`.

The config fails loudly on bad values and never rewrites what the user gave. The names that
TRL v0 and the seed scripts use (`kl_coef`, `rloo_k`, `cliprange`, `num_ppo_epochs`,
`response_length`) are keyword aliases of the canonical fields, and TRL's other field names are mapped onto
fields or refused by name: both belong to `rloo.RLOOConfig` (compat/trl_config.py), a subclass that adds no
field, so this module imports nothing from the TRL layer. Every option the rest of rloo reads is a field here
(tests/test_architecture.py).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import logging
import textwrap
from dataclasses import dataclass, field
from typing import Any

from rloo.config_checks import ConfigError, validate

logger = logging.getLogger(__name__)

# Old name -> canonical field. The old names come from TRL v0 and the seed scripts.
ALIASES: dict[str, str] = {
    "kl_coef": "beta",
    "rloo_k": "num_generations",
    "cliprange": "epsilon",
    "num_ppo_epochs": "num_iterations",
    "response_length": "max_completion_length",
}


@dataclass
class RLOOConfig:
    """Hyper-parameters of an RLOO run. See the module docstring for how batch sizes count."""

    # --- where and how to run ---
    # Loading models given by name (policy, reference, reward models); see rloo/model_loading.py.
    model_init_kwargs: dict[str, Any] | None = None
    """Keyword arguments for `from_pretrained` of every model given by name, as TRL names them:
    dtype ("auto", "bfloat16", "float16", "float32"; default "auto": the checkpoint's dtype),
    attn_implementation, revision, trust_remote_code (default False), quantization_config (a
    BitsAndBytesConfig or its dict, for QLoRA with a peft_config; or TRL's load_in_4bit / load_in_8bit:
    bitsandbytes >= 0.49, the `quantization` extra, on CUDA or CPU). Ignored for models passed already loaded."""
    trust_remote_code: bool = False
    """Let `from_pretrained` run the modelling code of a model, tokenizer or processor given by name (TRL's name;
    model_init_kwargs' own trust_remote_code does the same for the models). Only for repositories you trust."""
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
    "aim", "clearml", "dvclive", "swanlab". The project is $WANDB_PROJECT (default "rloo"). TensorBoard writes
    where TRL's does: output_dir/runs/<date>_<host>, or $TENSORBOARD_LOGGING_DIR."""

    # --- optimisation ---
    learning_rate: float = 1e-6
    """Peak learning rate of AdamW."""
    lr_scheduler_type: str = "linear"
    """Learning-rate schedule after warm-up, a transformers scheduler name (linear, cosine, constant, ...)."""
    lr_scheduler_kwargs: dict[str, Any] | None = None
    """Extra arguments of the schedule, passed to transformers' `get_scheduler` (TRL's name), e.g.
    {"min_lr_rate": 0.1}; lr_scheduler_type="cosine_with_min_lr" needs "min_lr" or "min_lr_rate"."""
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
    """Recompute activations in the backward pass to save memory at the cost of compute: each decoder
    layer keeps only its input (transformers' checkpointing; with shared_prefix_forward rloo's own,
    which keeps the prompt's KV cache the completions run on: docs/algorithm.md)."""
    lean_activations: bool = True
    """Keep fewer tensors for backward in the policy's gated-SiLU MLPs (gate and up, not also
    silu(gate) and their product) and Llama-style RMSNorms (the input and one reciprocal RMS per
    token, not also the normalised input), recomputing the elementwise rest in backward: the same
    log-probs and gradients up to float rounding at about the same speed, a third less activation
    memory on SmolLM2-135M (docs/memory.md). Module classes that compute something else keep their
    own forward (src/rloo/passes/lean_activations.py). Off: autograd keeps what each op saves."""
    torch_empty_cache_steps: int | None = None
    """Every this many optimizer steps, give the accelerator's cached free memory back to the device
    (`torch.cuda.empty_cache()` and its kin, through accelerate), as TRL does: a lower peak of reserved
    memory for some speed. Nothing to give back on CPU. None: never."""
    shared_prefix_forward: bool = False
    """Training forward with each distinct prompt of a micro-batch run once and its completions on
    copies of its KV cache (kept in the autograd graph): the same log-probs and gradients as running
    every row whole. Pays where the decoder dominates, most on long prompts (3.6x at prompt 512 /
    completion 64, 5.3x at 1024 / 32 on CPU; about even where a large LM head dominates:
    benchmarks/speed/shared_prefix.py, docs/algorithm.md). Needs a model whose KV cache holds attention
    keys (full or sliding-window layers; not linear attention, and a sliding window under eager or sdpa
    attention, not flash attention's kernel); with gradient_checkpointing, the decoder layers of both the
    prompts' and the completions' pass are recomputed. With images in the prompts, each prompt's images
    run once per micro-batch, not once per completion (Qwen-VL's 3-D positions for the verified types
    only: docs/vision.md). Off by default."""
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
    pad_to_multiple_of: int | str | None = "auto"
    """Training only, speed not loss: each micro-batch keeps as much of its padding as makes its prompt +
    completion width a multiple of this (as far as the rollout is wide). "auto" or None (TRL's default is
    "auto"): trim all the padding the micro-batch's rows share."""

    # --- sampling ---
    max_prompt_length: int | None = None
    """Most tokens of a prompt (after the chat template). None (the default, as TRL's RLOOConfig, which has no
    such field): prompts are never truncated. Setting it opts in: what happens to longer prompts is
    truncate_prompts."""
    truncate_prompts: str = "left"
    """With max_prompt_length set, what to do with longer prompts: "left" truncates them from the left, keeping
    their end, with one warning that counts them; "error" stops with the row and its length."""
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
    min_p: float | None = None
    """Min-p sampling, honoured by every sampler: tokens less likely than min_p times the most likely one are not
    sampled; None or 0 disables. Like top_p, only the sampler filters (TRL's name)."""
    repetition_penalty: float = 1.0
    """transformers' repetition penalty (1.0 disables, TRL's name). Only an engine honours it: the samplers
    "generate", "paged" and "vllm" take it, "fast" refuses a value other than 1.0 by name."""
    generation_kwargs: dict[str, Any] | None = None
    """Extra keyword arguments of the sampling engine, as TRL passes them: transformers' `generate` /
    `GenerationConfig` (sampler "generate", "paged") or vLLM's `SamplingParams` ("vllm"). A key that is a field
    here (temperature, top_p, top_k, stop_strings; max_new_tokens is max_completion_length) must equal that
    field; min_p wins over the field and do_sample (True only) is honoured by every sampler; the keys rloo sets
    itself (eos_token_id, pad_token_id, num_return_sequences, max_length, n, max_tokens) are refused; any
    other key needs an engine (the fast sampler refuses it by name)."""
    sampler: str = "fast"
    """Sampling backend: "fast" prefills each prompt once, shares its KV cache across its K samples
    and decodes in a lean loop (rloo.decoding.FastSampler); "generate" calls Hugging Face
    `generate` (slower, the reference). Both draw from the same distribution. "paged" uses
    transformers' continuous batching (`generate_batch`), "vllm" a vLLM engine (see vllm_mode)."""
    transformers_continuous_batching_config: dict[str, Any] | None = None
    """With sampler="paged": keyword arguments for transformers' `ContinuousBatchingConfig` (TRL's name), over
    rloo's own sizing (page_size 32, max_batch_tokens 2048, num_blocks for the call's completions at full
    length; rloo/generation/paged.py). Giving max_memory_percent or num_blocks hands the cache's size back to
    transformers' rule. return_logprobs is rloo's to set. None: rloo's sizing."""
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
    router_aux_loss_coef: float | None = None
    """For mixture-of-experts models (their config has output_router_logits): the router's load-balancing loss,
    times this weight, joins the loss and is logged as aux_loss. None or 0 adds none (TRL reads its default None as
    the model config's own coefficient: rloo adds it only when asked); dense models ignore it (TRL's name)."""

    # --- the reference model ---
    sync_ref_model: bool = False
    """TR-DPO: every ref_model_sync_steps optimizer steps the reference becomes (1 - ref_model_mixup_alpha) *
    reference + ref_model_mixup_alpha * policy. Needs a reference copy (beta > 0, no peft_config); not under
    DeepSpeed ZeRO-3 (TRL's name)."""
    ref_model_sync_steps: int = 512
    """With sync_ref_model: optimizer steps between reference syncs."""
    ref_model_mixup_alpha: float = 0.6
    """With sync_ref_model: the policy's weight in the mix, in [0, 1]."""

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
    logging_first_step: bool = False
    """Log the first optimizer step too, whatever logging_steps is (TRL's name)."""
    disable_tqdm: bool | None = None
    """Hide the progress bar (TRL's name). None or False: shown on the main process."""
    log_completions: bool = False
    """Print a table of sample prompts, completions and rewards every logging_steps."""
    num_completions_to_print: int = 4
    """Rows in the sample-completions table."""
    log_multimodal: bool = True
    """With log_completions and prompts with images (docs/vision.md): each logged row's images are written as PNG
    files under output_dir/images/ (named by content, so a group's K rows share them) and the row's "image"
    column names them; `rloo report` shows them as thumbnails, the trackers' completions table as images (W&B,
    trackio, MLflow; TensorBoard as image summaries). TRL's name."""
    log_level: str = "passive"
    """How much the libraries underneath print (TRL's name). "passive" (the default) hides transformers'
    and datasets' progress bars ("Loading weights", "Writing model shards", "Generating train split")
    and keeps their log levels; Hub downloads keep their bars. "debug" or "info" shows every bar and sets
    transformers', datasets' and rloo's loggers to that level; "warning", "error" or "critical" sets the
    level and hides every bar, downloads' too. On the command line: `--log_level info`."""
    save_steps: int = 500
    """Save a resumable checkpoint every this many optimizer steps; 0 disables periodic checkpoints."""
    save_strategy: str = "steps"
    """TRL's name: "steps" checkpoints every save_steps and train() writes the final model into output_dir; "no"
    writes neither (save_steps must then be 0; TRL's scripts call save_model themselves)."""
    save_total_limit: int | None = None
    """Keep at most this many checkpoints, deleting the oldest; None keeps all."""
    save_only_model: bool = False
    """Checkpoints hold the weights (and tokenizer and config) only, not the optimizer, scheduler and RNG state
    (TRL's name): much smaller, but a run cannot resume from them; resuming refuses, naming this field. Load
    one with from_pretrained, or start a new run from it as a model."""
    eval_steps: int = 0
    """With an eval_dataset, score sampled completions of its prompts every this many optimizer
    steps (eval/reward); 0 evaluates only at the end of training."""
    eval_on_start: bool = False
    """With an eval_dataset, evaluate once before the first optimizer step too (a resumed run: at the step it
    resumes from), a baseline and a check that evaluation works (TRL's name)."""

    # --- eval ---
    num_generations_eval: int | None = None
    """Completions sampled per eval prompt (TRL's name), the n of eval/pass@k; None uses num_generations."""
    per_device_eval_batch_size: int | None = None
    """Completions sampled together in evaluation (whole groups of num_generations_eval, at least one group);
    None (TRL: 8): a training step's prompts at a time (TRL's name)."""

    # --- data loading: TRL's DataLoader options, read by get_train_dataloader() / get_eval_dataloader() ---
    dataloader_num_workers: int = 0
    """Workers of the loaders that `get_train_dataloader()` and `get_eval_dataloader()` return to scripts; the
    training loop reads prompts by its seeded schedule (data/schedule.py) and starts no workers (TRL's name). A
    streamed train set sets it to 0 with a warning, as TRL does."""
    accelerator_config: dict[str, Any] | None = None
    """TRL's accelerator_config (a mapping or transformers' `AcceleratorConfig`), of which rloo takes only the
    DataLoader options (dispatch_batches, even_batches, use_seedable_sampler, non_blocking): rloo has no
    DataLoader for them to change, and a streamed train set needs dispatch_batches unset or False. Other keys
    (distributed set-up) are refused: they belong in an accelerate config."""

    # --- the Hub: read by trainer.push_to_hub(), which is the only thing that pushes ---
    push_to_hub: bool = False
    """TRL's name, read by scripts (TRL's call trainer.push_to_hub() at the end when it is set); rloo's train()
    never pushes by itself."""
    hub_model_id: str | None = None
    """The repository trainer.push_to_hub() uploads to; None: the output directory's name."""
    hub_token: str | None = field(default=None, repr=False)
    """The token trainer.push_to_hub() uses; None: huggingface_hub's own (`hf auth login`, $HF_TOKEN). Never
    written to disk or to trackers: to_dict() shows it as "<HUB_TOKEN>", as transformers does."""
    hub_private_repo: bool | None = None
    """Create the repository private (None: the Hub's default for your account)."""
    hub_revision: str | None = None
    """The branch trainer.push_to_hub() pushes to; None: the default branch."""

    # --- scale-out: launching, generation engines, sampler/trainer mismatch ---
    # TRL's option names. See docs/launching.md for the launch lines and what is verified where.
    use_cpu: bool = False
    """Run on CPU even where a GPU exists, and let a multi-process launch (torchrun, accelerate's
    MULTI_GPU config) form one world of N CPU processes (gloo) instead of N unconnected runs.
    ACCELERATE_USE_CPU=1 does the same."""
    ds3_gather_for_generation: bool = True
    """Under sharded training (FSDP2, DeepSpeed ZeRO-3): gather the full weights on every process
    once per generation, so the sampler decodes without communicating (TRL's name; it covers FSDP2
    too). False generates with the sharded model, all-gathering each layer at every decode step:
    slower, for a model whose full weights do not fit on one device; it needs sampler="generate", whose
    `generate` keeps every process stepping until all are done. No effect without sharding."""
    vllm_mode: str = "colocate"
    """With sampler="vllm": "colocate" runs a vLLM engine inside each training process; "server"
    talks over HTTP to a separate `rloo vllm-serve` process (weights pushed as safetensors chunks; no NCCL)."""
    vllm_gpu_memory_utilization: float = 0.3
    """Colocate mode: the fraction of the GPU's memory the vLLM engine may take (weights and KV cache).
    Ignored, with a warning, on vLLM's CPU engine, which sizes its KV cache by VLLM_CPU_KVCACHE_SPACE (GB)."""
    vllm_tensor_parallel_size: int = 1
    """Colocate mode: GPUs one vLLM engine is split over."""
    vllm_max_model_length: int | None = None
    """Colocate mode: the longest sequence (prompt + completion, tokens) the vLLM engine accepts. None lets
    the engine take the model's own limit (its max_position_embeddings), as TRL does."""
    vllm_enable_sleep_mode: bool = False
    """Colocate mode: put the engine to sleep (weights and KV cache off the GPU) between generations
    and wake it before the next, so training gets the memory back. GPU only: refused on vLLM's CPU engine."""
    vllm_lora_sync: str = "adapters"
    """With a LoRA policy (peft_config): what reaches the vLLM engine after each optimizer step. "adapters" (the
    default): the adapter tensors alone, as a new adapter version the engine (started with enable_lora) samples
    with; the base weights go once, at start-up. "merged": the adapters merged into the base weights and every
    base weight pushed (rloo's earlier behaviour). Adapters vLLM does not serve (DoRA, modules_to_save,
    lora_target_parameters, LoRA bias) and a server started without --enable_lora fall back to "merged" with one
    logged line saying why (generation/vllm_lora.py; costs measured in docs/launching.md)."""
    vllm_server_base_url: str | None = None
    """Server mode: the server's URL (e.g. "http://host:8000"); when unset, host and port are used. A token for a
    server started with one comes from the RLOO_VLLM_TOKEN environment variable, never from the config, which is
    written to disk (docs/launching.md, "Running the server safely")."""
    vllm_server_host: str = "0.0.0.0"
    """Server mode: host of the `rloo vllm-serve` server."""
    vllm_server_port: int = 8000
    """Server mode: port of the `rloo vllm-serve` server."""
    vllm_server_timeout: float = 240.0
    """Server mode: seconds to wait for the server to answer before failing."""
    vllm_importance_sampling_correction: bool = True
    """When the sampler returns its own log-probs (vLLM, another precision), multiply each token's
    policy-gradient loss by min(pi_old / pi_sampler, vllm_importance_sampling_cap), truncated
    importance sampling (TIS); the loss then uses per-token ratios (as the per-token loss modes do).
    False trains as if the sampler were the policy. The mismatch is logged either way (sampler/*)."""
    vllm_importance_sampling_cap: float = 2.0
    """The cap of the truncated importance-sampling ratio (TIS); must be >= 1. The upper end of the band
    for the other vllm_importance_sampling_modes (TRL's vllm_importance_sampling_clip_max)."""
    vllm_importance_sampling_mode: str = "token_truncate"
    """How the sampler correction pi_old / pi_sampler is kept in its band [vllm_importance_sampling_clip_min,
    vllm_importance_sampling_cap] (TRL's modes): "token_truncate" (each token's ratio clamped; TIS, the
    default), "token_mask" (a token's weight is 0 outside the band), "sequence_truncate" / "sequence_mask"
    (the same on the whole completion's ratio, one weight for all its tokens)."""
    vllm_importance_sampling_clip_min: float | None = None
    """The lower end of the sampler-correction band; None leaves it open (TRL's name)."""

    # --- beyond TRL's RLOO: the off-policy toolkit and dynamic sampling (docs/algorithm.md) ---
    importance_sampling_level: str | None = None
    """The importance ratio of the clipped loss. None (default): what loss_agg_mode implies, the whole
    completion's ratio pi(y|x) / pi_old(y|x) for "seq-mean-token-sum" and per-token ratios otherwise.
    "token": per-token ratios pi(y_t) / pi_old(y_t) in every mode (GRPO). "sequence": GSPO's
    length-normalised ratio exp(mean_t log(pi(y_t) / pi_old(y_t))) on every token of a completion; it
    needs a loss_agg_mode other than "seq-mean-token-sum" (GSPO is "seq-mean-token-mean")."""
    off_policy_mask_threshold: float | None = None
    """Off-policy sequence masking (DeepSeek-V3.2, TRL's name): a completion with a negative advantage
    whose mean per-token log(pi_sampler / pi) exceeds this delta gets zero loss (it stays in the
    denominator). pi_sampler is the engine's log-probs when the sampler returns them, else pi_old; on
    the first step of a rollout sampled by the policy itself nothing is masked. None disables; e.g. 0.5."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose scored rewards are all equal (zero advantage, nothing
    to learn) and refill the rollout with groups of freshly sampled prompts, up to
    dynamic_sampling_max_rounds generations per rollout; if still short, zero-spread groups fill the
    rest. Logs dynamic_sampling/* (dropped fraction, extra prompts, rounds)."""
    dynamic_sampling_max_rounds: int = 3
    """With dynamic_sampling: the most generation rounds per rollout, the first included, so at most
    (rounds - 1) * prompts_per_rollout extra prompts per process and rollout."""

    async_rollouts: bool = False
    """Generate the next rollouts in a sampler (a process on CPU, a thread on an accelerator or with
    vLLM), on its own copy of the weights, while the learner trains on this one: each rollout is trained
    at most max_staleness * steps_per_rollout optimizer steps after the weights it was sampled from, with
    pi_old from those weights and the clipped ratio. One process; samplers "fast", "generate" and "vllm"
    (its engine gets the sampler's weights); no dynamic_sampling. Off by default (docs/algorithm.md has
    what it was measured to give)."""
    max_staleness: int = 1
    """With async_rollouts: how many rollouts the sampler may run ahead of the learner. 1 (the default):
    rollout n+1 is sampled while rollout n trains, every rollout exactly one rollout stale. N >= 2 lets
    the sampler keep going through slow and fast rollouts (each starts from the newest weights), at the
    cost of one more copy of the weights and ratios further from 1. Logged as async/staleness."""
    async_rollout_timeout: float = 600.0
    """With async_rollouts: seconds the learner waits for the sampler's next rollout before raising."""

    # --- tools and environments: multi-turn rollouts (docs/multi_turn.md) ---
    max_tool_calling_iterations: int | None = None
    """With tools or an environment_factory: the most rounds of tool calls per trajectory (each round runs
    every call of the turn, then samples the next turn); None: until a turn makes no call or the
    max_completion_length budget, which counts the model's and the tools' tokens, is spent (TRL's name)."""
    tool_call_timeout: float = 30.0
    """With tools: seconds one tool call may run; a call that takes longer becomes the tool error message
    the model reads next (a plain tool's thread cannot be stopped and finishes in the background)."""

    # --- robustness: output directory reuse and non-finite steps ---
    overwrite_output_dir: bool = False
    """Let a fresh run delete the checkpoints, metrics.jsonl and completions.jsonl an earlier run left in
    output_dir. Without it such a directory is refused unless the run resumes (TRL's name)."""
    nan_policy: str = "skip"
    """What to do with an optimizer step whose loss or gradient norm is NaN or inf: "skip" (drop its
    gradients, leave the weights unchanged, log a warning and `train/nonfinite_skipped`) or "stop" (raise)."""
    reward_error_policy: str = "stop"
    """What to do when a reward function raises: "stop" (as TRL: the run ends with a RewardError naming
    the function, step and sample; the last checkpoint is kept) or "none" (the completions it raised on
    are scored None by that function, a warning names the count, and `rewards/<name>/errors` logs it)."""

    # --- code sandbox (rloo.rewards.isolation; issue #51) ---
    sandbox_allow_missing: list[str] | None = None
    """Code sandbox layers ("namespaces", "landlock", "pids_cgroup") the run accepts running without where this
    machine cannot set them up. By default it fails closed: when the namespaces layer cannot start, a run with a
    code reward (code_execution) is refused at start with the reason and the fix; ["namespaces"] runs it with
    the weaker layers left (docs/rewards.md's table says what each combination stops). The environment variable
    RLOO_SANDBOX_ALLOW_MISSING=namespaces does the same."""

    # --- fault deadlines (issue #48; docs/errors.md, "Faults") ---
    reward_timeout: float | None = None
    """Seconds one reward function may take on one batch before the run treats it as hung. None (the default)
    waits as long as it takes, as TRL does (TRL has no such deadline). A hung call is abandoned (a plain function's
    thread cannot be stopped and finishes in the background) and handled by reward_error_policy: "stop" ends the
    run with a RewardError naming the function, step and batch size; "none" scores that function None on the
    whole batch and counts it in `rewards/<name>/errors`."""
    ddp_timeout: float = 300.0
    """Seconds a process waits in a collective (all-reduce, barrier) for the others before raising, so that when one
    process of a distributed run dies or stalls the others end instead of waiting (TRL's / transformers' name;
    their default is 1800, half an hour; rloo's is 5 minutes). Raise it when one process legitimately works alone
    longer, e.g. saving a large checkpoint to slow storage."""

    def __post_init__(self) -> None:
        validate(self)

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
        """The fields as a dict (rloo_config.json, trackers, the model card, `rloo report`), the Hub token hidden and
        a transformers AcceleratorConfig (rloo.RLOOConfig's form of accelerator_config) as the options it changes."""
        values = dataclasses.asdict(self)
        if values["hub_token"] is not None:
            values["hub_token"] = "<HUB_TOKEN>"
        options = self.accelerator_config
        if options is not None and not isinstance(options, dict):
            defaults = vars(type(options)())
            values["accelerator_config"] = {k: v for k, v in vars(options).items() if v != defaults.get(k)} or None
        return values


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


@functools.cache
def field_docs(cls: type = RLOOConfig) -> dict[str, str]:
    """The docstring written under each dataclass field, read from the source (for --help); a subclass that
    declares no fields of its own (rloo.RLOOConfig, compat/trl_config.py) has its dataclass's."""
    cls = next(c for c in cls.__mro__ if "__dataclass_fields__" in vars(c))
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

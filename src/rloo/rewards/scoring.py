"""Calling reward functions: pass each only what it accepts, check what it returns, weight and sum.

A reward function has TRL's shape, `f(prompts, completions, completion_ids, **columns)`, where
columns are the dataset's other columns (e.g. `answer`). Functions with narrower signatures
(`length_reward(completions, prompts=None)`) get only the arguments they name; a required
argument that nobody can supply is an error at construction, not at step 1000. `trainer_state`
(the live TrainerState: global_step, epoch, ...), and TRL's `log_extra(column, values)` /
`log_metric(name, value)` reach functions that name them or take `**kwargs`, as in TRL.

A function may be `async def`: the async functions of a batch run concurrently on one event
loop. It may return `None` for a sample it does not apply to; that sample's weighted sum leaves
the function out, and a sample that no function scores is *invalid*: it gets advantage 0 and no
part in its group's baseline (see `advantages.leave_one_out_advantages`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from rloo.event_loop import EventLoop
from rloo.rewards.deadline import RewardError, RewardTimeout, call_with_deadline, none_for_all, scored_alone, timeout_error
from rloo.safe_text import visible

RewardFunc = Callable[..., Sequence[float | None]]

# Arguments the trainer supplies besides the dataset's columns.
TRAINER_ARGUMENTS = ("prompts", "completions", "completion_ids")
# Not per-completion lists; supplied to functions that name them or take **kwargs (as TRL does).
OPT_IN_ARGUMENTS = ("trainer_state", "log_extra", "log_metric")


logger = logging.getLogger(__name__)


@dataclass
class RewardFunction:
    """One reward function and the keyword arguments its signature accepts."""

    func: RewardFunc
    name: str
    accepts_any: bool = False  # it takes **kwargs
    accepted: frozenset[str] = field(default_factory=frozenset)
    required: frozenset[str] = field(default_factory=frozenset)
    is_async: bool = False

    @classmethod
    def wrap(cls, func: RewardFunc, name: str | None = None) -> "RewardFunction":
        if not callable(func):
            raise TypeError(
                f"reward function {func!r} is not callable; pass a function "
                f"f(prompts, completions, completion_ids, **columns) -> list[float]."
            )
        name = name or getattr(func, "__name__", type(func).__name__)
        params = inspect.signature(func).parameters.values()
        accepts_any = any(p.kind is p.VAR_KEYWORD for p in params)
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))
        return cls(
            func=func,
            name=name,
            accepts_any=accepts_any,
            accepted=frozenset(p.name for p in named),
            required=frozenset(p.name for p in named if p.default is p.empty),
            is_async=is_async,
        )

    def check_available(self, available: set[str]) -> None:
        missing = sorted(self.required - available - set(OPT_IN_ARGUMENTS))
        if missing:
            raise RewardError(
                f"reward function `{self.name}` requires {missing}, which neither the trainer "
                f"({', '.join(TRAINER_ARGUMENTS + OPT_IN_ARGUMENTS)}) nor the dataset's columns "
                f"({sorted(available - set(TRAINER_ARGUMENTS))}) provide. Add the column to the dataset or give "
                f"the parameter a default."
            )

    def keyword_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The subset of `arguments` this function takes."""
        return {k: v for k, v in arguments.items()
                if k in self.accepted or self.accepts_any}

    def __call__(self, arguments: dict[str, Any]) -> Any:
        """Call the function; an async function returns its coroutine."""
        return self.func(**self.keyword_arguments(arguments))


def build_reward_functions(reward_funcs: Any, reward_processing_classes: Any = None,
                           device: Any = None, model_init_kwargs: dict | None = None) -> list[RewardFunction]:
    """Wrap every reward: callables as they are; model ids, paths and PreTrainedModels as `RewardModel`s.

    `reward_processing_classes` (one tokenizer, or a list aligned with `reward_funcs` with None
    for plain functions) gives the reward models' tokenizers; a missing one is loaded from the model.
    """
    from transformers import PreTrainedModel

    from rloo.rewards.reward_model import as_reward_model

    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    models = sum(isinstance(func, (str, PreTrainedModel)) for func in funcs)
    if reward_processing_classes is not None and not isinstance(reward_processing_classes, (list, tuple)) \
            and models > 1:  # which model is it for? TRL refuses this too ("must match")
        raise ValueError(f"reward_processing_classes is one tokenizer for {models} reward models; the number of "
                         f"tokenizers must match: give a list aligned with reward_funcs (None for plain functions and "
                         f"for models whose own tokenizer should be loaded).")
    if reward_processing_classes is None or not isinstance(reward_processing_classes, (list, tuple)):
        tokenizers = [reward_processing_classes] * len(funcs)
    else:
        tokenizers = list(reward_processing_classes)
    if len(tokenizers) != len(funcs):
        raise ValueError(f"reward_processing_classes has {len(tokenizers)} entries for {len(funcs)} reward functions; "
                         f"give one per reward function (None for plain functions).")
    wrapped = []
    for func, tokenizer in zip(funcs, tokenizers):
        if isinstance(func, (str, PreTrainedModel)):
            func = as_reward_model(func, tokenizer=tokenizer, device=device, model_init_kwargs=model_init_kwargs)
        wrapped.append(RewardFunction.wrap(func))
    return wrapped


def reward_arguments(rows: Sequence[dict[str, Any]], prompts: list, completions: list, completion_ids: list[list[int]],
                     num_generations: int, trainer_state: Any) -> dict[str, Any]:
    """Everything a reward function may ask for, one entry per completion (B = rows * K).

    `prompts`, `completions` and `completion_ids` come from the trainer; every other dataset column
    is repeated K times so that each completion sees its own row; `trainer_state` is passed whole.
    """
    arguments: dict[str, Any] = {
        "prompts": prompts,
        "completions": completions,
        "completion_ids": completion_ids,
        "trainer_state": trainer_state,
    }
    for column in rows[0]:
        if column != "prompt":
            arguments[column] = [row[column] for row in rows for _ in range(num_generations)]
    return arguments


@dataclass
class ScoredBatch:
    """What the reward functions made of a batch of B completions."""

    scores: torch.Tensor  # (B,) weighted sum over the functions that scored each sample; 0 if none did
    per_function: torch.Tensor  # (B, F) each function's reward, NaN where it returned None
    valid: torch.Tensor  # (B,) bool: at least one function scored the sample
    errors: dict[str, int] = field(default_factory=dict)  # completions each function raised on (policy "none")


def score_completions(
    reward_functions: Sequence[RewardFunction],
    weights: Sequence[float],
    arguments: dict[str, Any],
    num_completions: int,
    step: int = 0,
    error_policy: str = "stop",
    warn_unscored: bool = True,
    event_loop: EventLoop | None = None,
    timeout: float | None = None,
) -> ScoredBatch:
    """Run every reward function on a batch, check each value, and combine them with their weights.

    Args:
        reward_functions: the wrapped functions.
        weights: one weight per function.
        arguments: keyword arguments for the functions (prompts, completions, completion_ids, columns,
            trainer_state); the per-completion ones are lists of length num_completions.
        num_completions: B, the number of completions scored.
        step: the optimizer step, named in error messages.
        error_policy: "stop" raises when a function raises; "none" scores the completions it raised on
            None (each completion re-scored alone to find them) and counts them in `errors`.
        warn_unscored: warn when no function scored any completion (the trainer warns once per run).
        event_loop: where async functions run (the trainer's, `rloo.event_loop`); None: a loop of their own.
        timeout: reward_timeout, the seconds one function may take on the batch (None: no deadline). A function
            past it is abandoned and handled by `error_policy` (scored None on the whole batch with "none").

    Raises:
        RewardError: naming the function, the step and the sample, when a function raises or
            returns a wrong count, a non-number, NaN or inf; RewardTimeout when one runs past `timeout`.
    """
    errors: dict[str, int] = {}
    outputs = _call_all(reward_functions, arguments, step, errors if error_policy == "none" else None, event_loop,
                        timeout)
    columns = [_checked_column(fn, values, arguments, num_completions, step)
               for fn, values in zip(reward_functions, outputs)]
    per_function = torch.stack(columns, dim=1)  # (B, F)
    scored = ~per_function.isnan()
    weighted = torch.where(scored, per_function, torch.zeros_like(per_function)) * torch.tensor(weights, dtype=torch.float32)
    _check_float32(reward_functions, per_function, weighted, weights, arguments, step)
    if warn_unscored and not scored.any():
        # TRL's sentence first (scripts may match it), then what it means here.
        logger.warning("All reward functions returned None for the following kwargs:\n%s\n"
                       "step %d: every reward function returned None for every one of the %d completions; "
                       "their scores are 0 and this batch teaches nothing. Check that the rewards apply to "
                       "this dataset.", _describe_sample(arguments, 0), step, num_completions)
    return ScoredBatch(scores=weighted.sum(dim=1), per_function=per_function, valid=scored.any(dim=1), errors=errors)


def _check_float32(reward_functions: Sequence[RewardFunction], per_function: torch.Tensor, weighted: torch.Tensor,
                   weights: Sequence[float], arguments: dict[str, Any], step: int) -> None:
    """A reward finite as a Python float can overflow float32 (1e39), alone or once weighted."""
    bad = ~torch.isfinite(torch.where(per_function.isnan(), torch.zeros_like(per_function), per_function)) | \
        ~torch.isfinite(weighted)
    if not bad.any():
        return
    index, column = (int(i) for i in bad.nonzero()[0])
    raise RewardError(
        f"reward function {reward_functions[column].name!r} at step {step}: its reward "
        f"{per_function[index, column].item()!r} times weight {weights[column]!r} is not finite in "
        f"float32 (|x| must stay below 3.4e38); rescale the reward or its weight.\n"
        f"{_describe_sample(arguments, index)}")


def reward_function_metrics(names: Sequence[str], per_function: torch.Tensor) -> dict[str, float]:
    """`rewards/{name}/mean` and `/std` of each function over the samples it scored (NaN marks None),
    and `rewards/unscored_frac`, the fraction of samples no function scored (they sit out of learning).

    A function that scored no sample logs nothing rather than NaN; the std is the population std,
    so a single scored sample gives 0, not NaN.
    """
    metrics = {"rewards/unscored_frac": per_function.isnan().all(dim=1).float().mean().item()}
    for name, column in zip(names, per_function.unbind(dim=1)):
        scored = column[~column.isnan()]
        if scored.numel() == 0:
            continue
        metrics[f"rewards/{name}/mean"] = scored.mean().item()
        metrics[f"rewards/{name}/std"] = scored.std(unbiased=False).item()
    return metrics


# ------------------------------------------------------------------ calling and checking


def _call_all(reward_functions: Sequence[RewardFunction], arguments: dict[str, Any], step: int,
              errors: dict[str, int] | None = None, event_loop: EventLoop | None = None,
              timeout: float | None = None) -> list[Any]:
    """Outputs of every function, in order: plain ones called in turn, async ones awaited together.
    With `errors` (reward_error_policy "none"), a function that raises is scored None where it raises,
    and one that runs past `timeout` is scored None on the whole batch."""
    outputs: list[Any] = [None] * len(reward_functions)
    pending: dict[int, Any] = {}
    for index, fn in enumerate(reward_functions):
        try:
            result = call_with_deadline(fn, arguments, step, timeout)
        except RewardTimeout as error:  # calling it again (sample by sample) would hang again
            if errors is None:
                raise
            result = none_for_all(fn, arguments, step, error, errors)
        except Exception as error:
            if errors is None:
                raise _raised_error(fn, arguments, step, error, timeout) from error
            result = scored_alone(fn, arguments, step, error, errors, timeout)
        if inspect.isawaitable(result):
            pending[index] = result
        else:
            outputs[index] = result
    if pending:
        results = _run_coroutines(list(pending.values()), event_loop)
        for (index, fn), result in zip(((i, reward_functions[i]) for i in pending), results):
            if timeout is not None and isinstance(result, asyncio.TimeoutError):  # asyncio.wait_for's
                result = timeout_error(fn, arguments, step, timeout)
                if errors is None:
                    raise result
            if isinstance(result, BaseException):
                if errors is None:
                    raise _raised_error(fn, arguments, step, result) from result
                result = none_for_all(fn, arguments, step, result, errors)
            outputs[index] = result
    return outputs


def _run_coroutines(awaitables: list[Any], event_loop: EventLoop | None = None) -> list[Any]:
    """Await all concurrently, on the run's `event_loop` when given (the trainer's: clients and locks an async
    reward function keeps survive from one step to the next); exceptions are returned, not raised, so each is
    blamed on its function."""

    async def gather() -> list[Any]:
        return await asyncio.gather(*awaitables, return_exceptions=True)

    if event_loop is not None:
        return event_loop.run(gather())
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: no loop running in this thread
        return asyncio.run(gather())
    # Called from inside a running loop (a notebook): run ours on a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, gather()).result()


def _checked_column(fn: RewardFunction, values: Any, arguments: dict[str, Any], num_completions: int,
                    step: int) -> torch.Tensor:
    """(B,) float rewards with NaN for None, after checking the count and every value."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise RewardError(
            f"reward function `{fn.name}` returned a {type(values).__name__} at step {step}; it must return a "
            f"list with one number (or None) per completion."
        )
    values = values.tolist() if hasattr(values, "tolist") else list(values)  # tensors, numpy arrays
    if len(values) != num_completions:
        raise RewardError(
            f"reward function `{fn.name}` returned {len(values)} values for {num_completions} completions at "
            f"step {step}; it must return exactly one number (or None) per completion (nothing is broadcast)."
        )
    for index, value in enumerate(values):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            problem = f"{value!r} (a {type(value).__name__}, not a number)"
        elif not math.isfinite(value):
            problem = repr(float(value))
        else:
            continue
        raise RewardError(
            f"reward function `{fn.name}` returned {problem} for sample {index} at step {step}; rewards must be "
            f"finite numbers, or None where the function does not apply.\n{_describe_sample(arguments, index)}"
        )
    return torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float32)


def _raised_error(fn: RewardFunction, arguments: dict[str, Any], step: int, error: BaseException,
                  timeout: float | None = None) -> RewardError:
    """A RewardError for a function that raised, naming the sample that makes it raise if one does."""
    index = None if fn.is_async else _first_failing_sample(fn, arguments, step, timeout)
    where = (f"on sample {index}" if index is not None
             else "on the batch (no single sample reproduces it)" if not fn.is_async else "on the batch")
    sample = f"\n{_describe_sample(arguments, index)}" if index is not None else ""
    return RewardError(f"reward function `{fn.name}` raised {type(error).__name__}: {error} at step {step}, "
                       f"{where}.{sample}")


def _first_failing_sample(fn: RewardFunction, arguments: dict[str, Any], step: int = 0,
                          timeout: float | None = None) -> int | None:
    """Re-call a batch function on one sample at a time to find the first that makes it raise.

    Only runs after the function already failed, so the extra calls cost nothing in normal training.
    """
    num_completions = len(arguments.get("completions", []))
    for index in range(num_completions):
        single = {k: v[index : index + 1] if isinstance(v, list) and len(v) == num_completions else v
                  for k, v in arguments.items()}
        try:
            call_with_deadline(fn, single, step, timeout)
        except Exception:
            return index
    return None


def shorten(text: Any, limit: int = 200) -> str:
    """`text` as one line of at most about `limit` characters, keeping its start and end."""
    if isinstance(text, list):  # conversational: the messages' contents
        text = " | ".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in text if isinstance(m, dict))
    text = visible(" ".join(str(text).split()))  # untrusted: printed in messages and log lines
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def _describe_sample(arguments: dict[str, Any], index: int) -> str:
    prompts, completions = arguments.get("prompts", []), arguments.get("completions", [])
    prompt = shorten(prompts[index]) if index < len(prompts) else "?"
    completion = shorten(completions[index]) if index < len(completions) else "?"
    return f"  prompt:     {prompt}\n  completion: {completion}"

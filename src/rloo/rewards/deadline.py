"""A reward function's call on a batch: abandoned after reward_timeout (issue #48), the errors it ends in, and what
reward_error_policy="none" makes of a call that raised (None where it raises)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from rloo.safe_text import visible

logger = logging.getLogger(__name__)


class RewardError(RuntimeError):
    """A reward function was misconfigured or returned something unusable."""


class RewardTimeout(RewardError):
    """A reward function did not return within reward_timeout seconds."""


def call_with_deadline(fn: Any, arguments: dict[str, Any], step: int, timeout: float | None) -> Any:
    """fn(arguments), abandoned after `timeout` seconds (None: waited for). A plain function runs on a daemon
    thread (Python cannot stop a thread; it finishes in the background and cannot keep the process alive);
    an async one's coroutine is wrapped in asyncio.wait_for. Raises RewardTimeout (a plain function)."""
    if timeout is None:
        return fn(arguments)
    if fn.is_async:
        return asyncio.wait_for(fn(arguments), timeout)
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = fn(arguments)
        except BaseException as error:  # handed to the caller's thread below
            box["error"] = error

    thread = threading.Thread(target=call, name=f"reward {fn.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise timeout_error(fn, arguments, step, timeout)
    if "error" in box:
        raise box["error"]
    return box["value"]


def timeout_error(fn: Any, arguments: dict[str, Any], step: int, timeout: float | None) -> RewardTimeout:
    return RewardTimeout(
        f"reward function `{visible(fn.name)}` did not return within reward_timeout={timeout:g} s at step {step}, on "
        f"the batch of {len(arguments.get('completions', []))} completions; it was abandoned. Raise reward_timeout "
        f"for a slow reward, or set reward_error_policy='none' to score such a batch None and go on.")


def scored_alone(fn: Any, arguments: dict[str, Any], step: int, error: BaseException,
                  errors: dict[str, int], timeout: float | None = None) -> list[Any]:
    """A function that raised on the batch, called on each completion alone: None where it raises again."""
    num_completions = len(arguments.get("completions", []))
    values: list[Any] = []
    raised = 0
    for index in range(num_completions):
        single = {k: v[index : index + 1] if isinstance(v, list) and len(v) == num_completions else v
                  for k, v in arguments.items()}
        try:
            value = call_with_deadline(fn, single, step, timeout)
        except Exception:
            raised += 1
            values.append(None)
            continue
        values.append(value[0] if isinstance(value, (list, tuple)) and len(value) == 1 else value)
    errors[fn.name] = raised
    logger.warning("reward function `%s` raised %s: %s at step %d; the %d of %d completions it raises on are scored "
                   "None (reward_error_policy='none').", visible(fn.name), type(error).__name__, visible(error), step,
                   errors[fn.name], num_completions)
    return values


def none_for_all(fn: Any, arguments: dict[str, Any], step: int, error: BaseException,
                  errors: dict[str, int]) -> list[Any]:
    """An async function that raised: every completion of the batch is scored None by it."""
    num_completions = len(arguments.get("completions", []))
    errors[fn.name] = num_completions
    logger.warning("reward function `%s` raised %s: %s at step %d; its %d completions are scored None "
                   "(reward_error_policy='none').", visible(fn.name), type(error).__name__, visible(error), step, num_completions)
    return [None] * num_completions

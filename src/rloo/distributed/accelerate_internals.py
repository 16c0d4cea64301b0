"""The private accelerate APIs rloo calls, in one place, each with the reason a public one does not do.

A test (tests/distributed/test_accelerate_internals.py) checks that no other module touches a private
accelerate attribute, so an accelerate upgrade that moves them breaks here and only here.
"""

from __future__ import annotations

from accelerate import Accelerator
from accelerate.state import AcceleratorState


def mark_step_end(accelerator: Accelerator, is_last: bool) -> None:
    """Tell accelerate whether this micro-batch ends the optimizer step (`sync_gradients`).

    The public route, `accelerator.accumulate(model)`, counts micro-batches itself and ends a step on the
    last batch of a prepared DataLoader; rloo has no DataLoader and slices each step into a fixed number of
    micro-batches, so it sets the flag that `accumulate` sets inside. DeepSpeed's engine and every backend's
    gradient sync read it."""
    accelerator.gradient_state._set_sync_gradients(is_last)


def reset_mixed_precision_if_changed(mixed_precision: str) -> None:
    """Let a second trainer in one process (a notebook) use another precision.

    accelerate keeps one process-wide state and refuses a new Accelerator whose precision differs; it has
    no public way to change it. Only the precision part is reset: processes and devices stay."""
    if AcceleratorState._shared_state and AcceleratorState().mixed_precision != mixed_precision:
        AcceleratorState._reset_state(reset_partial_state=False)

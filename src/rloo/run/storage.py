"""Storage faults under output_dir (issue #48), and CheckpointError: torch.save reports a failed write (a full
disk) as a RuntimeError without the errno; a small synced write finds the OSError again, with its errno."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used: missing, incomplete, damaged, or written by an incompatible run."""


@contextlib.contextmanager
def write_errors_named(output_dir: str, global_step: int) -> Iterator[None]:
    """A write failure while saving checkpoint-<global_step> (a full disk, a folder made read-only) becomes a
    CheckpointError naming the errno and output_dir."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        if not isinstance(error, OSError):
            if not is_torch_write_error(error):
                raise
            error = storage_error(Path(output_dir)) or error  # torch.save hides the OSError: find it again
        raise CheckpointError(f"could not write checkpoint-{global_step} into output_dir={output_dir!r}: {error}. "
                              f"Free disk space or fix the folder's permissions (or choose another output_dir); "
                              f"the previous checkpoint is intact, so resuming from 'latest' works.") from error


def is_torch_write_error(error: RuntimeError) -> bool:
    """torch.save's zip writer reports a failed write (a full disk) as a RuntimeError without the errno."""
    return any(marker in str(error) for marker in ("inline_container", "PytorchStreamWriter", "unexpected pos"))


def storage_error(output_dir: Path) -> OSError | None:
    """The OSError (errno and path) a small synced write into output_dir raises now, or None if it succeeds."""
    probe = output_dir / ".rloo-write-probe"
    try:
        with open(probe, "wb") as handle:
            handle.write(b"\0" * 2**20)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        return OSError(error.errno, error.strerror, str(output_dir))
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only folder: nothing was written
    return None

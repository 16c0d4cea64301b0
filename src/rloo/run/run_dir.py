"""What keeps a run's output trustworthy across stops and restarts: the output directory check,
the history cut back on resume, and graceful stops on SIGTERM / SIGINT.

- `prepare_output_dir`: a fresh run refuses an output_dir holding another run's checkpoints or
  metrics unless `overwrite_output_dir=True` (then it clears them first).
- `truncate_history`: on resume, metrics.jsonl and completions.jsonl keep only the rows up to the
  checkpoint's step (and drop a line cut by a kill), so a resumed run's files equal an uninterrupted one's.
- `StopSignals`: the first SIGTERM or SIGINT asks the loop to stop after the current rollout's optimizer
  steps and save a checkpoint; a second one exits at once (checkpoints are atomic, so none is half-written).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from rloo.config import ConfigError
from rloo.run.checkpoint import CHECKPOINT_NAME, TEMPORARY_NAME

logger = logging.getLogger(__name__)

HISTORY_FILES = ("metrics.jsonl", "completions.jsonl", "eval_completions.jsonl")


def previous_run_files(output_dir: str | Path) -> list[Path]:
    """Checkpoints (complete or not) and history files that an earlier run left in output_dir."""
    directory = Path(output_dir)
    if not directory.is_dir():
        return []
    found = [directory / name for name in HISTORY_FILES if (directory / name).exists()]
    found += sorted(p for p in directory.iterdir() if p.is_dir() and (CHECKPOINT_NAME.match(p.name)
                                                                     or TEMPORARY_NAME.match(p.name)))
    return found


def check_output_dir(output_dir: str | Path) -> None:
    """Before anything loads: output_dir is a directory, or can become one, that this process may write."""
    directory = Path(output_dir).expanduser()
    existing = next((p for p in (directory, *directory.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"output_dir={str(output_dir)!r} cannot be created: {str(existing)!r} is a file, not a "
                          f"directory. Choose another output_dir.")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"output_dir={str(output_dir)!r} is not writable ({str(existing)!r} does not allow writing). "
                          f"Choose another output_dir or change its permissions.")


def refuse_used_output_dir(output_dir: str | Path) -> None:
    """Refuse a fresh run into an output_dir holding another run's files (the CLI calls it before loading)."""
    found = previous_run_files(output_dir)
    if found:
        names = ", ".join(p.name for p in found[:4]) + (", ..." if len(found) > 4 else "")
        raise ConfigError(f"output_dir={str(output_dir)!r} holds another run's files ({names}). Resume it with "
                          f"resume_from_checkpoint='latest', choose another output_dir, or set "
                          f"overwrite_output_dir=True to delete them.")


def prepare_output_dir(output_dir: str | Path, overwrite: bool) -> None:
    """Refuse (or with overwrite, clear) another run's checkpoints and history in a fresh run's output_dir."""
    directory = Path(output_dir)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"output_dir={str(output_dir)!r} exists and is not a directory; give a directory path.")
    found = previous_run_files(directory)
    if not found:
        return
    if not overwrite:
        refuse_used_output_dir(directory)
    for path in found:
        logger.warning("overwrite_output_dir=True: deleting %s from an earlier run.", path)
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def truncate_history(output_dir: str | Path, step: int) -> None:
    """Keep only the rows with `step` <= the given step in the history files (rewritten atomically)."""
    for name in HISTORY_FILES:
        path = Path(output_dir) / name
        if not path.exists():
            continue
        kept, dropped = [], 0
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # a line cut short by a kill
                dropped += 1
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
                kept.append(line)
            else:
                dropped += 1
        if dropped:
            logger.warning("Resuming at step %d: dropped %d row(s) of %s written after the checkpoint.",
                           step, dropped, path)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text("".join(line + "\n" for line in kept))
        os.replace(temporary, path)


class StopSignals:
    """Catch SIGTERM and SIGINT while training: the first asks for a graceful stop, a second exits at once.

    Used as a context manager around the loop; the previous handlers come back on exit. Does nothing
    outside the main thread (Python delivers signals only there).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            print(f"rloo: second signal ({name}): exiting now; the last complete checkpoint is intact.",
                  file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.received = name
        print(f"rloo: {name} received: finishing the current optimizer step(s), then saving a checkpoint "
              f"(send it again to exit at once).", file=sys.stderr, flush=True)


def resume_hint(args: Any) -> str:
    """How to resume from the checkpoint a stopped run just saved (none can, with save_only_model)."""
    if args.save_only_model:
        return "It holds the weights only (save_only_model=True): the run cannot resume from it."
    return ("Resume with the same command and --resume_from_checkpoint latest (or "
            "trainer.train(resume_from_checkpoint='latest')).")

"""One run per output_dir: a lock held for the life of a run.

Two runs writing into one folder interleave their metrics.jsonl rows, rotate each other's checkpoints
and trip over each other's temporary saves. So a run holds an exclusive `fcntl.flock` on
`output_dir/.rloo.lock` from the moment it starts (before anything is loaded) until it ends, and a
second run is refused at once with the first one's process id, host and start time.

- The kernel releases a flock when its process dies, however it dies: a crashed or SIGKILLed run
  leaves no stale lock. The file itself stays (it is never deleted, so no run can lock a file that
  another has just unlinked); what it names is read only while a live process holds the lock.
- One run launched as several processes (torchrun, `accelerate launch`) takes the lock once: its
  global rank 0 (RANK, PMI_RANK or OMPI_COMM_WORLD_RANK; 0 when unset) holds it, the other ranks
  never touch it, so the processes of one run never refuse each other; a second launch's rank 0 is
  refused and its launcher stops its other ranks.
- Within one process the lock is shared: a second trainer on the same folder (a resume in the same
  notebook) takes it again; it is released when the last trainer holding it is garbage-collected,
  or at exit.
- A run that is refused writes nothing: it opens the lock file (the holder created it), fails to
  lock it and reads it.
- The record holds no command line (flags may carry tokens, and the folder may be uploaded);
  `push_to_hub` leaves the file out.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import weakref
from pathlib import Path
from typing import Mapping

from rloo.config import ConfigError
from rloo.safe_text import visible

LOCK_NAME = ".rloo.lock"
RANK_VARIABLES = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK")

_held: dict[str, "RunLock"] = {}  # realpath of output_dir -> this process's lock on it


def global_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank in its launch, from the launcher's variables (0 when launched alone)."""
    env = os.environ if env is None else env
    for name in RANK_VARIABLES:
        if env.get(name, "").strip().isdigit():
            return int(env[name])
    return 0


class RunLock:
    """This process's hold on one output_dir (shared by the trainers of the process that use it)."""

    def __init__(self, key: str, path: Path, fd: int) -> None:
        self.key, self.path, self.fd, self.users = key, path, fd, 1

    def release(self) -> None:
        """One user fewer; the last one unlocks."""
        self.users -= 1
        if self.users <= 0:
            self.close()

    def close(self) -> None:
        """Unlock now, whoever else in this process shares the lock (the command line, once its run is
        over): closing the descriptor releases the flock. Closing twice does nothing."""
        if self.fd < 0:
            return
        if _held.get(self.key) is self:
            del _held[self.key]
        os.close(self.fd)
        self.fd = -1


def lock_output_dir(output_dir: str | Path, env: Mapping[str, str] | None = None,
                    owner: object | None = None) -> RunLock | None:
    """Take output_dir for this run, or raise ConfigError naming the run that holds it.

    Returns the lock (release it with `.release()`, or let the process end), or None on a rank other
    than 0 (rank 0 holds the lock for the whole launch). Creates output_dir when it does not exist.
    With `owner` (a trainer), this use of the lock is released when the owner is garbage-collected.
    """
    if global_rank(env) != 0:
        return None
    lock = _take(output_dir)
    if owner is not None:
        weakref.finalize(owner, lock.release)
    return lock


def _take(output_dir: str | Path) -> RunLock:
    directory = Path(output_dir).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(directory)
    if key in _held:
        _held[key].users += 1
        return _held[key]
    path = directory / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise ConfigError(in_use_message(output_dir, holder)) from None
    _write_holder(fd)
    lock = _held[key] = RunLock(key, path, fd)
    return lock


def in_use_message(output_dir: str | Path, holder: dict) -> str:
    who = (visible(f"process {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}")
           if holder else "another process (it has not written its id yet)")
    return (f"output_dir={str(output_dir)!r} is in use by another run: {who}; its lock is "
            f"{Path(output_dir) / LOCK_NAME}. Two runs in one folder would mix their metrics and checkpoints. Wait "
            f"for that run to end (a crashed run holds nothing), or choose another output_dir.")


def _write_holder(fd: int) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())}
    data = (json.dumps(record) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _read_holder(fd: int, attempts: int = 20) -> dict:
    """The holder's record; it writes it right after locking, so an empty file is read again a few times."""
    for _ in range(attempts):
        try:
            record = json.loads(os.pread(fd, 4096, 0).decode(errors="replace"))
        except ValueError:
            record = None
        if isinstance(record, dict):
            return record
        time.sleep(0.05)
    return {}

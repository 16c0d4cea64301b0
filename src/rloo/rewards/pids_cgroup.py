"""The code sandbox's pids cgroup layer: a cgroup per run whose `pids.max` bounds how many processes and
threads the program has at once (a v1 `pids` hierarchy, or a v2 cgroup with `pids` delegated), killed and
removed after the run. `isolation.py` documents the layers.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import signal
import time

logger = logging.getLogger(__name__)
_cgroup_names = itertools.count()


def _own_cgroup_dirs() -> list[str]:
    """Candidate parents for a pids cgroup: this process's cgroup in a v1 `pids` or a v2 hierarchy."""
    try:
        with open("/proc/self/cgroup") as own, open("/proc/self/mountinfo") as table:
            memberships = [line.rstrip("\n").split(":", 2) for line in own]
            mounts = [line.split() for line in table]
    except OSError:
        return []
    found = []
    for _, controllers, path in memberships:
        for fields in mounts:
            fstype, options = fields[fields.index("-") + 1], fields[-1].split(",")
            v1_pids = controllers == "pids" and fstype == "cgroup" and "pids" in options
            if v1_pids or (controllers == "" and fstype == "cgroup2" and _v2_delegates_pids(fields[4], path)):
                found.append(os.path.join(fields[4], path.lstrip("/")))
    return found


@functools.lru_cache(maxsize=1)
def pids_cgroup_parent() -> tuple[str | None, str]:
    """A cgroup under which this process may create pids-limited children: (directory, "") or (None, why not)."""
    reasons = []
    for parent in _own_cgroup_dirs():
        probe = os.path.join(parent, f"rloo-sandbox-probe-{os.getpid()}")
        try:
            os.mkdir(probe)
            with open(os.path.join(probe, "pids.max"), "w") as limit:
                limit.write("4")
            _remove_stale_cgroups(parent)
            return parent, ""
        except OSError as error:
            reasons.append(f"{parent}: {error.strerror}")
        finally:
            try:
                os.rmdir(probe)
            except OSError:
                pass
    return None, "; ".join(reasons) or "no v1 pids hierarchy and no v2 cgroup with pids delegated"


def _remove_stale_cgroups(parent: str) -> None:
    """Remove the empty run cgroups of trainers that died (SIGKILLed: their own cleanup never ran)."""
    for name in os.listdir(parent):
        parts = name.split("-")
        if name.startswith("rloo-sandbox-") and len(parts) == 4 and parts[2].isdigit() \
                and not os.path.exists(f"/proc/{parts[2]}"):
            try:
                os.rmdir(os.path.join(parent, name))  # fails, harmlessly, while a process is still in it
            except OSError:
                pass


def _v2_delegates_pids(mount_point: str, path: str) -> bool:
    """Whether a v2 cgroup lets its children limit pids (the controller is in its subtree_control)."""
    try:
        with open(os.path.join(mount_point, path.lstrip("/"), "cgroup.subtree_control")) as control:
            return "pids" in control.read().split()
    except OSError:
        return False


class PidsCgroup:
    """A cgroup for one run with `pids.max` set; `close()` kills what is left in it and removes it."""

    def __init__(self, parent: str, max_tasks: int):
        self.path = os.path.join(parent, f"rloo-sandbox-{os.getpid()}-{next(_cgroup_names)}")
        os.mkdir(self.path)
        with open(os.path.join(self.path, "pids.max"), "w") as limit:
            limit.write(str(max_tasks))

    def pids(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as procs:
                return [int(pid) for pid in procs.read().split()]
        except OSError:
            return []

    def close(self) -> None:
        """Kill every process still in it (bounded retries: a dying process leaves in milliseconds), then remove it."""
        for _ in range(200):
            left = self.pids()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
        try:
            os.rmdir(self.path)
        except OSError as error:
            logger.warning("could not remove the sandbox's cgroup %s: %s", self.path, error)

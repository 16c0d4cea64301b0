"""How the code sandbox isolates a child process, using what the operating system offers.

Three layers, each used when this machine supports it (probed once per process; the first
`check_isolation` logs which are missing, once):

* namespaces (`unshare(2)` through ctypes; no external tool): a new user namespace in which the
  program runs as uid/gid 65534 with no capabilities (when the trainer is root, the ids map to
  the host's 65534 too), network, IPC, UTS, pid and mount namespaces. The mount namespace gets a
  new root, `pivot_root`ed into: a size- and inode-limited tmpfs holding the program's directory
  `/work`, `/tmp` and `/dev/shm` (so the total disk it can fill is bounded), read-only binds of
  the system and Python directories it needs to run (`/usr`, `/lib*`, the Python prefix), a few
  `/etc` files the dynamic linker needs, `/dev/{null,zero,full,random,urandom}`, and a fresh
  `/proc` of its own pid namespace. No host `/tmp`, `/run`, `/home`, `/root` (beyond the Python
  prefix), `/etc/shadow` or socket file exists in it, and abstract unix sockets are per network
  namespace, so it reaches none of the host's. The first process of the pid namespace is a small
  trusted init that never runs untrusted code; when it ends, the kernel kills every process left.
* a pids cgroup (v1 `pids` hierarchy or v2 with `pids` delegated) per run, bounding how many
  processes and threads exist at once, and killed and removed after the run. Without it,
  `RLIMIT_NPROC` bounds them, which binds inside the user namespace (the count is per namespace).
* Landlock (Linux >= 5.13), applied by the child before any untrusted code runs: reads only
  under system and Python directories and its own directories, writes only in those, no TCP
  bind/connect (ABI >= 4), no signals or abstract sockets outside it (ABI >= 6).

`isolation_layers()` says which work here. `RLOO_SANDBOX_ALLOW_UNISOLATED=1` (or
`allow_unisolated=True`) lets code run where neither namespaces nor Landlock work; otherwise it
is refused. The child-side code is Python source (`SETUP_SOURCE`, `LANDLOCK_SOURCE`) that the
child runs before the program, since nothing of the trainer may run between fork and exec.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import json
import logging
import os
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time

from rloo.rewards.jail import SETUP_SOURCE

logger = logging.getLogger(__name__)
ALLOW_UNISOLATED_ENV = "RLOO_SANDBOX_ALLOW_UNISOLATED"
DISABLE_ENV = "RLOO_SANDBOX_DISABLE"
NOBODY = 65534  # the uid and gid the program runs as inside the user namespace
_LANDLOCK_CREATE_RULESET, _LANDLOCK_CREATE_RULESET_VERSION = 444, 1
_PR_SET_PDEATHSIG = 1
SYSTEM_DIRS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin")
# What the dynamic linker and Debian-style /usr/bin symlinks need; nothing else of /etc is shown.
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")

_libc = ctypes.CDLL(None, use_errno=True)  # resolved now: nothing is loaded between fork and exec
_cgroup_names = itertools.count()
_reported = threading.Lock()
_missing_logged = False


class SandboxUnavailable(RuntimeError):
    """Raised when untrusted code would run without any operating-system isolation."""




@functools.lru_cache(maxsize=1)
def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where Landlock is missing or disabled."""
    if not sys.platform.startswith("linux") or os.uname().machine not in ("x86_64", "aarch64"):
        return 0  # the syscall numbers below are the generic ones, shared by these two
    version = _libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                            ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(version))


def _python_dirs() -> list[str]:
    """The directories Python needs: prefixes, the real interpreter's directory, site-packages."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable)), *site.getsitepackages()}
    return sorted(d for d in dirs if os.path.isdir(d))


def mount_plan() -> tuple[list[str], list[tuple[str, str]]]:
    """What the new root shows: read-only binds (each at its host path) and symlinks (path, target)."""
    binds, symlinks = [], []
    for path in [*SYSTEM_DIRS, *ETC_FILES, *_python_dirs()]:
        if os.path.islink(path):
            symlinks.append((path, os.readlink(path)))
            path = os.path.realpath(path)
        if os.path.exists(path) and path not in binds:
            binds.append(path)
    links = {link for link, _ in symlinks}
    binds = [p for p in binds if not any(p.startswith(b + "/") for b in binds)]  # already inside another bind
    return [p for p in binds if p not in links], symlinks


def namespace_spec(root: str, disk_mb: int, max_inodes: int) -> dict:
    """The child's instructions for its namespaces and new root (`root`: an empty directory to mount on)."""
    binds, symlinks = mount_plan()
    return {"namespaces": True, "root": root, "nobody": NOBODY, "disk_bytes": disk_mb * 2**20,
            "max_inodes": max_inodes, "binds": binds, "symlinks": symlinks}


def sandbox_paths() -> tuple[list[str], list[str]]:
    """Inside the new root: where the program may read, and where it may write (for Landlock)."""
    binds, _ = mount_plan()
    return sorted({*binds, "/etc", "/dev", "/proc", "/work", "/tmp", "/dev/shm"}), ["/work", "/tmp", "/dev/shm"]


_PROBE_SOURCE = SETUP_SOURCE + r'''
done = enter_sandbox(json.loads(sys.stdin.read()))
sys.stdout.write(json.dumps({**done, "uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid(),
                             "shadow": os.path.exists("/etc/shadow"), "tmp": os.listdir("/tmp")}))
'''


@functools.lru_cache(maxsize=1)
def probe_namespaces() -> tuple[dict | None, str]:
    """Enter the namespaces once with nothing to run: (what the child saw, "") or (None, why not)."""
    if not sys.platform.startswith("linux"):
        return None, "not Linux"
    with tempfile.TemporaryDirectory(prefix="rloo-sandbox-probe-") as private:
        os.mkdir(os.path.join(private, "root"))
        spec = namespace_spec(os.path.join(private, "root"), 1, 64)
        try:
            done = subprocess.run([sys.executable, "-I", "-c", _PROBE_SOURCE], input=json.dumps(spec), text=True,
                                  capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
        except (OSError, subprocess.TimeoutExpired) as error:
            return None, str(error)
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    try:
        seen = json.loads(done.stdout)
    except ValueError:
        return None, f"unexpected probe output {done.stdout[:200]!r}"
    if seen["uid"] != NOBODY or seen["pid"] != 2 or seen["shadow"] or seen["tmp"]:
        return None, f"the probe's view is not isolated: {seen}"
    return seen, ""


def unshare_works() -> bool:
    """Whether the user, mount, pid, network, IPC and UTS namespaces and the new root work here."""
    return probe_namespaces()[0] is not None


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


def isolation_layers() -> dict[str, bool]:
    """Which isolation layers this machine supports: {"namespaces": ..., "landlock": ..., "pids_cgroup": ...}.

    RLOO_SANDBOX_DISABLE (comma-separated layer names) switches layers off, to see what each one stops
    (docs/rewards.md's table); the trainer's environment is not the program's to set.
    """
    disabled = set(os.environ.get(DISABLE_ENV, "").split(","))
    return {"namespaces": "namespaces" not in disabled and unshare_works(),
            "landlock": "landlock" not in disabled and landlock_abi() > 0,
            "pids_cgroup": "pids_cgroup" not in disabled and pids_cgroup_parent()[0] is not None}


def _log_missing_once(layers: dict[str, bool]) -> None:
    """Say once per process which layers this machine lacks, and what that leaves open."""
    global _missing_logged
    with _reported:
        if _missing_logged:
            return
        _missing_logged = True
    effects = {
        "namespaces": (f"namespaces ({probe_namespaces()[1] or DISABLE_ENV}): the program sees the host's files (Landlock limits "
                       "reads), its network stack (UDP, unix sockets) and processes, and total disk is not bounded"),
        "landlock": f"Landlock (kernel without it, or {DISABLE_ENV}): no second layer on file access and TCP",
        "pids_cgroup": (f"a pids cgroup ({pids_cgroup_parent()[1] or DISABLE_ENV}): processes are bounded by RLIMIT_NPROC only"),
    }
    missing = [effects[name] for name, ok in layers.items() if not ok]
    if missing:
        logger.warning("the code sandbox runs without %s. See docs/rewards.md.", "; without ".join(missing))


def check_isolation(allow_unisolated: bool) -> dict[str, bool]:
    """The usable layers; raises SandboxUnavailable if there are none and running anyway was not allowed."""
    layers = isolation_layers()
    allowed = allow_unisolated or os.environ.get(ALLOW_UNISOLATED_ENV, "") == "1"
    if not (layers["namespaces"] or layers["landlock"]) and not allowed:
        raise SandboxUnavailable(
            "the code sandbox cannot isolate untrusted code on this machine: namespaces fail "
            f"({probe_namespaces()[1]}) and the kernel has no Landlock. Run training in a "
            "container or VM without network, then opt in with allow_unisolated=True (code_execution / "
            f"run_tests) or {ALLOW_UNISOLATED_ENV}=1; the child then only gets rlimits, a minimal environment and "
            "its own process group.")
    _log_missing_once(layers)
    return layers


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the thread that started it dies (the trainer included)."""
    if sys.platform.startswith("linux"):  # prctl is Linux-only; elsewhere only the timeout kill applies
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def host_readable_roots(workdir: str) -> list[str]:
    """Without namespaces, what the child may read under Landlock: system and Python directories, the dynamic
    linker's files of /etc (not /etc/shadow), /dev, /proc, its own directory."""
    roots = {*SYSTEM_DIRS, *ETC_FILES, "/dev", "/proc", *_python_dirs(), workdir}
    return sorted(root for root in roots if os.path.exists(root))


# Runs in the child before any untrusted code (part of the bootstrap; see sandbox.py).
LANDLOCK_SOURCE = r'''
def apply_landlock(abi, read_roots, write_roots):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fs_bits = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16}.get(abi, 16)
    handled_fs = (1 << fs_bits) - 1
    net = 0b11 if abi >= 4 else 0  # TCP bind and connect, with no rule allowing any port
    scoped = 0b11 if abi >= 6 else 0  # abstract unix sockets and signals outside the domain
    attr = (ctypes.c_uint64 * 3)(handled_fs, net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = libc.syscall(444, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    def allow(path, access):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = PathBeneath(access & handled_fs, fd)
        if libc.syscall(445, ruleset, 1, ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
        os.close(fd)

    for root in read_roots:
        if os.path.exists(root):
            allow(root, 0b1101 if os.path.isdir(root) else 0b101)  # execute, read file(, read dir)
    for root in write_roots:
        allow(root, handled_fs)
    allow("/dev/null", (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15))  # write, read, truncate, ioctl
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS, required to restrict oneself
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.syscall(446, ruleset, ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)
'''

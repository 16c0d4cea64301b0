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
import json
import logging
import os
import signal
import site
import subprocess
import sys
import tempfile
import threading

from rloo.rewards.jail import SETUP_SOURCE
from rloo.rewards.pids_cgroup import pids_cgroup_parent

logger = logging.getLogger(__name__)
ALLOW_UNISOLATED_ENV = "RLOO_SANDBOX_ALLOW_UNISOLATED"
ALLOW_MISSING_ENV = "RLOO_SANDBOX_ALLOW_MISSING"
DISABLE_ENV = "RLOO_SANDBOX_DISABLE"
LAYER_NAMES = ("namespaces", "landlock", "pids_cgroup")
NOBODY = 65534  # the uid and gid the program runs as inside the user namespace
_LANDLOCK_CREATE_RULESET, _LANDLOCK_CREATE_RULESET_VERSION = 444, 1
_PR_SET_PDEATHSIG = 1
SYSTEM_DIRS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin")
# What the dynamic linker and Debian-style /usr/bin symlinks need; nothing else of /etc is shown.
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")

_libc = ctypes.CDLL(None, use_errno=True)  # resolved now: nothing is loaded between fork and exec
_reported = threading.Lock()
_missing_logged = False
_allowed_missing: frozenset[str] = frozenset()  # set for the whole process by allow_missing (RLOOConfig)


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


def python_dirs() -> list[str]:
    """The directories Python needs: prefixes, the real interpreter's directory, site-packages."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable)), *site.getsitepackages()}
    return sorted(d for d in dirs if os.path.isdir(d))


# Folders of the new root that the jail fills itself (the program's scratch folders, its devices, its /proc): a
# host directory under one of them (a venv under /tmp, a conda prefix under /dev/shm) is shown under RELOCATED
# instead, so that it neither populates nor shadows them; the child's bootstrap rewrites its import paths to match.
JAIL_OWNED = ("/work", "/tmp", "/dev", "/proc")
RELOCATED = "/rloo-host"


def jail_path(path: str) -> str:
    """Where the new root shows the host's `path`: the same path, or under RELOCATED if a jail-owned folder holds it."""
    if any(path == owned or path.startswith(owned + "/") for owned in JAIL_OWNED):
        return RELOCATED + path
    return path


def mount_plan() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """What the new root shows: read-only binds (host path, path in the root) and symlinks (path, target)."""
    binds, symlinks = [], []
    for path in [*SYSTEM_DIRS, *ETC_FILES]:
        if os.path.islink(path):
            symlinks.append((path, os.readlink(path)))
            path = os.path.realpath(path)
        if os.path.exists(path) and path not in binds:
            binds.append(path)
    for path in python_dirs():  # a symlinked prefix is shown at both its paths (sys.path may use either)
        for shown in (path, os.path.realpath(path)):
            if shown not in binds and shown != "/":
                binds.append(shown)
    links = {link for link, _ in symlinks}
    binds = outermost(binds)
    return [(p, jail_path(p)) for p in binds if p not in links], symlinks


def outermost(paths: list[str]) -> list[str]:
    """`paths` less those inside another of them."""
    return [p for p in paths if not any(p.startswith(other + "/") for other in paths)]


def relocations() -> list[tuple[str, str]]:
    """The binds shown away from their host path: (host path, path in the root), for the child's import paths."""
    return [(host, shown) for host, shown in mount_plan()[0] if host != shown]


def namespace_spec(root: str, disk_mb: int, max_inodes: int) -> dict:
    """The child's instructions for its namespaces and new root (`root`: an empty directory to mount on)."""
    binds, symlinks = mount_plan()
    return {"namespaces": True, "root": root, "nobody": NOBODY, "disk_bytes": disk_mb * 2**20,
            "max_inodes": max_inodes, "binds": binds, "symlinks": symlinks, "relocated": relocations()}


def sandbox_paths() -> tuple[list[str], list[str]]:
    """Inside the new root: where the program may read, and where it may write (for Landlock)."""
    binds, _ = mount_plan()
    return sorted({*(shown for _, shown in binds), "/etc", "/dev", "/proc", "/work", "/tmp", "/dev/shm"}), \
        ["/work", "/tmp", "/dev/shm"]


_PROBE_SOURCE = SETUP_SOURCE + r'''
spec = json.loads(sys.stdin.read())
done = enter_sandbox(spec)
import decimal, email.mime.text  # imports after the pivot: the interpreter's own directories are where it looks
tmp = os.statvfs("/tmp")
sys.stdout.write(json.dumps({**done, "uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid(),
                             "shadow": os.path.exists("/etc/shadow"), "tmp": os.listdir("/tmp"),
                             "tmp_bytes": tmp.f_blocks * tmp.f_frsize, "host_folder": os.path.exists(spec["host_folder"])}))
'''


def _probe_problems(seen: dict, disk_bytes: int) -> list[str]:
    # What the probe's view must be for the program's to be isolated.
    problems = []
    if seen["uid"] != NOBODY or seen["pid"] != 2:
        problems.append(f"the program would run as uid {seen['uid']} with pid {seen['pid']} (expected {NOBODY} and 2)")
    if seen["shadow"] or seen["host_folder"]:
        problems.append("host files are visible in the new root")
    if seen["tmp"]:
        problems.append(f"the program's /tmp is not empty: {seen['tmp']}")
    if not 0 < seen["tmp_bytes"] <= disk_bytes:
        problems.append(f"the program's /tmp is not bounded to {disk_bytes} bytes ({seen['tmp_bytes']})")
    return problems


@functools.lru_cache(maxsize=1)
def probe_namespaces() -> tuple[dict | None, str]:
    """Enter the namespaces once with nothing to run: (what the child saw, "") or (None, why not).

    What is checked is what the program relies on: it runs as nobody in its own pid namespace, sees no host
    file outside the binds, has a private, empty, size-bounded /tmp, and the interpreter still imports."""
    if not sys.platform.startswith("linux"):
        return None, "not Linux"
    with tempfile.TemporaryDirectory(prefix="rloo-sandbox-probe-") as private:
        os.mkdir(os.path.join(private, "root"))
        spec = {**namespace_spec(os.path.join(private, "root"), 1, 64), "host_folder": private}
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
    problems = _probe_problems(seen, spec["disk_bytes"])
    if problems:
        return None, "; ".join(problems)
    return seen, ""


def unshare_works() -> bool:
    """Whether the user, mount, pid, network, IPC and UTS namespaces and the new root work here."""
    return probe_namespaces()[0] is not None


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


def _names(text_or_names) -> set[str]:
    names = text_or_names.split(",") if isinstance(text_or_names, str) else list(text_or_names or ())
    names = {name.strip() for name in names if name.strip()}
    unknown = names - set(LAYER_NAMES)
    if unknown:
        raise ValueError(f"unknown sandbox layer names {sorted(unknown)}; the layers are {list(LAYER_NAMES)}")
    return names


def allow_missing(names) -> None:
    """Accept, for this whole process, running the code sandbox without these layers (RLOOConfig's
    `sandbox_allow_missing` sets it when a trainer is built)."""
    global _allowed_missing
    _allowed_missing = frozenset(_names(names))


def accepted_missing(allow_missing_layers=()) -> set[str]:
    """The layers the user accepts running without: named in the call, in RLOO_SANDBOX_ALLOW_MISSING, in
    RLOOConfig.sandbox_allow_missing, or switched off on purpose with RLOO_SANDBOX_DISABLE."""
    return (_names(allow_missing_layers) | _names(os.environ.get(ALLOW_MISSING_ENV, "")) | set(_allowed_missing)
            | _names(os.environ.get(DISABLE_ENV, "")))


def check_isolation(allow_unisolated: bool = False, allow_missing_layers=()) -> dict[str, bool]:
    """The usable layers; raises SandboxUnavailable (fails closed) when the strongest layer, namespaces, cannot
    be set up and the user did not accept that by name, or when no layer works and running anyway was not allowed.

    A missing Landlock (the kernel has none) or pids cgroup is logged once and not refused: the namespaces
    layer bounds what they would."""
    layers = isolation_layers()
    unisolated = allow_unisolated or os.environ.get(ALLOW_UNISOLATED_ENV, "") == "1"
    if not (layers["namespaces"] or layers["landlock"]) and not unisolated:
        raise SandboxUnavailable(
            "the code sandbox cannot isolate untrusted code on this machine: namespaces fail "
            f"({probe_namespaces()[1] or DISABLE_ENV}) and the kernel has no Landlock. Run training in a "
            "container or VM without network, then opt in with allow_unisolated=True (code_execution / "
            f"run_tests) or {ALLOW_UNISOLATED_ENV}=1; the child then only gets rlimits, a minimal environment, "
            "an unprivileged uid when the trainer is root, and its own process group.")
    if not layers["namespaces"] and not unisolated and "namespaces" not in accepted_missing(allow_missing_layers):
        raise SandboxUnavailable(
            f"the code sandbox's namespaces layer cannot be set up here ({probe_namespaces()[1]}), and it refuses "
            "to run untrusted code with less isolation unless told to. Without it the program would reach the "
            "host's unix sockets by path and its UDP ports, see the host's processes and files (Landlock limits "
            "reads), and fill the disk without a total bound. Fix: allow unprivileged user namespaces (Linux: "
            "sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1 and, on Ubuntu 24.04+, "
            "kernel.apparmor_restrict_unprivileged_userns=0; in Docker a seccomp profile that permits unshare and "
            "mount), or accept the weaker sandbox by name: sandbox_allow_missing=['namespaces'] (RLOOConfig, "
            f"--sandbox_allow_missing namespaces) or {ALLOW_MISSING_ENV}=namespaces. docs/rewards.md says what each "
            "layer stops.")
    _log_missing_once(layers)
    return layers


def uses_code_sandbox(reward_funcs) -> bool:
    """Whether any of these reward functions runs code in the sandbox (marked `uses_code_sandbox`, as
    code_execution is)."""
    return any(getattr(func, "uses_code_sandbox", False) for func in reward_funcs or ())


def check_for_run(reward_funcs, allow_missing_layers) -> dict[str, bool] | None:
    """At the start of a run: record the run's accepted missing layers and, if a reward function uses the code
    sandbox, check its isolation now (SandboxUnavailable before any model loads); None when none uses it."""
    allow_missing(allow_missing_layers or ())
    return check_isolation() if uses_code_sandbox(reward_funcs) else None


def describe_layers(layers: dict[str, bool]) -> str:
    """One line: which layers the code sandbox uses on this machine."""
    on = [name + (f" (ABI {landlock_abi()})" if name == "landlock" else "") for name, ok in layers.items() if ok]
    off = [name for name, ok in layers.items() if not ok]
    return ("code sandbox layers: " + (", ".join(on) or "none") + (f"; without {', '.join(off)}" if off else "")
            + (f" (accepted: {', '.join(sorted(accepted_missing()))})" if accepted_missing() else ""))


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the thread that started it dies (the trainer included)."""
    if sys.platform.startswith("linux"):  # prctl is Linux-only; elsewhere only the timeout kill applies
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def host_readable_roots(workdir: str) -> list[str]:
    """Without namespaces, what the child may read under Landlock: system and Python directories, the dynamic
    linker's files of /etc (not /etc/shadow), /dev, /proc, its own directory."""
    roots = {*SYSTEM_DIRS, *ETC_FILES, "/dev", "/proc", *python_dirs(), workdir}
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

"""How the code sandbox isolates a child process, using what the operating system offers.

Two layers, each used when this machine supports it (probed once per process):

* namespaces, through util-linux `unshare`: a new user namespace (no privileges outside it), a
  network namespace with only a downed loopback (no network at all), a mount namespace with a
  fresh /proc, and a pid namespace whose first process is the child, so the kernel kills every
  process it started (a `setsid` grandchild included) when it ends; the trainer is invisible.
* Landlock (Linux >= 5.13), applied by the child before any untrusted code runs: reads only
  under system and Python directories and its own directory, writes only in its own directory,
  no TCP bind/connect (ABI >= 4), no signals to processes outside it (ABI >= 6).

`isolation_layers()` says which work here. `RLOO_SANDBOX_ALLOW_UNISOLATED=1` (or
`allow_unisolated=True`) lets code run where neither does; otherwise it is refused.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys

ALLOW_UNISOLATED_ENV = "RLOO_SANDBOX_ALLOW_UNISOLATED"
UNSHARE_FLAGS = ["--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child"]
_LANDLOCK_CREATE_RULESET, _LANDLOCK_CREATE_RULESET_VERSION = 444, 1
_PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)  # resolved now: nothing is loaded between fork and exec


class SandboxUnavailable(RuntimeError):
    """Raised when untrusted code would run without any operating-system isolation."""


@functools.lru_cache(maxsize=1)
def unshare_works() -> bool:
    """Whether `unshare` can create the user, network, mount and pid namespaces here."""
    binary = shutil.which("unshare")
    if binary is None:
        return False
    try:
        done = subprocess.run([binary, *UNSHARE_FLAGS, "--", "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@functools.lru_cache(maxsize=1)
def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where Landlock is missing or disabled."""
    if not sys.platform.startswith("linux") or os.uname().machine not in ("x86_64", "aarch64"):
        return 0  # the syscall numbers below are the generic ones, shared by these two
    version = _libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                            ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(version))


def isolation_layers() -> dict[str, bool]:
    """Which isolation layers this machine supports: {"namespaces": ..., "landlock": ...}."""
    return {"namespaces": unshare_works(), "landlock": landlock_abi() > 0}


def check_isolation(allow_unisolated: bool) -> dict[str, bool]:
    """The usable layers; raises SandboxUnavailable if there are none and running anyway was not allowed."""
    layers = isolation_layers()
    allowed = allow_unisolated or os.environ.get(ALLOW_UNISOLATED_ENV, "") == "1"
    if not any(layers.values()) and not allowed:
        raise SandboxUnavailable(
            "the code sandbox cannot isolate untrusted code on this machine: `unshare --user --net` fails (user "
            "namespaces disabled or util-linux missing) and the kernel has no Landlock. Run training in a "
            "container or VM without network, then opt in with allow_unisolated=True (code_execution / "
            f"run_tests) or {ALLOW_UNISOLATED_ENV}=1; the child then only gets rlimits, a minimal environment and "
            "its own process group.")
    return layers


def launcher(layers: dict[str, bool]) -> list[str]:
    """The command prefix that starts the child inside the namespaces (empty without them)."""
    return [shutil.which("unshare") or "unshare", *UNSHARE_FLAGS, "--"] if layers["namespaces"] else []


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the thread that started it dies (the trainer included)."""
    if sys.platform.startswith("linux"):  # prctl is Linux-only; elsewhere only the timeout kill applies
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def readable_roots(workdir: str) -> list[str]:
    """Directories the child may read under Landlock: system files, Python itself, its own directory."""
    roots = {"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/dev", "/proc", sys.prefix,
             sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)), workdir}
    return sorted(root for root in roots if os.path.isdir(root))


# Runs in the child before any untrusted code (part of the bootstrap; see sandbox.py).
LANDLOCK_SOURCE = r'''
def apply_landlock(abi, read_roots, workdir):
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
        allow(root, 0b1101)  # execute, read file, read dir
    allow(workdir, handled_fs)
    allow("/dev/null", (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15))  # write, read, truncate, ioctl
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS, required to restrict oneself
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.syscall(446, ruleset, ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)
'''

# Runs in the child, inside the namespaces, before Landlock and before any untrusted code: every
# mount becomes read-only except the child's own directory (bound onto itself first). This is
# what confines writes where Landlock is missing; locked flags (nosuid, nodev, atime) are kept.
READONLY_MOUNTS_SOURCE = r'''
def readonly_mounts(workdir):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    bind, rec, remount, rdonly = 4096, 16384, 32, 1
    keep = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
            "relatime": 1 << 21, "strictatime": 1 << 24}
    if libc.mount(workdir.encode(), workdir.encode(), None, bind | rec, None) != 0:
        raise OSError(ctypes.get_errno(), "bind-mounting the working directory")
    os.chdir(workdir)  # onto the new mount: the old working directory stays on the soon read-only one
    failed = []
    with open("/proc/self/mountinfo") as table:
        rows = [line.split() for line in table]
    for fields in rows:
        point = fields[4].encode().decode("unicode_escape")
        if point == workdir or point.startswith(workdir + "/"):
            continue
        flags = remount | bind | rdonly
        for option in fields[5].split(","):
            flags |= keep.get(option, 0)
        if libc.mount(None, point.encode(), None, flags, None) != 0:
            failed.append(point)
    if failed:
        raise OSError(f"could not make these mounts read-only: {failed}")
'''

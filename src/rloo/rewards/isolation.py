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


# Runs in the child before anything else (see sandbox.py). `enter_sandbox(spec)` returns only in
# the process that will run the program; the processes around it wait and exit with its status.
SETUP_SOURCE = r'''
import ctypes, json, os, signal, sys

_libc = ctypes.CDLL(None, use_errno=True)
_NEWNS, _NEWUTS, _NEWIPC, _NEWUSER, _NEWPID, _NEWNET = 0x20000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000
_RDONLY, _NOSUID, _NODEV, _NOEXEC, _REMOUNT, _BIND, _REC, _PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
_NOATIME, _NODIRATIME, _RELATIME = 1024, 2048, 1 << 21
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine)


def _check(result, what):
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _mount(source, target, fstype, flags, data=None):
    def encode(text):
        return None if text is None else text.encode()
    _check(_libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)),
           f"mount {source} on {target}")


def _write(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _die_with_parent():
    _check(_libc.prctl(1, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def _bind_readonly(source, target):
    """Bind `source` at `target` read-only, keeping the flags a user namespace may not clear."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(source, target, None, _BIND)
    kept = os.statvfs(source).f_flag & (_NOEXEC | _NOATIME | _NODIRATIME)
    kept |= _RELATIME if os.statvfs(source).f_flag & 4096 else 0  # ST_RELATIME
    _mount(None, target, None, _REMOUNT | _BIND | _RDONLY | _NOSUID | _NODEV | kept)


def _map_ids(host_uid, host_gid, nobody):
    """Map the sandbox's ids: root maps 0 and nobody to the host's; a user maps nobody to itself."""
    if host_uid != 0:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{nobody} {host_uid} 1\n")
        _write("/proc/self/gid_map", f"{nobody} {host_gid} 1\n")


def _unshare_mapped(nobody):
    """Enter new user, mount, pid, network, IPC and UTS namespaces, with ids mapped."""
    host_uid, host_gid = os.geteuid(), os.getegid()
    flags = _NEWUSER | _NEWNS | _NEWPID | _NEWNET | _NEWIPC | _NEWUTS
    if host_uid != 0:
        _check(_libc.unshare(flags), "unshare")
        _map_ids(host_uid, host_gid, nobody)
        return
    # Only a process still privileged in the host's namespace may map the host's ids: a helper.
    go_read, go_write = os.pipe()
    done_read, done_write = os.pipe()
    helper = os.fork()
    if helper == 0:
        try:
            os.close(go_write)
            if os.read(go_read, 1) == b"1":
                parent = os.getppid()
                for name in ("uid_map", "gid_map"):
                    _write(f"/proc/{parent}/{name}", f"0 0 1\n{nobody} {nobody} 1\n")
                os.write(done_write, b"1")
        finally:
            os._exit(0)
    os.close(go_read)
    os.close(done_write)
    try:
        _check(_libc.unshare(flags), "unshare")
        os.write(go_write, b"1")
    finally:
        os.close(go_write)
        mapped = os.read(done_read, 1) == b"1"
        os.waitpid(helper, 0)
    if not mapped:
        raise OSError("could not write the user namespace's uid_map/gid_map")


def _build_root(spec):
    """Populate the new root (a tmpfs at spec["root"]) and pivot into it; returns what worked."""
    root, nobody, done = spec["root"], spec["nobody"], {}
    os.umask(0o022)  # what it creates (the Python prefix's parent folders included) is readable by the program
    _mount(None, "/", None, _REC | _PRIVATE)  # nothing mounted here propagates back to the host
    _mount("tmpfs", root, "tmpfs", _NOSUID | _NODEV,
           f"size={spec['disk_bytes']},nr_inodes={spec['max_inodes']},mode=0755")
    for name, mode in (("work", 0o700), ("tmp", 0o1777), ("dev", 0o755), ("dev/shm", 0o1777), ("proc", 0o555),
                       ("etc", 0o755)):
        os.mkdir(f"{root}/{name}")
        os.chmod(f"{root}/{name}", mode)
    os.chown(f"{root}/work", nobody, nobody)
    for device in ("null", "zero", "full", "random", "urandom"):
        open(f"{root}/dev/{device}", "w").close()
        _mount(f"/dev/{device}", f"{root}/dev/{device}", None, _BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    with open(f"{root}/etc/passwd", "w") as passwd:
        passwd.write(f"root:x:0:0:root:/:/bin/false\nnobody:x:{nobody}:{nobody}:nobody:/work:/bin/false\n")
    with open(f"{root}/etc/group", "w") as group:
        group.write(f"root:x:0:\nnogroup:x:{nobody}:\n")
    for link, target in spec["symlinks"]:
        os.makedirs(os.path.dirname(root + link), exist_ok=True)
        os.symlink(target, root + link)
    for path in spec["binds"]:
        _bind_readonly(path, root + path)
    try:
        _mount("proc", f"{root}/proc", "proc", _NOSUID | _NODEV | _NOEXEC)
        done["proc"] = True
    except OSError:
        done["proc"] = False  # e.g. a container that masks parts of its /proc: then the program has none
    for name in ("work", "tmp", "dev/shm"):  # stay writable when the rest of the root turns read-only
        _mount(f"{root}/{name}", f"{root}/{name}", None, _BIND)
    os.chdir(root)
    if _PIVOT_ROOT is not None and _libc.syscall(_PIVOT_ROOT, b".", b".") == 0:
        _check(_libc.umount2(b".", 2), "unmounting the old root")  # MNT_DETACH: the host's tree is gone
        done["pivot_root"] = True
    else:
        _check(_libc.chroot(b"."), "chroot")  # no capability is left to leave it with
        done["pivot_root"] = False
    os.chdir("/")
    _mount(None, "/", None, _REMOUNT | _BIND | _RDONLY | _NOSUID | _NODEV)
    _libc.sethostname(b"sandbox", ctypes.c_size_t(7))
    return done


def _drop_privileges(nobody):
    """Become nobody with no capabilities, for good (no_new_privs: no setuid binary gives any back)."""
    try:
        os.setgroups([])
    except OSError:
        pass  # setgroups is denied in a namespace a non-root user made; there are no groups to drop
    os.setresgid(nobody, nobody, nobody)
    os.setresuid(nobody, nobody, nobody)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    _check(_libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")
    _libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    _check(_libc.prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def _wait_exit(pid):
    """Wait for `pid` (reaping anything else that ends meanwhile), then exit with its status."""
    while True:
        try:
            ended, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(3)
        if ended == pid:
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def _setup_failed(error):
    os.write(2, f"SANDBOX_SETUP_FAILED {type(error).__name__}: {error}\n".encode())
    os._exit(3)


def enter_sandbox(spec):
    """Join the run's cgroup and enter the namespaces; returns, in the program's process, what worked."""
    if spec.get("cgroup"):
        _write(os.path.join(spec["cgroup"], "cgroup.procs"), "0")
    if not spec.get("namespaces"):
        return {}
    launcher = os.getppid()
    _unshare_mapped(spec["nobody"])
    _die_with_parent()  # changing credentials cleared it; the trainer's death still ends the run
    if os.getppid() != launcher:
        os._exit(3)
    init = os.fork()
    if init:  # the launcher, outside the pid namespace, reports its init's status; SIGTERM: end the run now
        signal.signal(signal.SIGTERM, lambda *_: os.kill(init, signal.SIGKILL))
        _wait_exit(init)  # returns once the kernel has killed and reaped every process of the namespace
    try:  # pid 1 of the new namespace: trusted, never runs the program; when it ends, all end
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # pid 1 ignores signals from inside without a handler
        _die_with_parent()
        done = _build_root(spec)
        worker = os.fork()
    except BaseException as error:
        _setup_failed(error)
    if worker:
        _wait_exit(worker)
    _die_with_parent()
    _drop_privileges(spec["nobody"])
    os.chdir("/work")
    return done
'''


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

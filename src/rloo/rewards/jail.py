"""The child's own setup of its namespaces and root, as Python source the sandboxed child runs first.

`SETUP_SOURCE` defines `enter_sandbox(spec)`, which runs in a fresh interpreter before any
untrusted code (nothing of the trainer may run between fork and exec). With namespaces it
forks twice: the launcher stays outside the new pid namespace and reports its init's status;
the init (pid 1, trusted, keeps its capabilities in the user namespace) builds the new root and
waits; the worker drops to uid 65534 without capabilities and returns to run the program.
`isolation.namespace_spec` builds the `spec`; `isolation.py` documents the layers.
"""

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


def _unshare_mapped(nobody):
    """Enter new user, mount, pid, network, IPC and UTS namespaces, with ids mapped.

    A user may map only its own ids: `nobody` inside is the user outside. Root maps 0 (the trusted
    launcher and init) to itself and `nobody` to the host's nobody, which the program becomes."""
    host_uid, host_gid = os.geteuid(), os.getegid()
    flags = _NEWUSER | _NEWNS | _NEWPID | _NEWNET | _NEWIPC | _NEWUTS
    if host_uid != 0:
        _check(_libc.unshare(flags), "unshare")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{nobody} {host_uid} 1\n")
        _write("/proc/self/gid_map", f"{nobody} {host_gid} 1\n")
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
    for source, target in spec["binds"]:
        _bind_readonly(source, root + target)
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


def _relocated(path, pairs):
    for host, shown in pairs:
        if path == host or path.startswith(host + "/"):
            return shown + path[len(host):]
    return path


def _relocate_python(pairs):
    """Point this interpreter at where the new root shows its directories (see isolation.JAIL_OWNED):
    sys.path, the prefixes, the executable, and the search paths of the packages already imported."""
    if not pairs:
        return
    import importlib
    sys.path[:] = [_relocated(path, pairs) for path in sys.path]
    for name in ("prefix", "exec_prefix", "base_prefix", "base_exec_prefix", "executable", "_base_executable"):
        if isinstance(getattr(sys, name, None), str):
            setattr(sys, name, _relocated(getattr(sys, name), pairs))
    for module in list(sys.modules.values()):
        search = getattr(module, "__path__", None)
        if isinstance(search, list):  # the same list as __spec__.submodule_search_locations
            search[:] = [_relocated(path, pairs) for path in search]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()


def _drop_privileges(nobody):
    """Become nobody (when root; anyone else keeps its uid) with no capabilities, for good (no_new_privs: no
    setuid binary gives any back)."""
    if os.geteuid() == 0:
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


def _drop_privileges_on_the_host(spec):
    """Without namespaces: the same drop, on the host. A root trainer's Python may sit where nobody cannot
    search (under /root, mode 0700): its directories are opened first and imported from through
    /proc/self/fd/N (a magic link skips the search checks above the directory; files below keep theirs)."""
    if os.geteuid() != 0:
        _drop_privileges(spec["nobody"])
        return []
    pairs = []
    for path in spec["python_dirs"]:  # inherited (not close-on-exec) by the program's own children too
        pairs.append((path, f"/proc/self/fd/{os.open(path, os.O_PATH | os.O_DIRECTORY)}"))
    _relocate_python(pairs)
    _drop_privileges(spec["nobody"])
    _check(_libc.prctl(4, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")  # its own /proc/self/fd stays its own to read
    return pairs


def _own_children():
    me, found = str(os.getpid()), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[1] == me:
                    found.append(int(pid))
        except (OSError, IndexError):
            pass
    return found


def _supervise_on_the_host():
    """Without namespaces: this process stays the run's trusted supervisor (it never runs the program, and
    keeps the trainer's uid) and a subreaper, so that every process the program leaves behind becomes its
    child: when the program ends, or at SIGTERM (the timeout), it kills and reaps them all, then exits with
    the program's status. Nothing is left as a zombie for a container's pid 1 that does not reap, which
    would count against the next run's RLIMIT_NPROC. Returns in the program's process only."""
    _check(_libc.prctl(36, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")
    worker = os.fork()
    if worker == 0:
        _die_with_parent()
        return
    def stop(*_):
        try:
            os.kill(worker, signal.SIGKILL)
        except OSError:
            pass  # already ended

    signal.signal(signal.SIGTERM, stop)
    status, running = 3, True
    while True:
        try:
            ended, code = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(status)
        if ended == worker:
            running = False
            status = os.waitstatus_to_exitcode(code) & 0xFF if os.WIFEXITED(code) else 128 + os.WTERMSIG(code)
        if not running:  # the program has ended: whatever it left (orphaned to here) follows it
            for pid in _own_children():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


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
    """Join the run's cgroup, enter the namespaces (where spec["namespaces"]) and drop privileges; returns, in
    the program's process, what worked ("relocated": the interpreter's directories moved to other paths)."""
    if spec.get("cgroup"):
        _write(os.path.join(spec["cgroup"], "cgroup.procs"), "0")
    if not spec.get("namespaces"):
        _supervise_on_the_host()
        return {"relocated": _drop_privileges_on_the_host(spec)}
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
        _relocate_python(spec["relocated"])
        worker = os.fork()
    except BaseException as error:
        _setup_failed(error)
    if worker:
        _wait_exit(worker)
    _die_with_parent()
    _drop_privileges(spec["nobody"])
    os.chdir("/work")
    return {**done, "relocated": spec["relocated"]}
'''

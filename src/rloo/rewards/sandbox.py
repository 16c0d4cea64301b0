"""Running model-written Python against tests, with the verdicts decided outside the child.

`run_tests(code, tests)` starts one child process per call. The child runs `code`, then the
parts of each test that need it (see `verdicts.py`: for `assert add(2, 3) == 5` only `add(2, 3)`
goes to the child, never the `5`), and writes their values as data; the trainer parses them as
plain literals and decides every assertion itself. reward = passed / total, at most 1.0.

The child is isolated by the operating system where it allows (see `isolation.py`): user,
network, IPC, UTS, pid and mount namespaces entered by the child itself, running the program as
uid 65534 without capabilities in a root of its own (a size-limited tmpfs for its directories,
read-only system and Python directories, nothing else of the host); a pids cgroup per run; and
Landlock (reads only from system and Python directories, writes only in its own, no TCP, no
signals out). It starts with a minimal environment (not the trainer's), in its own session and
process group, with rlimits on address space, CPU time, file size, open files and process count,
and dies with the thread that started it (PR_SET_PDEATHSIG). At the timeout and at the end of
every run the pid namespace, the process group and the cgroup are killed. It fails closed: where
the namespaces layer cannot be set up, `run_tests` refuses (`SandboxUnavailable`, naming the reason
and the fix) unless "namespaces" is accepted by name (`allow_missing`, RLOO_SANDBOX_ALLOW_MISSING,
RLOOConfig.sandbox_allow_missing); where neither namespaces nor Landlock work, unless
`allow_unisolated=True` or RLOO_SANDBOX_ALLOW_UNISOLATED=1.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from rloo.rewards import isolation
from rloo.rewards.isolation import SandboxUnavailable
from rloo.rewards.pids_cgroup import PidsCgroup, pids_cgroup_parent
from rloo.rewards.verdicts import judge, plan_test

__all__ = ["SandboxResult", "SandboxUnavailable", "run_tests"]
logger = logging.getLogger(__name__)
_MAX_VALUE_CHARS = 1_000_000  # a value's repr longer than this fails rather than flooding the trainer

# The child's trusted prologue: limits and Landlock are in place before any untrusted code runs.
_BOOTSTRAP = isolation.SETUP_SOURCE + isolation.LANDLOCK_SOURCE + r'''
import resource


def main():
    payload = json.loads(sys.stdin.read())
    channel = os.dup(1)
    try:
        moved = enter_sandbox(payload["sandbox"])["relocated"]
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-long write fails instead of killing
        for name, value in payload["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (value, value))
        if payload["landlock_abi"]:
            read_roots = [_relocated(root, moved) for root in payload["read_roots"]]  # where this process sees them
            apply_landlock(payload["landlock_abi"], read_roots, payload["write_roots"])
    except BaseException as error:
        sys.stderr.write(f"SANDBOX_SETUP_FAILED {type(error).__name__}: {error}\n")
        os._exit(3)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)

    def send(**record):
        os.write(channel, (json.dumps(record) + "\n").encode())

    namespace = {"__name__": "__main__"}
    try:
        exec(compile(payload["code"], "<completion>", "exec"), namespace)
    except BaseException as error:
        send(k="code_error", e=type(error).__name__)
        os._exit(0)
    send(k="code")
    for test, steps in enumerate(payload["tests"]):
        for kind, step, source in steps:
            try:
                if kind == "exec":
                    exec(compile(source, f"<test {test}>", "exec"), namespace)
                    send(k="done", t=test, s=step)
                else:
                    text = repr(eval(compile(source, f"<test {test}>", "eval"), namespace))
                    if len(text) > payload["max_value_chars"]:
                        raise ValueError("value too long")
                    send(k="val", t=test, s=step, r=text)
            except BaseException as error:
                send(k="err", t=test, s=step, e=type(error).__name__)
                if kind == "exec":
                    break
    os._exit(0)


main()
'''


@dataclass
class SandboxResult:
    passed: int  # tests whose assertions held, as judged by the trainer
    total: int
    timed_out: bool
    output: str  # the child's records and setup errors, for debugging (its own prints are discarded)

    @property
    def fraction(self) -> float:
        return min(1.0, self.passed / self.total) if self.total else 0.0


def _read_records(text: str, n_tests: int) -> tuple[bool, list[dict], list[set], set[int]]:
    """The child's records: did the code run, values and completed steps per test, tests answered twice."""
    ran, values, completed = False, [{} for _ in range(n_tests)], [set() for _ in range(n_tests)]
    seen, forged = set(), set()
    for line in text.splitlines():
        try:
            record = json.loads(line)
            kind, test, step = record.get("k"), record.get("t"), record.get("s")
        except (ValueError, AttributeError):
            continue
        ran = ran or kind == "code"
        if kind not in ("val", "done", "err") or type(test) is not int or not 0 <= test < n_tests:
            continue
        if (test, step) in seen:
            forged.add(test)  # one answer per step: a second one means the code wrote its own
        seen.add((test, step))
        if kind == "done":
            completed[test].add(step)
        elif kind == "val":
            with contextlib.suppress(Exception):  # not plain data (an object whose == is always true): no value
                values[test][step] = ast.literal_eval(str(record.get("r")))
    return ran, values, completed, forged


def _child_env(home: str, tmp: str) -> dict[str, str]:
    """A minimal environment: nothing of the trainer's (tokens, paths, credentials) reaches the child."""
    return {"HOME": home, "TMPDIR": tmp, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def _child_places(layers: dict[str, bool], private: str, disk_mb: int, max_files: int):
    """The child's setup spec, its $HOME and $TMPDIR, and where Landlock lets it read and write."""
    if layers["namespaces"]:  # the child's directories live on a tmpfs in its own root, not on the host
        root = os.path.join(private, "root")
        os.mkdir(root)
        return isolation.namespace_spec(root, disk_mb, max_files), "/work", "/tmp", *isolation.sandbox_paths()
    home = os.path.join(private, "work")
    os.mkdir(home)
    if os.geteuid() == 0:  # the program runs as nobody: its directory is its own, the way to it open to search only
        os.chown(home, isolation.NOBODY, isolation.NOBODY)
        os.chmod(private, 0o711)
    spec = {"namespaces": False, "nobody": isolation.NOBODY, "python_dirs": isolation.outermost(isolation.python_dirs())}
    return spec, home, home, isolation.host_readable_roots(home), [home]


def _send_and_wait(process: subprocess.Popen, payload: str, timeout_s: float) -> bool:
    """Give the child its payload and wait for it to exit; False at the timeout.

    Waits on a pidfd where the kernel has them: Popen.wait(timeout) polls with sleeps of up to 50 ms,
    a delay every completion would pay."""
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(BrokenPipeError):  # a child that died at start: its status says why
        process.stdin.write(payload)
        process.stdin.close()
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        exited = bool(select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))[0])
    finally:
        os.close(pidfd)
    if exited:
        process.wait()
    return exited


def _end_run(process: subprocess.Popen) -> None:
    """Ask the launcher to end the run: with namespaces it kills the pid namespace's init and exits once the kernel
    has reaped every process in it; without, it kills the program and reaps whatever the program left."""
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)  # a bound for a launcher that died before its handler was set: killpg follows


def run_tests(code: str, tests: list[str], timeout_s: float = 5.0, memory_mb: int = 512, *,
              file_size_mb: int = 16, disk_mb: int = 64, max_files: int = 4096, max_processes: int = 16,
              allow_unisolated: bool = False, allow_missing: Sequence[str] = ()) -> SandboxResult:
    """Run `code`, then the tests, in an isolated child; the trainer judges each test from the values it sends.

    Args:
        code: the program (e.g. a function definition) to test.
        tests: Python snippets, typically `assert f(2) == 4`; see `verdicts.py` for how they are judged.
        timeout_s: wall-clock limit for the whole run; everything the child started is killed when it is reached.
        memory_mb: address-space limit of each of the child's processes.
        file_size_mb: largest file the child may write (also caps what it can send back).
        disk_mb, max_files: size and file count of the tmpfs holding the child's directories (with namespaces;
            without them only `file_size_mb` applies).
        max_processes: processes and threads the child may have at once: the pids cgroup's limit where there is
            one, and RLIMIT_NPROC (which binds inside the user namespace, even when the trainer is root).
        allow_unisolated: run even where neither namespaces nor Landlock work (see `isolation.py`).
        allow_missing: layers ("namespaces", ...) accepted missing; unless "namespaces" is accepted (here, by
            RLOO_SANDBOX_ALLOW_MISSING or RLOOConfig.sandbox_allow_missing), no namespaces: SandboxUnavailable.
    """
    layers = isolation.check_isolation(allow_unisolated, allow_missing)
    plans = [plan_test(test) for test in tests]
    rlimits = {"RLIMIT_AS": memory_mb * 2**20, "RLIMIT_CPU": max(1, int(timeout_s) + 1), "RLIMIT_CORE": 0,
               "RLIMIT_FSIZE": file_size_mb * 2**20, "RLIMIT_NOFILE": 256, "RLIMIT_NPROC": max_processes}
    with tempfile.TemporaryDirectory(prefix="rloo-sandbox-") as private:
        sandbox, home, tmp, read_roots, write_roots = _child_places(layers, private, disk_mb, max_files)
        cgroup = None
        if layers["pids_cgroup"]:  # a launcher (and with namespaces an init) come before the program's processes
            cgroup = PidsCgroup(pids_cgroup_parent()[0], max_processes + (2 if layers["namespaces"] else 1))
            sandbox["cgroup"] = cgroup.path
        payload = json.dumps({
            "code": code, "tests": [plan.steps for plan in plans], "rlimits": rlimits, "sandbox": sandbox,
            "landlock_abi": isolation.landlock_abi() if layers["landlock"] else 0,
            "read_roots": read_roots, "write_roots": write_roots, "max_value_chars": _MAX_VALUE_CHARS})
        channel_path, errors_path = os.path.join(private, "channel"), os.path.join(private, "stderr")
        try:
            with open(channel_path, "wb") as channel, open(errors_path, "wb") as errors:
                process = subprocess.Popen(
                    [sys.executable, "-I", "-c", _BOOTSTRAP], cwd=private if layers["namespaces"] else home,
                    env=_child_env(home, tmp), stdin=subprocess.PIPE, stdout=channel, stderr=errors, text=True,
                    start_new_session=True, preexec_fn=isolation.die_with_parent)
                try:
                    timed_out = not _send_and_wait(process, payload, timeout_s)
                finally:
                    if process.poll() is None:
                        _end_run(process)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, signal.SIGKILL)  # on timeout and on exit: nothing stays behind
                    process.wait()
        finally:
            if cgroup is not None:
                cgroup.close()  # kills whatever left the process group (a setsid grandchild) and removes it
        with open(channel_path, "rb") as channel:
            text = channel.read(file_size_mb * 2**20).decode("utf-8", "replace")
        with open(errors_path, "rb") as errors:
            setup_errors = errors.read(65536).decode("utf-8", "replace")
    if "SANDBOX_SETUP_FAILED" in setup_errors:
        logger.warning("the code sandbox could not set up its child: %s", setup_errors.strip())
    ran, values, completed, forged = _read_records(text, len(plans))
    passed = sum(ran and i not in forged and judge(plan, values[i], completed[i]) for i, plan in enumerate(plans))
    return SandboxResult(passed=passed, total=len(tests), timed_out=timed_out, output=setup_errors + text)

"""A best-effort sandbox for running model-written Python against tests. NOT a security boundary.

`run_tests(code, tests)` runs `code` and then each test (e.g. an `assert` statement) in a fresh
Python process and returns how many tests passed. What is enforced, and how:

* wall-clock time: the parent kills the child's whole process group after `timeout_s`;
  tests that finished before count, the rest fail;
* memory: `RLIMIT_AS` (address space) is set in the child before user code runs, so a large
  allocation raises MemoryError; CPU time is capped too (`RLIMIT_CPU`) as a backstop;
* network: an audit hook in the child refuses socket creation, connect, bind and DNS lookups;
* file system: the child runs in a throwaway temporary directory (its cwd, also $HOME and
  $TMPDIR), and the audit hook refuses opening files for writing, and removing, renaming or
  creating files and directories, outside it;
* processes: the audit hook refuses fork, exec, subprocess and os.system, so the limits above
  cannot be escaped by starting another program.

Limits, honestly: audit hooks watch Python-level operations only. Code that reaches native code
(ctypes, a C extension that opens sockets or files itself) gets past them. Reading files is
allowed. Run untrusted code from strangers in a container or VM with no network; this sandbox
is meant to keep a policy's accidental infinite loops, huge allocations and stray writes from
disturbing training.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# The child's first code: limits and the audit hook are in place before any user code runs.
_BOOTSTRAP = r'''
import json, os, resource, sys


def main():
    payload = json.loads(sys.stdin.read())
    # Results go to a private copy of stdout, tagged with a nonce; the program's own output is
    # discarded, so printing "PASS" does not pass a test.
    nonce, report_fd = payload["nonce"], os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)

    def report(line):
        os.write(report_fd, f"{nonce} {line}\n".encode())

    limit = payload["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CPU, (payload["cpu_seconds"], payload["cpu_seconds"]))
    sys.addaudithook(make_audit_hook(os.path.realpath(os.getcwd())))

    namespace = {"__name__": "__main__"}
    try:
        exec(compile(payload["code"], "<completion>", "exec"), namespace)
    except BaseException as error:
        report(f"CODE_FAILED {type(error).__name__}")
        os._exit(0)
    for index, test in enumerate(payload["tests"]):
        try:
            exec(compile(test, f"<test {index}>", "exec"), namespace)
        except BaseException as error:
            report(f"FAIL {index} {type(error).__name__}")
        else:
            report(f"PASS {index}")
    os._exit(0)


BLOCKED = {"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
           "socket.sendto", "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
           "subprocess.Popen", "pty.spawn"}
PATH_EVENTS = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown", "os.symlink",
               "os.link", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def make_audit_hook(root):
    def inside(path):
        if isinstance(path, int):  # an already open file descriptor
            return True
        full = os.path.realpath(os.path.join(root, os.fsdecode(path)))
        return full == root or full.startswith(root + os.sep)

    def audit(event, args):
        if event in BLOCKED:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args
            writing = any(c in str(mode) for c in "wax+") if mode is not None else bool(flags & WRITE_FLAGS)
            if writing and path is not None and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} outside the working directory is not allowed")
        elif event in PATH_EVENTS:
            for path in args[:2]:
                if isinstance(path, (str, bytes, os.PathLike)) and not inside(path):
                    raise PermissionError(f"sandbox: {event} on {path!r} outside the working directory")

    return audit


main()
'''


@dataclass
class SandboxResult:
    passed: int  # tests that ran to the end without an exception
    total: int
    timed_out: bool
    output: str  # the child's report lines (its own output is discarded)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def run_tests(code: str, tests: list[str], timeout_s: float = 5.0, memory_mb: int = 512) -> SandboxResult:
    """Run `code`, then each test in the same namespace, in a separate, limited Python process.

    Args:
        code: the program (e.g. a function definition) to test.
        tests: Python snippets, typically `assert f(2) == 4`; each passes if it raises nothing.
        timeout_s: wall-clock limit for the whole run; the child is killed when it is reached.
        memory_mb: address-space limit of the child.
    """
    nonce = secrets.token_hex(16)
    payload = json.dumps({"code": code, "tests": list(tests), "nonce": nonce, "memory_bytes": memory_mb * 2**20,
                          "cpu_seconds": max(1, int(timeout_s) + 1)})
    with tempfile.TemporaryDirectory(prefix="rloo-sandbox-") as workdir:
        env = {"HOME": workdir, "TMPDIR": workdir, "PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1",
               "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        process = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOTSTRAP],  # -I: ignore PYTHON* variables and the user site
            cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,  # its own process group, killed as a whole
        )
        timed_out = False
        try:
            output, _ = process.communicate(payload, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
                os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
    passed = len({line.split()[2] for line in output.splitlines() if line.startswith(f"{nonce} PASS ")})
    return SandboxResult(passed=passed, total=len(tests), timed_out=timed_out, output=output)

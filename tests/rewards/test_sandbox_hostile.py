"""Hostile programs against the code sandbox, judged by what the trainer's side observes.

Each test has the parent (this process) set up something the program must not reach (a listening
socket, a secret, a process, its disk) and then checks that socket, that output, the host's
process table or the sandbox's files from outside; what the program says about itself is not
trusted. Every hostile loop is bounded. docs/rewards.md's table is built from these tests.
"""

import os
import socket
import subprocess
import threading
import time
import uuid

import pytest
from sandbox_helpers import processes_with

from rloo.rewards.isolation import isolation_layers
from rloo.rewards.sandbox import run_tests

LAYERS = isolation_layers()
needs_isolation = pytest.mark.skipif(not (LAYERS["namespaces"] or LAYERS["landlock"]), reason="no namespaces, no Landlock")
needs_namespaces = pytest.mark.skipif(not LAYERS["namespaces"], reason="the namespaces layer does not work here")
NOBODY = 65534  # the uid the sandbox maps the program to (rloo.rewards.isolation.NOBODY)
HONEST = "def f(x):\n    return x * x\n"
TESTS = ["assert f(3) == 9", "assert f(4) == 16"]


def hostile(probe: str) -> str:
    """`probe` run at import time with every error swallowed, then the honest function."""
    return "try:\n" + "".join(f"    {line}\n" for line in probe.splitlines()) + "except BaseException:\n    pass\n" + HONEST


def _sleep_token() -> str:
    """A `sleep` length no other process uses (a float of seconds), to find the program's processes by argv."""
    return f"{300 + uuid.uuid4().int % 10**6 / 10**4:.4f}"


class Background:
    """run_tests in a thread, so the parent can watch the host while the program runs."""

    def __init__(self, code, tests=("assert True",), **kwargs):
        self.result = None
        self.thread = threading.Thread(target=self._run, args=(code, list(tests)), kwargs=kwargs)
        self.thread.start()

    def _run(self, code, tests, **kwargs):
        self.result = run_tests(code, tests, **kwargs)

    def running(self) -> bool:
        return self.thread.is_alive()

    def join(self):
        self.thread.join()
        return self.result


@pytest.fixture
def abstract_name():
    return f"\0rloo-test-{uuid.uuid4().hex}"


@needs_isolation
@pytest.mark.parametrize("address", ["pathname", "abstract"])
@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_DGRAM], ids=["stream", "datagram"])
def test_no_unix_socket_of_the_host_is_reached(tmp_path, abstract_name, address, kind):
    where = str(tmp_path / "trainer.sock") if address == "pathname" else abstract_name
    with socket.socket(socket.AF_UNIX, kind) as server:
        server.bind(where)
        if kind == socket.SOCK_STREAM:
            server.listen(8)
        server.setblocking(False)
        probe = (f"import socket\ns = socket.socket(socket.AF_UNIX, {int(kind)})\n"
                 + (f"s.connect({where!r})\ns.sendall(b'LEAK')" if kind == socket.SOCK_STREAM
                    else f"s.sendto(b'LEAK', {where!r})"))
        result = run_tests(hostile(probe), TESTS, timeout_s=20)
        with pytest.raises(BlockingIOError):  # nothing connected, nothing arrived
            server.accept() if kind == socket.SOCK_STREAM else server.recv(16)
    assert result.passed == 2, result.output  # the probe failed quietly; the honest part ran


@needs_isolation
@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_DGRAM], ids=["tcp", "udp"])
def test_no_loopback_port_of_the_host_is_reached(kind):
    with socket.socket(socket.AF_INET, kind) as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        if kind == socket.SOCK_STREAM:
            server.listen(8)
        server.setblocking(False)
        probe = (f"import socket\ns = socket.socket(socket.AF_INET, {int(kind)})\n"
                 + (f"s.connect(('127.0.0.1', {port}))\ns.sendall(b'LEAK')" if kind == socket.SOCK_STREAM
                    else f"s.sendto(b'LEAK', ('127.0.0.1', {port}))"))
        result = run_tests(hostile(probe), TESTS, timeout_s=20)
        with pytest.raises(BlockingIOError):
            server.accept() if kind == socket.SOCK_STREAM else server.recv(16)
    assert result.passed == 2, result.output


@needs_isolation
def test_no_secret_reaches_the_output(tmp_path, monkeypatch):
    """A file of the trainer's, its environment, another process's environment, /etc/shadow: none comes back."""
    file_secret, env_secret, victim_secret = (f"secret-{uuid.uuid4().hex}" for _ in range(3))
    (tmp_path / "token.env").write_text(file_secret)
    monkeypatch.setenv("RLOO_TEST_SECRET", env_secret)
    with open("/etc/shadow", "rb") as shadow:  # values come back as repr(): compare line by line
        shadow_lines = [line for line in shadow.read().decode("utf-8", "replace").splitlines() if len(line) > 8]
    victim = subprocess.Popen(["sleep", "600"], env={"RLOO_VICTIM_SECRET": victim_secret})
    paths = [str(tmp_path / "token.env"), "/etc/shadow", f"/proc/{victim.pid}/environ", f"/proc/{os.getpid()}/environ",
             "/proc/1/environ", os.path.expanduser("~/.ssh/id_rsa")]
    code = ("import os\ndef leak():\n    found = [repr(dict(os.environ))]\n"
            f"    for path in {paths!r} + [f'/proc/{{p}}/environ' for p in os.listdir('/proc') if p.isdigit()]:\n"
            "        try:\n            found.append(open(path, 'rb').read().decode('utf-8', 'replace'))\n"
            "        except OSError as error:\n            found.append(f'{path}: {error.strerror}')\n"
            "    return '\\n'.join(found)\n")
    try:
        result = run_tests(code, ["assert leak() == ''"], timeout_s=20)
    finally:
        victim.kill()
        victim.wait()
    assert '"k": "val"' in result.output, result.output  # leak() ran and its value came back to the parent
    for secret in (file_secret, env_secret, victim_secret):
        assert secret not in result.output
    assert not any(line in result.output for line in shadow_lines)


@needs_isolation
def test_no_other_process_can_be_signalled():
    victim = subprocess.Popen(["sleep", "600"])
    try:
        code = hostile(f"import os, signal\nfor pid in (os.getppid(), {victim.pid}, {os.getpid()}, 1):\n"
                       f"    try:\n        os.kill(pid, signal.SIGKILL if pid != {os.getpid()} else 0)\n"
                       "    except OSError:\n        pass")
        assert run_tests(code, TESTS, timeout_s=20).passed == 2
        assert victim.poll() is None  # the parent sees its victim still running
    finally:
        victim.kill()
        victim.wait()


def _watch(token: str, run: Background, look, readings: int | None = None):
    """While `run` goes on, call look(pids with `token`) every 20 ms; returns its results (a bounded loop).

    With `readings`, stops once that many results are not None (the program sleeps, done with its work)."""
    seen = []
    for _ in range(3000):
        if not run.running() or (readings and sum(found is not None for found in seen) >= readings):
            break
        seen.append(look(processes_with(token)))
        time.sleep(0.02)
    return seen


@needs_namespaces
def test_the_program_runs_as_an_unprivileged_user_of_the_host():
    token = _sleep_token()
    run = Background(f"import os\nos.execv('/bin/sleep', ['sleep', '{token}'])", timeout_s=8)

    def identity(pids):
        for pid in pids:
            try:
                status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
                return status["Uid"].split(), status["Gid"].split(), int(status["CapEff"], 16)
            except (OSError, KeyError):
                pass
        return None

    seen = [found for found in _watch(token, run, identity, readings=2) if found]
    for pid in processes_with(token):  # seen: end the run now rather than at its timeout
        os.kill(pid, 9)
    run.join()
    assert seen, "the program's process was never seen"
    uid = str(NOBODY if os.geteuid() == 0 else os.geteuid())
    gid = str(NOBODY if os.geteuid() == 0 else os.getegid())
    assert seen[-1] == ([uid] * 4, [gid] * 4, 0)  # real, effective, saved, fs ids; no capabilities


@needs_isolation
def test_a_fork_bomb_is_bounded_and_nothing_survives():
    token = _sleep_token()
    code = ("import os, time\ndef bomb():\n    n = 0\n    for _ in range(200):\n        try:\n"
            "            pid = os.fork()\n        except OSError:\n            break\n"
            f"        if pid == 0:\n            os.execv('/bin/sleep', ['sleep', '{token}'])\n"
            "        n += 1\n    time.sleep(3)\n    return n\n")
    run = Background(code, ["assert bomb() == -1"], timeout_s=15, max_processes=8)
    counts = _watch(token, run, len)
    result = run.join()
    left = processes_with(token)
    for pid in left:  # clean up before failing
        os.kill(pid, 9)
    assert counts and max(counts) >= 1, result.output  # the bomb went off
    assert max(counts) <= 8, f"{max(counts)} processes of the program existed at once"
    assert not left


@needs_isolation
def test_the_total_disk_a_program_fills_is_bounded():
    token = _sleep_token()
    code = ("import os, tempfile\ndef fill():\n    n = 0\n"
            "    for folder in sorted({os.getcwd(), tempfile.gettempdir()}):\n        for i in range(120):\n"
            "            try:\n                with open(os.path.join(folder, f'fill{i}'), 'wb') as out:\n"
            "                    out.write(b'x' * 2**20)\n                n += 1\n"
            "            except OSError:\n                break\n"
            f"    os.execv('/bin/sleep', ['sleep', '{token}'])\n")
    run = Background(code, ["fill()"], timeout_s=20, disk_mb=32)

    def disk_use(pids):
        """Bytes in the program's directories, read by the parent through /proc/<pid>/{cwd,root}."""
        for pid in pids:
            total = 0
            for folder in {f"/proc/{pid}/cwd", f"/proc/{pid}/root/tmp" if LAYERS["namespaces"] else f"/proc/{pid}/cwd"}:
                for base, _, files in os.walk(folder):
                    total += sum(os.path.getsize(os.path.join(base, name)) for name in files if name.startswith("fill"))
            return total
        return None

    seen = [used for used in _watch(token, run, disk_use, readings=3) if used is not None]  # it sleeps once done
    for pid in processes_with(token):
        os.kill(pid, 9)
    run.join()
    assert seen, "the program's process was never seen"
    assert 8 * 2**20 <= max(seen) <= 32 * 2**20, f"{max(seen) / 2**20:.0f} MiB written"


@needs_isolation
def test_a_program_that_ignores_sigterm_and_its_escaped_child_are_killed_at_the_timeout():
    token = _sleep_token()
    code = (f"import os, signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nif os.fork() == 0:\n    os.setsid()\n"
            f"    os.execv('/bin/sleep', ['sleep', '{token}'])\nos.execv('/bin/sleep', ['sleep', '{token}'])\n")
    run = Background(code, timeout_s=3)
    seen = _watch(token, run, len)
    result = run.join()
    left = processes_with(token)
    for pid in left:
        os.kill(pid, 9)
    assert result.timed_out and max(seen, default=0) == 2  # both started, both outlived the timeout...
    assert not left  # ...and none is left once run_tests returns


@needs_namespaces
def test_the_number_of_files_a_program_creates_is_bounded():
    token = _sleep_token()
    code = ("import os\ndef spawn_files():\n    for i in range(5000):\n        try:\n"
            "            open(f'empty{i}', 'w').close()\n        except OSError:\n            break\n"
            f"    os.execv('/bin/sleep', ['sleep', '{token}'])\n")
    run = Background(code, ["spawn_files()"], timeout_s=20, max_files=300)

    def count(pids):
        for pid in pids:
            return sum(name.startswith("empty") for name in os.listdir(f"/proc/{pid}/cwd"))
        return None

    seen = [found for found in _watch(token, run, count, readings=3) if found is not None]
    for pid in processes_with(token):
        os.kill(pid, 9)
    run.join()
    assert seen and 100 <= max(seen) <= 300, seen  # the tmpfs's inode limit, not the program's loop, stopped it

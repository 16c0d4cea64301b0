"""Hostile programs against the code sandbox, judged by what the trainer's side observes.

Each test has the parent (this process) set up something the program must not reach (a listening
socket, a secret, a process, its disk) and then checks that socket, that output, the host's
process table or the sandbox's files from outside; what the program says about itself is not
trusted. Every hostile loop is bounded.

Every test runs under every combination of layers this machine allows (the `layers` fixture switches the
others off with RLOO_SANDBOX_DISABLE; the combinations short of all layers are marked slow) and asserts that
combination's documented outcome: blocked where one of the test's STOPPED_BY entries is on, and the gap
itself (the packet arrives, the secret comes back, the disk fills) where none is, so a layer that silently
stops working fails a test instead of leaving it unasserted. docs/rewards.md's table is built from these runs.
"""

import itertools
import os
import socket
import subprocess
import tempfile
import threading
import time
import uuid

import pytest
from sandbox_helpers import processes_with

from rloo.rewards import isolation
from rloo.rewards.isolation import LAYER_NAMES, isolation_layers, landlock_abi
from rloo.rewards.sandbox import run_tests

NOBODY = 65534  # the uid the sandbox gives the program when the trainer is root (rloo.rewards.isolation.NOBODY)
ROOT = os.geteuid() == 0
ABI = landlock_abi()
HONEST = "def f(x):\n    return x * x\n"
TESTS = ["assert f(3) == 9", "assert f(4) == 16"]

# What stops each hostile program: any one of these being on blocks it. A layer name; "landlock>=N": Landlock
# at ABI N or later; "uid drop": a root trainer's program runs as nobody (65534), in every combination;
# "subreaper": without namespaces the child's launcher stays outside the program as a subreaper and kills what
# it leaves; "always": what every combination has (a minimal environment, rlimits, a killed process group).
STOPPED_BY = {
    "unix socket by path": ("namespaces",),  # Landlock (ABI <= 7) does not restrict connecting to one
    "abstract unix socket": ("namespaces", "landlock>=6"),
    "loopback TCP port": ("namespaces", "landlock>=4"),
    "loopback UDP port": ("namespaces",),  # Landlock restricts TCP only
    "the trainer's environment": ("always",),
    "a file of the trainer's (world-readable)": ("namespaces", "landlock"),
    # Landlock denies ptrace access (/proc/<pid>/environ) out of its domain to a program that is not root (a
    # root one with CAP_SYS_PTRACE read it when the uid drop was removed on purpose); the program never is root
    "another process's environment": ("namespaces", "landlock", "uid drop"),
    "/etc/shadow": ("namespaces", "landlock", "uid drop"),
    "signalling another process": ("namespaces", "landlock>=6", "uid drop"),
    "running as root or with capabilities": ("always",),
    "a fork bomb": ("always",),  # the pids cgroup, and RLIMIT_NPROC in every combination
    "total disk": ("namespaces",),  # a size-limited tmpfs; otherwise RLIMIT_FSIZE bounds each file only
    "number of files": ("namespaces",),
    "a setsid child outliving the run": ("namespaces", "pids_cgroup", "subreaper"),
}


def stops(layers: dict[str, bool], what: str) -> bool:
    """Whether the combination `layers` has one of what STOPPED_BY says stops `what`."""
    def on(name):
        if name.startswith("landlock>="):
            return layers["landlock"] and ABI >= int(name.split(">=")[1])
        return {"always": True, "subreaper": True, "uid drop": ROOT}.get(name, layers.get(name, False))
    return any(on(name) for name in STOPPED_BY[what])


def _available() -> dict[str, bool]:
    saved = os.environ.pop(isolation.DISABLE_ENV, None)
    try:
        return isolation_layers()
    finally:
        if saved is not None:
            os.environ[isolation.DISABLE_ENV] = saved


AVAILABLE = _available()


def _combinations():
    """Each set of this machine's layers, as {layer: on}; all of them first, the rest marked slow."""
    have = [name for name in LAYER_NAMES if AVAILABLE[name]]
    for k in range(len(have), -1, -1):
        for kept in itertools.combinations(have, k):
            layers = {name: name in kept for name in LAYER_NAMES}
            marks = [] if k == len(have) else [pytest.mark.slow]
            yield pytest.param(layers, id="+".join(kept) or "none", marks=marks)


@pytest.fixture(params=list(_combinations()))
def layers(request, monkeypatch):
    """Run the test with only these layers on (RLOO_SANDBOX_DISABLE names the rest, which also accepts them
    missing); with neither namespaces nor Landlock, RLOO_SANDBOX_ALLOW_UNISOLATED=1 lets the code run."""
    wanted = request.param
    monkeypatch.setenv(isolation.DISABLE_ENV, ",".join(name for name in LAYER_NAMES if not wanted[name]))
    monkeypatch.setenv(isolation.ALLOW_UNISOLATED_ENV, "1" if not (wanted["namespaces"] or wanted["landlock"]) else "")
    monkeypatch.setattr(isolation, "_missing_logged", True)  # the warning is tested in test_sandbox.py
    assert isolation_layers() == wanted
    return wanted


def hostile(probe: str) -> str:
    """`probe` run at import time with every error swallowed, then the honest function."""
    return "try:\n" + "".join(f"    {line}\n" for line in probe.splitlines()) + "except BaseException:\n    pass\n" + HONEST


def _sleep_token() -> str:
    """A `sleep` length no other process uses (a float of seconds), to find the program's processes by argv."""
    return f"{300 + uuid.uuid4().int % 10**6 / 10**4:.4f}"


@pytest.fixture
def open_folder():
    """A folder anyone may search and write (so that only the sandbox, not file permissions, keeps the program out)."""
    folder = tempfile.mkdtemp(prefix="rloo-hostile-")
    os.chmod(folder, 0o777)
    yield folder
    subprocess.run(["rm", "-rf", folder], check=False)


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


def _arrived(server: socket.socket, kind: int) -> bool:
    """Whether anything connected to (stream) or reached (datagram) the non-blocking `server`."""
    try:
        if kind == socket.SOCK_STREAM:
            connection, _ = server.accept()
            connection.close()
        else:
            server.recv(16)
        return True
    except BlockingIOError:
        return False


@pytest.mark.parametrize("address", ["pathname", "abstract"])
@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_DGRAM], ids=["stream", "datagram"])
def test_no_unix_socket_of_the_host_is_reached(layers, open_folder, address, kind):
    what = "unix socket by path" if address == "pathname" else "abstract unix socket"
    where = os.path.join(open_folder, "trainer.sock") if address == "pathname" else f"\0rloo-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, kind) as server:
        server.bind(where)
        if address == "pathname":
            os.chmod(where, 0o777)
        if kind == socket.SOCK_STREAM:
            server.listen(8)
        server.setblocking(False)
        probe = (f"import socket\ns = socket.socket(socket.AF_UNIX, {int(kind)})\n"
                 + (f"s.connect({where!r})\ns.sendall(b'LEAK')" if kind == socket.SOCK_STREAM
                    else f"s.sendto(b'LEAK', {where!r})"))
        result = run_tests(hostile(probe), TESTS, timeout_s=20)
        assert _arrived(server, kind) != stops(layers, what), what
    assert result.passed == 2, result.output  # the probe failed quietly (or not); the honest part ran


@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_DGRAM], ids=["tcp", "udp"])
def test_no_loopback_port_of_the_host_is_reached(layers, kind):
    what = "loopback TCP port" if kind == socket.SOCK_STREAM else "loopback UDP port"
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
        assert _arrived(server, kind) != stops(layers, what), what
    assert result.passed == 2, result.output


def test_no_secret_reaches_the_output(layers, open_folder, monkeypatch):
    """A world-readable file of the trainer's, its environment, another process's environment, /etc/shadow."""
    file_secret, env_secret, victim_secret = (f"secret-{uuid.uuid4().hex}" for _ in range(3))
    secret_file = os.path.join(open_folder, "token.env")
    with open(secret_file, "w") as out:
        out.write(file_secret)
    os.chmod(secret_file, 0o644)
    monkeypatch.setenv("RLOO_TEST_SECRET", env_secret)
    with open("/etc/shadow", "rb") as shadow:  # values come back as repr(): compare line by line
        shadow_lines = [line for line in shadow.read().decode("utf-8", "replace").splitlines() if len(line) > 8]
    victim = subprocess.Popen(["sleep", "600"], env={"RLOO_VICTIM_SECRET": victim_secret})
    paths = [secret_file, "/etc/shadow", f"/proc/{victim.pid}/environ", f"/proc/{os.getpid()}/environ", "/proc/1/environ"]
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
    for what, secret in (("a file of the trainer's (world-readable)", file_secret),
                         ("the trainer's environment", env_secret), ("another process's environment", victim_secret)):
        assert (secret in result.output) != stops(layers, what), what
    assert any(line in result.output for line in shadow_lines) != stops(layers, "/etc/shadow")


def test_no_other_process_can_be_signalled(layers):
    victim = subprocess.Popen(["sleep", "600"])
    blocked = stops(layers, "signalling another process")
    targets = [victim.pid, 1] + ([os.getppid(), os.getpid()] if blocked else [])  # the trainer itself only when safe
    try:
        code = hostile(f"import os, signal\nfor pid in {targets}:\n"
                       f"    try:\n        os.kill(pid, signal.SIGKILL if pid != {os.getpid()} else 0)\n"
                       "    except OSError:\n        pass")
        assert run_tests(code, TESTS, timeout_s=20).passed == 2
        for _ in range(100):  # a bounded wait for the kill to land
            if victim.poll() is not None:
                break
            time.sleep(0.01)
        assert (victim.poll() is None) == blocked  # the parent sees its victim still running, or not
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


def test_the_program_runs_as_an_unprivileged_user_of_the_host(layers):
    token = _sleep_token()
    run = Background(f"import os\nos.execv('/bin/sleep', ['sleep', '{token}'])", timeout_s=8)

    def identity(pids):
        for pid in pids:
            try:
                status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
                return status["Uid"].split(), status["Gid"].split(), int(status["CapEff"], 16) | int(status["CapPrm"], 16)
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
    assert seen[-1] == ([uid] * 4, [gid] * 4, 0)  # real, effective, saved, fs ids; no effective or permitted capability


def test_a_fork_bomb_is_bounded_and_nothing_survives(layers):
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


def test_the_total_disk_a_program_fills_is_bounded(layers):
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
            for folder in {f"/proc/{pid}/cwd", f"/proc/{pid}/root/tmp" if layers["namespaces"] else f"/proc/{pid}/cwd"}:
                for base, _, files in os.walk(folder):
                    total += sum(os.path.getsize(os.path.join(base, name)) for name in files if name.startswith("fill"))
            return total
        return None

    seen = [used for used in _watch(token, run, disk_use, readings=3) if used is not None]  # it sleeps once done
    for pid in processes_with(token):
        os.kill(pid, 9)
    run.join()
    assert seen, "the program's process was never seen"
    if stops(layers, "total disk"):
        assert 8 * 2**20 <= max(seen) <= 32 * 2**20, f"{max(seen) / 2**20:.0f} MiB written"
    else:  # only RLIMIT_FSIZE (16 MiB a file) applies: all 120 files of 1 MiB are written
        assert max(seen) == 120 * 2**20, f"{max(seen) / 2**20:.0f} MiB written"


def test_a_program_that_ignores_sigterm_and_its_escaped_child_are_killed_at_the_timeout(layers):
    token = _sleep_token()
    code = (f"import os, signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nif os.fork() == 0:\n    os.setsid()\n"
            f"    os.execv('/bin/sleep', ['sleep', '{token}'])\nos.execv('/bin/sleep', ['sleep', '{token}'])\n")
    run = Background(code, timeout_s=3)
    seen = _watch(token, run, list)
    result = run.join()
    left = processes_with(token)
    for pid in left:
        os.kill(pid, 9)
    assert result.timed_out and max(map(len, seen), default=0) == 2  # both started, both outlived the timeout...
    assert len(left) == (0 if stops(layers, "a setsid child outliving the run") else 1)  # ...and none is left,
    zombies = [pid for pid in set().union(*seen) if os.path.exists(f"/proc/{pid}")]  # not even unreaped:
    assert not zombies or not stops(layers, "a setsid child outliving the run"), zombies  # they count against NPROC


def test_the_number_of_files_a_program_creates_is_bounded(layers):
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
    if stops(layers, "number of files"):
        assert seen and 100 <= max(seen) <= 300, seen  # the tmpfs's inode limit, not the program's loop, stopped it
    else:
        assert seen and max(seen) == 5000, seen

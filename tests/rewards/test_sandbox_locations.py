"""The hostile suite with the interpreter installed in the places Python lives: the namespaces layer must hold
wherever that is (a venv under /tmp once switched it off: its bind populated the program's /tmp).

Each case makes a venv there (`python -m venv --system-site-packages`, seconds), or binds this interpreter's
prefix read-only there, and runs tests/rewards/test_sandbox_hostile.py's default layer combination with that
interpreter, in a process of its own.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rloo.rewards.isolation import isolation_layers

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "tests/rewards/test_sandbox_hostile.py"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not isolation_layers()["namespaces"], reason="the namespaces layer does not work here")]


def _hostile_suite(python: str, wrap: list[str] | None = None) -> subprocess.CompletedProcess:
    """The hostile suite's full-layer cases, run by `python` (inside `wrap`'s command, when given)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("RLOO_SANDBOX_DISABLE", None)
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", HOSTILE]
    return subprocess.run([*(wrap or []), *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def _check(done: subprocess.CompletedProcess, where: str) -> None:
    output = done.stdout[-6000:] + done.stderr[-3000:]
    assert done.returncode == 0, f"the hostile suite failed with Python under {where}:\n{output}"
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]


def _writable(folder: str) -> bool:
    return os.path.isdir(folder) and os.access(folder, os.W_OK)


LOCATIONS = {  # where the venv goes: a parent folder and a name prefix
    "tmp": (tempfile.gettempdir() if tempfile.gettempdir() == "/tmp" else "/tmp", "rloo-venv-"),
    "dev_shm": ("/dev/shm", "rloo-venv-"),
    "home": (str(Path.home()), ".rloo-venv-"),
    "opt": ("/opt", "rloo-venv-"),
    "spaces": (str(Path.home()), ".rloo venv with spaces "),
}


@pytest.mark.parametrize("location", list(LOCATIONS))
def test_the_hostile_suite_holds_with_a_venv_in(location):
    parent, prefix = LOCATIONS[location]
    if not _writable(parent):
        pytest.skip(f"{parent} is not a writable folder here")
    folder = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        venv = os.path.join(folder, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], check=True,
                       timeout=120)
        _check(_hostile_suite(os.path.join(venv, "bin", "python")), venv)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="binding a prefix needs root and unshare")
def test_the_hostile_suite_holds_with_the_interpreter_on_a_read_only_bind_under_tmp():
    """This interpreter's whole prefix, bound read-only (as a read-only /usr is) at a new path under /tmp, in a
    mount namespace of the test's own; the interpreter found there is the one that runs the suite."""
    prefix = os.path.realpath(sys.base_prefix)
    relative = os.path.relpath(os.path.realpath(sys.executable if sys.prefix == sys.base_prefix else sys._base_executable),
                               prefix)
    if relative.startswith(".."):
        pytest.skip("this interpreter's executable is not inside its prefix")
    with tempfile.TemporaryDirectory(prefix="rloo-ro-prefix-") as folder:
        mount_point = os.path.join(folder, "python prefix")
        os.mkdir(mount_point)
        script = ('mount --bind "$1" "$2" && mount -o remount,bind,ro "$2" && shift 2 && exec "$@"')
        wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", prefix, mount_point]
        _check(_hostile_suite(os.path.join(mount_point, relative), wrap), mount_point + " (read-only)")

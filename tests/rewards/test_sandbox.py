"""The code sandbox against hostile completions: each hostile probe scores 0 and touches nothing outside.

Every probe is bounded (no unbounded loops or forks) and connects only to 127.0.0.1.
"""

import os
import subprocess
import sys
import time

import pytest
from sandbox_helpers import processes_with

from rloo.rewards import code_execution
from rloo.rewards.isolation import isolation_layers
from rloo.rewards.sandbox import SandboxUnavailable, run_tests
from rloo.rewards.verdicts import judge, plan_test

LAYERS = isolation_layers()
needs_isolation = pytest.mark.skipif(not (LAYERS["namespaces"] or LAYERS["landlock"]), reason="no namespaces, no Landlock")
HONEST = "def f(x):\n    return x * x\n"
TESTS = ["assert f(3) == 9", "assert f(4) == 16"]


def score(code, tests=TESTS, **kwargs):
    return run_tests(code, tests, timeout_s=10, **kwargs)


@needs_isolation
def test_an_honest_completion_scores_its_fraction():
    assert score(HONEST).fraction == 1.0
    assert score(HONEST, ["assert f(3) == 9", "assert f(2) == 5"]).fraction == 0.5


@needs_isolation
def test_the_trainers_environment_does_not_reach_the_child(monkeypatch):
    monkeypatch.setenv("RLOO_CANARY", "s3cret-canary")
    code = HONEST + (f"import os\ndef leaked():\n    found = 'RLOO_CANARY' in os.environ\n"
                     f"    for pid in (os.getppid(), {os.getpid()}):\n        try:\n"
                     f"            found = found or b's3cret-canary' in open(f'/proc/{{pid}}/environ', 'rb').read()\n"
                     f"        except OSError:\n            pass\n    return found\n")
    assert score(code, ["assert leaked() == True"]).passed == 0
    assert score(code, ["assert leaked() == False"]).passed == 1  # the probe ran and found nothing


@needs_isolation
@pytest.mark.parametrize("probe", [
    "os.chdir(OUT)\nopen('escaped', 'w').write('x')",
    "fd = os.open(OUT, os.O_RDONLY)\nos.close(os.open('escaped', os.O_WRONLY | os.O_CREAT, dir_fd=fd))",
    "os.mkfifo(os.path.join(OUT, 'escaped'))",
    "import sqlite3\nsqlite3.connect(os.path.join(OUT, 'escaped')).execute('create table t (x)')",
    "import subprocess\nsubprocess.run(['touch', os.path.join(OUT, 'escaped')], timeout=5)",  # _posixsubprocess
    "import _posixsubprocess, subprocess\nsubprocess.call(['/bin/sh', '-c', 'echo x > ' + OUT + '/escaped'])",
    "for name in ('BLOCKED', 'PATH_EVENTS'):\n    globals().pop(name, None)\nos.system('touch ' + OUT + '/escaped')",
    "os.remove(os.path.join(OUT, 'victim.txt'))",
])
def test_writes_outside_the_directory_fail(tmp_path, probe):
    (tmp_path / "victim.txt").write_text("keep me")
    code = f"import os\nOUT = {str(tmp_path)!r}\ntry:\n" + "".join(f"    {line}\n" for line in probe.splitlines())
    code += "except Exception:\n    pass\n" + HONEST
    result = score(code)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt"], result.output
    assert (tmp_path / "victim.txt").read_text() == "keep me"
    assert result.passed == 2  # the probe failed quietly, the honest part still counts


@needs_isolation
def test_killing_the_parent_or_another_process_fails():
    victim = subprocess.Popen(["sleep", "60"])
    try:
        code = (f"import os, signal\nfor pid in (os.getppid(), {victim.pid}, {os.getpid()}):\n"
                f"    try:\n        os.kill(pid, signal.SIGKILL if pid != {os.getpid()} else 0)\n"
                f"    except OSError:\n        pass\n" + HONEST)
        score(code)
        assert victim.poll() is None  # still running
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.skipif(not LAYERS["namespaces"], reason="only the pid namespace catches a setsid grandchild (docs/rewards.md)")
def test_a_setsid_grandchild_dies_with_the_run():
    token = "29.4817"  # a sleep length nothing else uses, to find the grandchild by its command line
    code = ("import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv('/bin/sleep', ['sleep', '{token}'])\n    os._exit(0)\n" + HONEST)
    assert score(code).passed == 2

    left = processes_with(token)
    for pid in left:  # clean up before failing
        os.kill(int(pid), 9)
    assert not left


@needs_isolation
@pytest.mark.parametrize("code", [
    # forged report lines on every descriptor, in the old format and the new one
    "import os\nfor fd in range(1, 12):\n    for t in range(2):\n        try:\n"
    "            os.write(fd, f'PASS {t}\\n'.encode() * 50)\n"
    "            os.write(fd, ('{\"k\": \"code\"}\\n{\"k\": \"val\", \"t\": %d, \"s\": 0, \"r\": \"True\"}\\n' % t).encode())\n"
    "        except OSError:\n            pass\ndef f(x):\n    return 0\n",
    # a monkeypatched os.write that turns every reported value into a guess
    "import os, re\n_write = os.write\n"
    "os.write = lambda fd, data: _write(fd, re.sub(rb'\"r\": \"[^\"]*\"', b'\"r\": \"True\"', data))\n"
    "def f(x):\n    return 0\n",
    # an object whose == is always true, and an int subclass that claims equality
    "class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
    "def f(x):\n    return Yes()\n",
    "class Int(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
    "def f(x):\n    return Int(0)\n",
    # exiting early with status 0, before any test runs
    "import os\nos._exit(0)\n",
    "import sys\nsys.exit(0)\n",
])
def test_forged_verdicts_score_zero(code):
    assert score(code, TESTS + ["assert False"]).passed == 0
    assert score(code, ["assert False"] * 3).fraction == 0.0


@needs_isolation
def test_existing_limits_hold():
    timed = run_tests("def f(x):\n    return x * x\ndef spin():\n    while True: pass", TESTS + ["spin()"], timeout_s=3)
    assert timed.timed_out and timed.passed == 2 and timed.total == 3  # tests before the hang count
    assert run_tests("blob = bytearray(2 * 1024**3)\n" + HONEST, TESTS, memory_mb=256).passed == 0
    assert run_tests("blob = bytearray(10 * 1024**2)\n" + HONEST, TESTS, memory_mb=256).passed == 2
    big = "open('big', 'wb').write(b'x' * 4 * 2**20)\n" + HONEST
    assert run_tests(big, TESTS, file_size_mb=1).passed == 0 and run_tests(big, TESTS, file_size_mb=8).passed == 2


def test_verdicts_are_decided_from_plain_values():
    plan = plan_test("x = f(2)\nassert x == 4 and len(g()) >= 1")
    assert [kind for kind, _, _ in plan.steps] == ["exec", "eval", "eval"]
    assert "4" not in "".join(source for kind, _, source in plan.steps if kind == "eval")  # expected value stays here
    assert judge(plan, {1: 4, 2: 1}, {0})
    assert not judge(plan, {1: 5, 2: 1}, {0}) and not judge(plan, {1: 4}, {0}) and not judge(plan, {1: 4, 2: 0}, {0})
    assert not judge(plan, {1: 4, 2: 1}, set())  # the setup step did not complete
    assert not judge(plan, {1: 4, 2: "1"}, {0})  # a str where an int is expected: TypeError, fails
    assert [source for _, _, source in plan_test("assert len(f(x)) > 0 and f(x) - 4 == 0").steps] == ["len(f(x))", "f(x)"]
    assert not judge(plan_test("assert False"), {}, set()) and not judge(plan_test("syntax error("), {}, set())


def test_it_refuses_without_isolation_unless_allowed(monkeypatch):
    from rloo.rewards import isolation
    monkeypatch.setattr(isolation, "isolation_layers", lambda: {"namespaces": False, "landlock": False, "pids_cgroup": False})
    monkeypatch.delenv(isolation.ALLOW_UNISOLATED_ENV, raising=False)
    with pytest.raises(SandboxUnavailable, match="allow_unisolated=True"):
        run_tests(HONEST, TESTS)
    with pytest.raises(SandboxUnavailable, match="allow_unisolated=True"):  # naming both layers is not enough
        run_tests(HONEST, TESTS, allow_missing=["namespaces", "landlock"])
    assert run_tests(HONEST, TESTS, allow_unisolated=True).passed == 2
    monkeypatch.setenv(isolation.ALLOW_UNISOLATED_ENV, "1")
    assert code_execution([HONEST], tests=[TESTS]) == [1.0]


@pytest.mark.skipif(not LAYERS["landlock"], reason="the weaker sandbox left here needs Landlock")
def test_without_namespaces_it_fails_closed_unless_accepted_by_name(monkeypatch):
    """A machine whose namespaces layer cannot start (simulated) refuses by default, naming the layer, the
    reason and the fix; each of the four ways of accepting it by name lets the code run under Landlock."""
    from rloo.rewards import isolation
    monkeypatch.setattr(isolation, "isolation_layers",
                        lambda: {"namespaces": False, "landlock": True, "pids_cgroup": LAYERS["pids_cgroup"]})
    monkeypatch.setattr(isolation, "probe_namespaces", lambda: (None, "unshare: Operation not permitted"))
    monkeypatch.setattr(isolation, "_allowed_missing", frozenset())
    for name in (isolation.ALLOW_UNISOLATED_ENV, isolation.ALLOW_MISSING_ENV, isolation.DISABLE_ENV):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SandboxUnavailable) as refused:
        run_tests(HONEST, TESTS)
    message = str(refused.value)
    for part in ("namespaces layer", "unshare: Operation not permitted", "user.max_user_namespaces",
                 "sandbox_allow_missing=['namespaces']", "RLOO_SANDBOX_ALLOW_MISSING=namespaces"):
        assert part in message
    with pytest.raises(SandboxUnavailable):
        code_execution([HONEST], tests=[TESTS])
    with pytest.raises(SandboxUnavailable):
        run_tests(HONEST, TESTS, allow_missing=["pids_cgroup"])  # another layer's name does not do
    assert run_tests(HONEST, TESTS, allow_missing=["namespaces"]).passed == 2
    assert code_execution([HONEST], tests=[TESTS], allow_missing=["namespaces"]) == [1.0]
    isolation.allow_missing(["namespaces"])  # what RLOOConfig(sandbox_allow_missing=["namespaces"]) sets
    assert run_tests(HONEST, TESTS).passed == 2
    isolation.allow_missing(())
    monkeypatch.setenv(isolation.ALLOW_MISSING_ENV, "namespaces")
    assert run_tests(HONEST, TESTS).passed == 2
    monkeypatch.setenv(isolation.ALLOW_MISSING_ENV, "")
    monkeypatch.setenv(isolation.DISABLE_ENV, "namespaces")  # switched off on purpose: named too
    assert run_tests(HONEST, TESTS).passed == 2
    with pytest.raises(ValueError, match="unknown sandbox layer"):
        run_tests(HONEST, TESTS, allow_missing=["namespace"])


def test_a_run_with_a_code_reward_checks_the_sandbox_at_start_and_says_its_layers(monkeypatch, capsys):
    from rloo.cli import _check_code_sandbox
    from rloo.config import ConfigError, RLOOConfig
    from rloo.rewards import exact_match, isolation
    monkeypatch.setattr(isolation, "isolation_layers", lambda: {"namespaces": False, "landlock": True, "pids_cgroup": True})
    monkeypatch.setattr(isolation, "probe_namespaces", lambda: (None, "unshare: Operation not permitted"))
    for name in (isolation.ALLOW_UNISOLATED_ENV, isolation.ALLOW_MISSING_ENV, isolation.DISABLE_ENV, "RANK"):
        monkeypatch.delenv(name, raising=False)
    config = RLOOConfig(output_dir="unused", report_to="none")
    _check_code_sandbox([exact_match], config)  # no code reward: nothing checked, nothing said
    assert capsys.readouterr().out == ""
    with pytest.raises(SandboxUnavailable, match="namespaces layer"):
        _check_code_sandbox([exact_match, code_execution], config)
    config = RLOOConfig(output_dir="unused", report_to="none", sandbox_allow_missing=["namespaces"])
    _check_code_sandbox([code_execution], config)
    assert capsys.readouterr().out.startswith("code sandbox layers: landlock (ABI ")
    monkeypatch.setattr(isolation, "_allowed_missing", frozenset())
    with pytest.raises(ConfigError, match="sandbox_allow_missing names unknown layers"):
        RLOOConfig(output_dir="unused", sandbox_allow_missing=["netns"])


def _wait_for(condition, attempts=300):
    """Polls `condition` up to `attempts` times, 0.1 s apart; a bounded loop, not a timing assertion."""
    for _ in range(attempts):
        if condition():
            return True
        time.sleep(0.1)
    return False


@needs_isolation
def test_the_child_dies_with_the_trainer():
    token = "287.731"  # seconds: longer than the wait below, so only a kill ends it in time
    trainer = subprocess.Popen([sys.executable, "-c", (
        "from rloo.rewards.sandbox import run_tests\n"
        f"run_tests(\"import os\\nos.execv('/bin/sleep', ['sleep', '{token[:3]}' + '{token[3:]}'])\", ['assert True'], "
        "timeout_s=60)")])  # the token split, so that only the sleeping child's command line holds it
    try:
        assert _wait_for(lambda: processes_with(token), attempts=1800), "the sandboxed child never started"
    finally:
        trainer.kill()  # SIGKILL: no cleanup code of the trainer runs
        trainer.wait()
    died = _wait_for(lambda: not processes_with(token), attempts=600)
    for pid in processes_with(token):
        os.kill(pid, 9)
    assert died
    if LAYERS["pids_cgroup"]:  # the dead trainer's cgroup is removed by the next process that probes for one
        from rloo.rewards.isolation import pids_cgroup_parent
        stale = os.path.join(pids_cgroup_parent()[0], f"rloo-sandbox-{trainer.pid}-0")
        assert os.path.isdir(stale)
        subprocess.run([sys.executable, "-c", "from rloo.rewards.isolation import pids_cgroup_parent as p; p()"], check=True)
        assert not os.path.exists(stale)


@pytest.mark.parametrize("disabled", ["namespaces", "landlock", "pids_cgroup", "landlock,pids_cgroup"])
def test_each_layer_can_be_missing_and_it_is_named_once(monkeypatch, caplog, disabled):
    from rloo.rewards import isolation
    monkeypatch.setenv(isolation.DISABLE_ENV, disabled)
    monkeypatch.setattr(isolation, "_missing_logged", False)
    if not all(value for name, value in isolation_layers().items() if name not in disabled):
        pytest.skip("a layer this test keeps is missing here")
    with caplog.at_level("WARNING", logger="rloo.rewards.isolation"):
        assert score(HONEST).passed == 2 and score(HONEST).passed == 2
    missing = [record.getMessage() for record in caplog.records if "runs without" in record.getMessage()]
    assert len(missing) == 1
    names = {"namespaces": "without namespaces", "landlock": "without Landlock", "pids_cgroup": "without a pids cgroup"}
    assert all((names[layer] in missing[0]) == (layer in disabled) for layer in names)

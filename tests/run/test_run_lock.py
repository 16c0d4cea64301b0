"""One run per output_dir: the lock (run/run_lock.py) refuses a second run at once, names the first, writes
nothing for the refused one, never refuses a run's own processes, and dies with its holder.

The 20-launch figure in docs/checkpoints.md comes from benchmarks/runs/run_lock.py; here, 3 launches."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rloo.config import ConfigError
from rloo.run.run_lock import LOCK_NAME, lock_output_dir

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
HOLD = ("import sys, time\nfrom rloo.run.run_lock import lock_output_dir\nlock_output_dir(sys.argv[1])\n"
        "print('held', flush=True)\ntime.sleep(600)\n")
# Another process that tries to take the lock once per line of its input, with the rank variables that line sets
# in its environment (`-` for none); it answers `took None`, `took` (then lets go) or `refused <message>`. One
# such process serves all the tries of a test: each start imports rloo (seconds of CPU).
TAKE = """import json, os, sys
from rloo.config import ConfigError
from rloo.run.run_lock import RANK_VARIABLES, lock_output_dir
for line in sys.stdin:
    for name in RANK_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(dict(item.split("=") for item in line.split() if item != "-"))
    try:
        lock = lock_output_dir(sys.argv[1])
    except ConfigError as error:
        print("refused", json.dumps(str(error)), flush=True)
        continue
    print("took" if lock is not None else "took None", flush=True)
    if lock is not None:
        lock.close()
"""


class OtherProcess:
    """Another process (one per test) that tries to take the lock whenever asked; `take(settings)` sets the rank
    variables `settings` names ('VAR=value ...', or '-' for none) and returns (answer, message)."""

    def __init__(self, directory):
        self.process = subprocess.Popen([sys.executable, "-c", TAKE, str(directory)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)

    def take(self, settings="-"):
        self.process.stdin.write(settings + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline().strip()
        assert line, f"the other process ended: {self.process.stderr.read()[-2000:]}"
        answer, _, message = line.partition(" ") if line.startswith("refused") else (line, "", "")
        return answer, json.loads(message) if message else ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.process.stdin.close()
        try:
            assert self.process.wait(timeout=300) == 0, self.process.stderr.read()[-2000:]
        finally:
            self.process.kill()


def start_holder(directory):
    """A process that takes the lock and keeps it; returns once it holds it."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True, env=ENV)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_another_process_is_refused_with_the_holders_pid_and_start_time(tmp_path):
    first = lock_output_dir(tmp_path / "run")
    again = lock_output_dir(tmp_path / "run")  # a second trainer in this process (a resume in a notebook)
    assert again is first and first.users == 2
    record = json.loads((tmp_path / "run" / LOCK_NAME).read_text())
    assert record["pid"] == os.getpid() and record["started"]
    with OtherProcess(tmp_path / "run") as other:
        answer, message = other.take()
        assert answer == "refused" and f"is in use by another run: process {os.getpid()} on " in message
        assert f"started {record['started']}" in message and "choose another output_dir" in message
        assert json.loads((tmp_path / "run" / LOCK_NAME).read_text()) == record  # the refused process wrote nothing
        first.release()
        assert other.take()[0] == "refused"  # still held by the second user
        first.release()
        assert other.take()[0] == "took"


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    holder = start_holder(tmp_path / "run")
    with pytest.raises(ConfigError, match=f"process {holder.pid} on "):
        lock_output_dir(tmp_path / "run")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = lock_output_dir(tmp_path / "run")  # the kernel released the dead process's lock
    assert json.loads((tmp_path / "run" / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.close()


def test_only_rank_0_of_a_launch_takes_the_lock(tmp_path):
    holder = start_holder(tmp_path / "run")
    try:
        # the other processes of a run never refuse it, whichever launcher's variable says their rank
        with OtherProcess(tmp_path / "run") as other:
            answers = [other.take(settings)[0] for settings in ("RANK=1", "PMI_RANK=1", "OMPI_COMM_WORLD_RANK=1", "RANK=0")]
        assert answers == ["took None"] * 3 + ["refused"], answers
    finally:
        holder.kill()
        holder.wait()
    assert lock_output_dir(tmp_path / "other", env={"RANK": "3"}) is None and not (tmp_path / "other").exists()


def snapshot(folder):
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_second_rloo_train_launches_are_refused_at_once_and_write_nothing(tmp_path, make_model, tokenizer):
    """A real `rloo train` holds the folder (stopped with SIGSTOP, so that the folder stands still); three
    more launched together are refused before loading anything, naming it, and change no file; killed,
    it leaves the folder free for the next run."""
    model_dir = tmp_path / "model"
    make_model().save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) for a in range(16)))
    out = tmp_path / "out"
    config = tmp_path / "run.yaml"
    config.write_text(textwrap.dedent(f"""\
        model_name_or_path: {model_dir}
        dataset_name: {data}
        reward_funcs: [exact_match]
        output_dir: {out}
        per_device_train_batch_size: 8
        num_generations: 4
        max_completion_length: 4
        max_steps: 100000
        logging_steps: 1
        save_steps: 1
        save_total_limit: 1
        """))
    command = [sys.executable, "-m", "rloo.cli", "train", "--config", str(config)]
    holder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    try:
        while not (out / "metrics.jsonl").exists():  # it holds the lock and trains
            assert holder.poll() is None, "the first run ended"
            time.sleep(0.2)
        holder.send_signal(signal.SIGSTOP)
        before = snapshot(out)
        contenders = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
                      for _ in range(3)]
        results = [(c.wait(timeout=300), c.stderr.read()) for c in contenders]
        assert snapshot(out) == before
        for status, stderr in results:
            assert status == 2 and f"is in use by another run: process {holder.pid} on " in stderr, stderr
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    after = subprocess.run([*command, "--max_steps", "1", "--overwrite_output_dir", "true"], capture_output=True,
                           text=True, env=ENV, timeout=300)
    assert after.returncode == 0, after.stderr[-2000:]
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1]

"""Fault injection into real tiny `rloo train` runs (issue #48): each fault, how long until the run ended, its exit
status, the first line of its message, what was lost, and what processes it left behind.

    flock /tmp/rloo-heavy.lock python benchmarks/runs/faults.py [--only NAME,NAME] [--json results.json]

Every run is a subprocess (benchmarks/runs/fault_run.py: `rloo train` with the fault armed) on the tests' tiny model,
in its own session and tagged through its environment, so that every process it started, however detached, is
found afterwards by scanning /proc (`left behind`; they are then killed). A run that outlives its deadline is a
hang (killed). `lost`: complete checkpoints written before the fault that no longer verify (their manifest's
sizes and SHA-256), plus, where the fault is one a run must survive by resuming, a resumed run whose final
weights differ from an unfaulted run's. The storage faults use a size-limited tmpfs as output_dir (root only;
skipped otherwise). The distributed ones run 2 CPU processes under torchrun. The vLLM ones train against
`rloo vllm-serve` on vLLM's CPU engine (benchmarks/runs/fault_server.py, in the venv scripts/test_vllm.sh builds,
or RLOO_VLLM_PYTHON; skipped without it), started before the run and killed after it (the server is the
harness's, and so is one a fault restarts: neither counts as left behind). Ends with one line:
`faults: N injected, H hangs, L lost, P left behind`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "benchmarks" / "runs" / "fault_run.py"
SERVER = ROOT / "benchmarks" / "runs" / "fault_server.py"
TAG = "RLOO_FAULT_TAG"

# A tiny run: 6 optimizer steps of 8 completions, a checkpoint every 2, an evaluation every 3.
BASE_FLAGS = ["--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "6",
              "--learning_rate", "3e-3", "--beta", "0.1", "--max_steps", "6", "--save_steps", "2",
              "--save_total_limit", "2", "--logging_steps", "1", "--seed", "0", "--use_cpu", "true"]
EVAL_FLAGS = ["--eval_split", "train", "--eval_steps", "3", "--max_eval_samples", "3", "--num_generations_eval", "2"]


@dataclass
class Fault:
    name: str
    where: str
    reward: str = "digit_fraction"  # a function of fault_run.py, or "model" (the tiny reward model)
    fault: str = ""  # RLOO_FAULT for fault_run.py: <point>:<n>:<action>
    flags: list[str] = field(default_factory=list)
    expect_exit: tuple[int, ...] = (0,)
    expect: str = ""  # a regular expression the run's output must hold
    deadline: float = 120.0  # seconds the run may take in all before it counts as a hang
    tmpfs_kb: int | None = None  # output_dir on a tmpfs of this size (0: sized to hold one checkpoint and a half)
    resume: bool = False  # resume the faulted run to the end; its weights must equal an unfaulted run's
    processes: int = 1  # 2: torchrun with 2 CPU processes
    env: dict[str, str] = field(default_factory=dict)
    server: str | None = None  # train against a vLLM server with this RLOO_SERVER_FAULT ("": none); None: no server
    server_timeout: float = 120.0  # the run's vllm_server_timeout


def faults() -> list[Fault]:
    stop, user = (1, 2), (2,)  # a RewardError / CheckpointError is a user-facing error: exit 2, one line
    async_flags = ["--async_rollouts", "true", "--async_rollout_timeout", "15"]
    return [
        # --- rewards ---
        Fault("reward hangs", "reward fn, batch 2", "hangs", flags=["--reward_timeout", "3"], expect_exit=user,
              expect=r"`hangs` did not return within reward_timeout=3 s at step 1, on the batch of 8"),
        Fault("reward hangs, policy none", "reward fn, batch 2", "hangs",
              flags=["--reward_timeout", "3", "--reward_error_policy", "none"], expect=r"Saved the trained model"),
        Fault("reward raises", "reward fn, batch 2", "raises", expect_exit=user,
              expect=r"`raises` raised ConnectionError: .* at step 1"),
        Fault("reward raises, policy none", "reward fn, batch 2", "raises", flags=["--reward_error_policy", "none"],
              expect=r"Saved the trained model"),
        Fault("reward wrong count", "reward fn, batch 2", "wrong_count", expect_exit=user,
              expect=r"`wrong_count` returned 7 values for 8 completions at step 1"),
        Fault("reward NaN", "reward fn, batch 2", "returns_nan", expect_exit=user,
              expect=r"`returns_nan` returned nan for sample 0 at step 1"),
        Fault("reward model OOM", "reward model, batch 2", "model", fault="reward_model:2:oom", expect_exit=user,
              expect=r"raised OutOfMemoryError: .* at step 1"),
        Fault("reward model OOM, policy none", "reward model, batch 2", "model", fault="reward_model:2:oom",
              flags=["--reward_error_policy", "none"], expect=r"Saved the trained model"),
        # --- async rollouts: the sampler (a forked process on CPU) ---
        Fault("async sampler dies", "sampler process, batch 2", "sampler_dies", flags=async_flags, expect_exit=stop,
              expect=r"the sampler process \(pid \d+\) died with exit code 3", deadline=60.0),
        Fault("async sampler raises", "sampler process, batch 2", "sampler_raises", flags=async_flags,
              expect_exit=stop, expect=r"sampler's reward server is down"),
        Fault("async sampler stalls", "sampler process, batch 2", "sampler_stalls", flags=async_flags,
              expect_exit=stop, expect=r"async_rollout_timeout"),
        # --- storage: output_dir on a small tmpfs ---
        Fault("disk full in a checkpoint", "checkpoint-4 save (tmpfs full)", tmpfs_kb=0, expect_exit=user,
              expect=r"could not write .*No space left on device", resume=True),
        Fault("output_dir read-only", "after step 3 (remount ro)", fault="step:3:remount_ro", tmpfs_kb=65536,
              expect_exit=user, expect=r"rloo: error: .*Read-only file system", resume=True),
        Fault("checkpoints deleted", "after step 3 (rm checkpoint-*)", fault="step:3:rmtree_checkpoints",
              expect=r"Saved the trained model"),
        Fault("output_dir deleted", "after step 3 (rm -r output_dir)", fault="step:3:rmtree_output",
              expect_exit=(0, 1, 2), expect=r"."),
        Fault("SIGKILL in a checkpoint save", "checkpoint-4, before the rename", fault="save:2:KILL",
              expect_exit=(-9,), resume=True),
        # --- signals ---
        Fault("SIGTERM mid-step", "step 3", fault="step:3:TERM", expect_exit=(143,),
              expect=r"resume_from_checkpoint latest", resume=True),
        Fault("SIGINT mid-step", "step 3", fault="step:3:INT", expect_exit=(130,),
              expect=r"resume_from_checkpoint latest", resume=True),
        Fault("second SIGINT", "step 3", fault="step:3:INT2", expect_exit=(130,), expect=r"second signal",
              resume=True),
        Fault("SIGKILL mid-step", "step 3", fault="step:3:KILL", expect_exit=(-9,), resume=True),
        Fault("SIGTERM during evaluation", "evaluation at step 3", fault="eval:1:TERM", flags=EVAL_FLAGS,
              expect_exit=(143,), expect=r"resume_from_checkpoint latest", resume=True),
        Fault("second SIGINT during evaluation", "evaluation at step 3", fault="eval:1:INT2", flags=EVAL_FLAGS,
              expect_exit=(130,), expect=r"second signal", resume=True),
        Fault("SIGTERM with async rollouts", "step 3, sampler running", fault="step:3:TERM", flags=async_flags,
              expect_exit=(143,), expect=r"resume_from_checkpoint latest"),
        Fault("SIGTERM during a tool call", "tool call, turn 3", fault="tool:3:TERM", expect_exit=(143,),
              expect=r"resume_from_checkpoint latest"),
        Fault("second SIGINT during a tool call", "tool call, turn 3", fault="tool:3:INT2", expect_exit=(130,),
              expect=r"second signal"),
        # --- distributed: 2 CPU processes under torchrun ---
        Fault("rank 1 SIGKILLed", "rank 1, step 2", fault="step:2:KILL", processes=2, env={"RLOO_FAULT_RANK": "1"},
              expect_exit=(1,), expect=r"rank 1|local_rank: 1"),
        Fault("rank 1 reward raises", "rank 1 reward fn, batch 2", "rank_raises", processes=2,
              env={"RLOO_FAULT_RANK": "1"}, expect_exit=(1,), expect=r"rank 1's reward parser"),
        Fault("rank 1 stalls", "rank 1, after step 2", fault="step:2:stall", processes=2,
              env={"RLOO_FAULT_RANK": "1"}, flags=["--ddp_timeout", "20"], expect_exit=(1,),
              expect=r"rank 1 \(last at 'rollout 1' \d+ s ago\) stopped making progress", deadline=180.0),
        # --- the vLLM server (rloo vllm-serve on vLLM's CPU engine) ---
        Fault("vLLM server killed mid-generation", "server, generation 3", server="generate:3:KILL", expect_exit=(1,),
              expect=r"closed the connection during POST /generate", deadline=300.0),
        Fault("vLLM server killed mid-push", "server, weight push 2", server="push:2:KILL", expect_exit=(1,),
              expect=r"closed the connection during POST /weights", deadline=300.0),
        Fault("vLLM engine raises (Encoder cache miss)", "server's model step, generation 3",
              server="generate:3:raise", expect_exit=(1,), deadline=300.0,
              expect=r"engine of this server failed during a generation \(ValueError: Encoder cache miss"),
        Fault("vLLM engine raises mid-load", "server's weight load, push 2", server="push:2:raise", expect_exit=(1,),
              expect=r"engine of this server failed during the load of weight push", deadline=300.0),
        Fault("vLLM server SIGSTOPped", "server, generation 3", server="generate:3:STOP", server_timeout=10.0,
              expect_exit=(1,), expect=r"did not answer POST /generate within vllm_server_timeout=10", deadline=300.0),
        Fault("vLLM server restarted between steps", "after weight push 3 (killed, started again)", server="",
              fault="pushed:3:restart_server", expect_exit=(1,), deadline=600.0,
              expect=r"generated with weights version 'boot-\w+', not '\w+' \(the trainer's last weight push\)"),
        Fault("SIGTERM during a vLLM weight push", "trainer, weight push 3", server="", fault="push:3:TERM",
              expect_exit=(143,), expect=r"resume_from_checkpoint latest", deadline=300.0),
    ]


# ------------------------------------------------------------------ setting up


def setup(work: Path) -> None:
    """The tests' tiny policy, a tiny reward model, and 64 prompts."""
    import transformers

    from rloo.toy import build_char_tokenizer, build_tiny_model
    from rloo.toy.tool_task import build_tool_tokenizer

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64)
    model.save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    config = transformers.Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, intermediate_size=32,
                                      num_labels=1, pad_token_id=tokenizer.pad_token_id)
    transformers.Qwen2ForSequenceClassification(config).save_pretrained(work / "reward_model")
    tokenizer.save_pretrained(work / "reward_model")
    model = build_tiny_model(tokenizer, seed=0, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=256, max_position_embeddings=512)  # a head size vLLM's CPU engine takes
    model.save_pretrained(work / "vllm_model")
    tokenizer.save_pretrained(work / "vllm_model")
    rows = [{"prompt": f"{a}+{b}="} for a in range(8) for b in range(8)]
    (work / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tool_tokenizer = build_tool_tokenizer()  # a chat template that renders tools and tool calls
    build_tiny_model(tool_tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                     intermediate_size=64).save_pretrained(work / "tool_model")
    tool_tokenizer.save_pretrained(work / "tool_model")
    chats = [{"prompt": [{"role": "user", "content": row["prompt"]}]} for row in rows]
    (work / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chats))


def command(work: Path, fault: Fault, output_dir: Path, resume: bool = False, url: str = "") -> list[str]:
    reward = f"model:{work / 'reward_model'}" if fault.reward == "model" else f"{RUNNER}:{fault.reward}"
    tools = fault.fault.startswith("tool:")
    model = work / ("vllm_model" if url else "tool_model" if tools else "model")
    flags = ["--model_name_or_path", str(model), "--dataset_name", str(work / ("chat.jsonl" if tools else "data.jsonl")),
             "--reward_funcs", reward, "--output_dir", str(output_dir), *BASE_FLAGS, *fault.flags]
    if tools:
        flags += ["--tools", f"{RUNNER}:slow_add", "--max_completion_length", "24"]
    if url:
        flags += ["--sampler", "vllm", "--vllm_mode", "server", "--vllm_server_base_url", url,
                  "--vllm_server_timeout", str(fault.server_timeout)]
    if resume:
        flags += ["--resume_from_checkpoint", "latest"]
    if fault.processes > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(fault.processes),
                "--master_port", str(29500 + os.getpid() % 1000), str(RUNNER), *flags]
    return [sys.executable, str(RUNNER), *flags]


# ------------------------------------------------------------------ the vLLM server


def vllm_python() -> Path | None:
    """The vLLM venv's python: RLOO_VLLM_PYTHON, else the venv scripts/test_vllm.sh builds (None: not built)."""
    if os.environ.get("RLOO_VLLM_PYTHON"):
        return Path(os.environ["RLOO_VLLM_PYTHON"])
    digest = hashlib.sha256((ROOT / "scripts" / "vllm-requirements.txt").read_bytes()).hexdigest()[:12]
    venv = Path(os.environ.get("RLOO_VLLM_VENV", Path.home() / ".cache" / "rloo" / f"vllm-venv-{digest}"))
    return venv / "bin" / "python" if (venv / ".complete").is_file() else None


def start_server(work: Path, fault: Fault, tag: str, log: Path) -> tuple[list[str], int, str]:
    """Start fault_server.py (the fault armed) on a free port; wait for its /health. (command, pid, URL)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [str(vllm_python()), str(SERVER), "--model", str(work / "vllm_model"), "--port", str(port),
           "--dtype", "float32", "--max_model_length", "64"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", TAG: tag, "RLOO_SERVER_FAULT": fault.server or "",
           "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(ROOT / "src")}
    with open(log, "w") as out:
        process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while not server_answers(url):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the vLLM fault server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(2)
    return cmd, process.pid, url


def server_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def kill_tagged(tag: str) -> None:
    for pid in tagged_processes(tag):
        for signum in (signal.SIGCONT, signal.SIGKILL):  # a stopped server too
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass


# ------------------------------------------------------------------ processes


def tagged_processes(tag: str) -> list[int]:
    """Every live process whose environment holds RLOO_FAULT_TAG=tag (a run's whole tree, detached or not)."""
    found, needle = [], f"{TAG}={tag}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat") as stat:
                        if stat.read().rsplit(")", 1)[1].split()[0] != "Z":  # zombies hold nothing
                            found.append(int(entry))
        except OSError:
            continue
    return found


def run_process(cmd: list[str], env: dict[str, str], deadline: float, log: Path) -> tuple[int | None, float, str]:
    """(exit status or None for a hang, seconds, the output); a hang's process group is killed."""
    start = time.monotonic()
    with open(log, "w") as out:
        process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   cwd=ROOT)
        try:
            status: int | None = process.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            status = None
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return status, time.monotonic() - start, log.read_text(errors="replace")


def first_line(output: str) -> str:
    """The message: the last `rloo: ...` line (the CLI's one-line errors and stop notes), else the last error."""
    lines = [line.strip() for line in re.split(r"[\r\n]", output) if line.strip()]
    for pattern in (r"rloo: (error|stopped|second signal).*", r"\[rank\d\]: \w+(Error|Timeout)\b.*",
                    r"^[\w.]*(Error|Timeout|Exception): .*", r"reward function .* scored None.*",
                    r"rloo: \S.*", r"Saved the trained model.*"):
        hits = [match.group(0) for line in lines if (match := re.search(pattern, line))]
        if hits:
            return hits[-1][:160]
    return lines[-1][:160] if lines else ""


# ------------------------------------------------------------------ checking what is left


def damaged_checkpoints(output_dir: Path, before: dict[str, str]) -> int:
    """Checkpoints complete before the fault (name -> trainer_state text) that no longer verify, plus any
    checkpoint-<n> folder without a trainer state (a half-written one, visible under a final name)."""
    from rloo.run.checkpoint import CheckpointError, _verify_manifest, read_state

    damaged = 0
    for path in output_dir.glob("checkpoint-*") if output_dir.is_dir() else []:
        state = read_state(path)
        if state is None:
            damaged += 1
            continue
        try:
            _verify_manifest(path, state)
        except CheckpointError:
            damaged += 1
    return damaged


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def equal_weights(a: Path, b: Path) -> bool:
    import torch

    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@dataclass
class Row:
    name: str
    where: str
    seconds: float
    exit: str
    message: str
    lost: int
    left: int
    hang: bool
    ok: bool
    note: str = ""


def mount_tmpfs(path: Path, kb: int) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kb}k", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def unmount(path: Path) -> None:
    while subprocess.run(["umount", "-l", str(path)], capture_output=True).returncode == 0:
        pass  # a fault's bind mount over the tmpfs, then the tmpfs


def output_dir_of(work: Path, fault: Fault) -> Path:
    """The run's output_dir; its output is next to it, in <output_dir>.log."""
    return work / "runs" / re.sub(r"\W+", "_", fault.name)


def run_fault(fault: Fault, work: Path, straight: dict[tuple, Path], checkpoint_kb: int) -> Row:
    tag = uuid.uuid4().hex
    env = {**os.environ, "OMP_NUM_THREADS": "1", TAG: tag, "RLOO_FAULT": fault.fault, "RLOO_FAULT_BATCH": "2",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]), **fault.env}
    if fault.processes > 1:
        env["ACCELERATE_USE_CPU"] = "1"
    output_dir = output_dir_of(work, fault)
    url = ""
    if fault.server is not None:
        if vllm_python() is None:
            return Row(fault.name, fault.where, 0.0, "-", "skipped: no vLLM venv (bash scripts/test_vllm.sh builds it)",
                       0, 0, False, True, "skipped")
        (work / "runs").mkdir(exist_ok=True)
        server_cmd, server_pid, url = start_server(work, fault, tag + "-server", output_dir.parent /
                                                   f"{output_dir.name}.server.log")
        env.update(RLOO_FAULT_SERVER_CMD=json.dumps(server_cmd), RLOO_FAULT_SERVER_TAG=tag + "-server",
                   RLOO_FAULT_SERVER_URL=url, RLOO_FAULT_SERVER_PID=str(server_pid))
    mounted = False
    if fault.tmpfs_kb is not None:
        mounted = mount_tmpfs(output_dir, fault.tmpfs_kb or int(checkpoint_kb * 1.5))
        if not mounted:
            return Row(fault.name, fault.where, 0.0, "-", "skipped: cannot mount a tmpfs (not root?)", 0, 0, False, True,
                       "skipped")
    try:
        status, seconds, output = run_process(command(work, fault, output_dir, url=url), env, fault.deadline,
                                              output_dir.parent / f"{output_dir.name}.log")
        time.sleep(1.0)  # a launcher's grace period for its other workers
        left = tagged_processes(tag)
        kill_tagged(tag + "-server")  # the harness's server (and one the fault restarted): not the run's to end
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        message = first_line(output)
        lost = damaged_checkpoints(output_dir, {})
        ok = status is not None and status in fault.expect_exit and re.search(fault.expect, output) is not None
        note = ""
        if fault.resume and status is not None:
            if fault.fault.endswith("remount_ro"):  # the folder writable again, as a user would before resuming
                subprocess.run(["umount", str(output_dir)], capture_output=True)
            elif mounted:  # the disk freed
                subprocess.run(["mount", "-o", "remount,rw,size=65536k", str(output_dir)], capture_output=True)
            env[TAG], env["RLOO_FAULT"] = tag + "-resume", ""
            resumed, _, resumed_output = run_process(command(work, fault, output_dir, resume=True), env, 180.0,
                                                     output_dir.parent / f"{output_dir.name}.resume.log")
            left += tagged_processes(tag + "-resume")
            if resumed != 0:
                lost, note = lost + 1, f"resume failed ({resumed}): {first_line(resumed_output)}"
            elif not equal_weights(output_dir, straight[key(fault)]):
                lost, note = lost + 1, "resumed, but its weights differ from the unfaulted run's"
            else:
                note = "resumed bit-equal"
        return Row(fault.name, fault.where, seconds, "hang" if status is None else str(status), message, lost,
                   len(left), status is None, ok and lost == 0 and not left, note)
    finally:
        if mounted:
            unmount(output_dir)


def key(fault: Fault) -> tuple:
    """What an unfaulted run must share with a faulted one to end with the same weights."""
    return fault.processes, tuple(fault.flags)


def straight_run(work: Path, processes: int, flags: tuple = ()) -> Path:
    fault = Fault("straight", "", processes=processes, flags=list(flags))
    output_dir = work / "runs" / f"straight_{processes}_{len(list(work.glob('runs/straight_*')))}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLOO_FAULT": "",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    status, _, output = run_process(command(work, fault, output_dir), env, 300, output_dir.with_suffix(".log"))
    if status != 0:
        raise SystemExit(f"the unfaulted run failed ({status}):\n{output[-3000:]}")
    return output_dir


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated fault names (substrings) to run")
    parser.add_argument("--json", default="", help="also write the rows to this file")
    parser.add_argument("--work", default="", help="a folder for the runs (default: a temporary one)")
    args = parser.parse_args(argv)
    chosen = [f for f in faults() if not args.only or any(s.strip() in f.name for s in args.only.split(","))]
    work = Path(args.work or tempfile.mkdtemp(prefix="rloo-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "runs").mkdir(exist_ok=True)
    setup(work)
    straight = {}
    for needed in sorted({key(f) for f in chosen if f.resume}):
        straight[needed] = straight_run(work, *needed)
    checkpoint_kb = 0
    if any(f.tmpfs_kb == 0 for f in chosen):
        sized = straight.get((1, ())) or straight_run(work, 1)
        checkpoint_kb = max(sum(p.stat().st_size for p in c.rglob("*") if p.is_file())
                            for c in sized.glob("checkpoint-*")) // 1024 + 1
    rows = []
    for fault in chosen:
        row = run_fault(fault, work, straight, checkpoint_kb)
        rows.append(row)
        print(f"  {row.name}: {row.exit} in {row.seconds:.1f} s, {row.message}", file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([row.__dict__ for row in rows], indent=2))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| fault | injected | s to end | exit | message (first line) | lost | left behind | as expected |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        message = r.message.replace("|", "\\|")
        note = f" ({r.note})" if r.note else ""
        lines.append(f"| {r.name} | {r.where} | {r.seconds:.1f} | {r.exit} | {message} | {r.lost} | {r.left} | "
                     f"{'yes' if r.ok else 'NO'}{note} |")
    ran = [r for r in rows if r.note != "skipped"]
    lines.append(f"faults: {len(ran)} injected, {sum(r.hang for r in ran)} hangs, {sum(r.lost for r in ran)} lost, "
                 f"{sum(r.left for r in ran)} left behind")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""One run per output_dir, counted: second `rloo train` launches into a folder a run holds.

    PYTHONPATH=src python benchmarks/runs/run_lock.py                      # 20 launches against a holding run
    PYTHONPATH=src python benchmarks/runs/run_lock.py --launches 4 --race 2   # fewer, plus 2 rounds of a race

held: a real `rloo train` (tiny local model, 16 prompts) starts, writes its first metrics row (it holds
the lock and trains) and is stopped with SIGSTOP, so that its folder stands still; then `--launches`
more `rloo train` of the same config start at once. Each must exit with status 2 and the message
naming the holder's process id, and the folder (every file's bytes and mtime) must be unchanged:
nothing written by a refused launch. The holder is then SIGKILLed, and one more launch (overwriting)
must run: a killed holder leaves no stale lock.

race (--race N): N rounds of two `rloo train` started together on an empty folder (max_steps 2, a
checkpoint a step): one must finish, the other be refused naming the winner, and the folder must hold
one run's files (metrics steps [1, 2] once, checkpoints of one run id).

It prints the counts, and writes them to --out (JSON). Every process is a full Python start with
torch, so a launch costs seconds of CPU: on a busy 2-core machine 20 launches take minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from rloo.toy import build_char_tokenizer, build_tiny_model

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def prepare(folder: Path) -> Path:
    """A tiny saved model, a prompt file and a run config writing into folder/out; returns the config."""
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                     intermediate_size=64).save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    (folder / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)})
                                                    for a in range(16)))
    config = folder / "run.yaml"
    config.write_text(textwrap.dedent(f"""\
        model_name_or_path: {folder / "model"}
        dataset_name: {folder / "prompts.jsonl"}
        reward_funcs: [exact_match]
        output_dir: {folder / "out"}
        per_device_train_batch_size: 8
        num_generations: 4
        max_completion_length: 4
        logging_steps: 1
        save_steps: 1
        """))
    return config


def train_command(config: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "rloo.cli", "train", "--config", str(config), *flags]


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(folder.rglob("*"))
            if p.is_file()}


def held(config: Path, out: Path, launches: int) -> dict:
    holder = subprocess.Popen(train_command(config, "--max_steps", "100000", "--save_total_limit", "1"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    try:
        while not (out / "metrics.jsonl").exists():
            if holder.poll() is not None:
                raise SystemExit("the holding run ended before writing its first metrics row")
            time.sleep(0.2)
        holder.send_signal(signal.SIGSTOP)
        before = snapshot(out)
        start = time.perf_counter()
        contenders = [subprocess.Popen(train_command(config, "--max_steps", "100000"), stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True, env=ENV) for _ in range(launches)]
        results = [(c.wait(), c.stderr.read()) for c in contenders]
        seconds = time.perf_counter() - start
        unchanged = snapshot(out) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    refused = sum(status == 2 and f"is in use by another run: process {holder.pid} on " in err for status, err in results)
    after = subprocess.run(train_command(config, "--max_steps", "1", "--overwrite_output_dir", "true"),
                           capture_output=True, text=True, env=ENV)
    return {"launches": launches, "refused": refused, "folder_unchanged": unchanged, "seconds_all_launches": seconds,
            "run_after_kill_ok": after.returncode == 0}


def race(config: Path, out: Path, rounds: int) -> dict:
    clean = 0
    for _ in range(rounds):
        if out.exists():
            subprocess.run(["rm", "-rf", str(out)], check=True)
        pair = [subprocess.Popen(train_command(config, "--max_steps", "2"), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, env=ENV) for _ in range(2)]
        results = [(p.wait(), p.stderr.read(), p.pid) for p in pair]
        winners = [r for r in results if r[0] == 0]
        losers = [r for r in results if r[0] == 2 and "is in use by another run" in r[1]]
        steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
        run_ids = {json.loads((c / "trainer_state.json").read_text())["run_id"] for c in out.glob("checkpoint-*")}
        named = bool(winners and losers and f"process {winners[0][2]} on " in losers[0][1])
        clean += len(winners) == 1 and len(losers) == 1 and named and steps == [1, 2] and len(run_ids) == 1
    return {"rounds": rounds, "one_winner_one_refused_one_runs_files": clean}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=20)
    parser.add_argument("--race", type=int, default=0, help="Rounds of two launches started together (0: none).")
    parser.add_argument("--out", default="benchmarks/results/run_lock.json")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = prepare(Path(tmp))
        result = {"held": held(config, Path(tmp) / "out", options.launches)}
        print(f"held: {result['held']['refused']} of {options.launches} second launches refused; folder unchanged: "
              f"{result['held']['folder_unchanged']}; a run after SIGKILL of the holder: "
              f"{'ran' if result['held']['run_after_kill_ok'] else 'FAILED'}")
        if options.race:
            result["race"] = race(config, Path(tmp) / "out", options.race)
            print(f"race: {result['race']['one_winner_one_refused_one_runs_files']} of {options.race} rounds of two "
                  f"launches ended with one run, the other refused naming it, and one run's files")
    Path(options.out).parent.mkdir(parents=True, exist_ok=True)
    Path(options.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

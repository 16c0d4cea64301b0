"""`rloo train` in a subprocess that kills itself at a chosen point, for the crash-resume tests.

    python tests/scripts/killable_train.py [rloo train flags...]     with RLOO_KILL=<where>:<n>:<signal>

where: "step" (after this process's n-th optimizer step), "state" (inside its n-th checkpoint save,
after accelerate's state is written and before trainer_state.json), "save" (inside its n-th save,
every file written, before the rename). signal: KILL or TERM, sent to this process by os.kill,
so the trainer sees a real signal. Also holds the reward function the tests train on.
"""

import os
import signal
import sys

import torch

torch.set_num_threads(1)


def digit_fraction(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def _arm(where: str, count: int, signame: str) -> None:
    from rloo import update
    from rloo.run import checkpoint

    targets = {"step": (update.Learner, "step"), "state": (checkpoint, "_manifest"), "save": (checkpoint, "_fsync_tree")}
    owner, name = targets[where]
    original = getattr(owner, name)
    calls = [0]

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs) if where == "step" else None
        calls[0] += 1
        if calls[0] == count:
            sys.stdout.flush()
            os.kill(os.getpid(), getattr(signal, f"SIG{signame}"))
        return result if where == "step" else original(*args, **kwargs)

    setattr(owner, name, wrapped)


if __name__ == "__main__":
    if os.environ.get("RLOO_KILL"):
        where, count, signame = os.environ["RLOO_KILL"].split(":")
        _arm(where, int(count), signame)
    from rloo.cli import main

    main(["train", *sys.argv[1:]])

"""The heartbeats that name the process of a distributed run that stopped (issue #48; distributed/heartbeat.py),
on torch's in-memory store standing in for the process group's. benchmarks/runs/faults.py's "rank 1 stalls" and
"rank 1 SIGKILLed" check the line in real 2-process torchrun runs."""

import time

import pytest
import torch.distributed as dist

from rloo.distributed.heartbeat import Heartbeat, RankFailure

GLOO_TIMEOUT = RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                            "20000ms for recv operation to complete")


def processes(world_size: int = 3) -> list[Heartbeat]:
    store = dist.HashStore()
    return [Heartbeat(rank, world_size, store, timeout=20) for rank in range(world_size)]


def test_the_process_behind_the_others_is_named_with_its_last_point():
    rank0, rank1, rank2 = processes()
    for beat in (rank0, rank1, rank2):
        beat.beat("rollout 0")
        beat.beat("optimizer step 1")
    rank1.beat("after optimizer step 1")
    rank2.beat("after optimizer step 1")
    rank0.beat("after optimizer step 1")
    rank0.beat("rollout 1")  # ranks 0 and 2 go on; rank 1 stalls after its optimizer step
    rank2.beat("rollout 1")
    time.sleep(0.01)
    line = rank0.blame(GLOO_TIMEOUT)
    assert line.startswith("rank 0 ended waiting for the other processes (RuntimeError in a collective, ddp_timeout=20 s)")
    assert "rank 1 (last at 'after optimizer step 1' 0 s ago) stopped making progress while rank 0 reached " \
           "'rollout 1'" in line
    assert "rank 2 (" not in line and "raise ddp_timeout" in line


def test_a_process_that_never_beat_is_named_too():
    rank0, _ = processes(2)
    rank0.beat("rollout 0")
    assert "rank 1 (last at no heartbeat yet)" in rank0.blame(GLOO_TIMEOUT)


@pytest.mark.parametrize("error", [ValueError("the reward parser hit a token"), RuntimeError("CUDA error: misaligned")])
def test_an_error_that_is_not_a_collectives_keeps_its_own_message(error):
    rank0, rank1 = processes(2)
    rank0.beat("rollout 0")
    assert rank0.blame(error) is None


def test_processes_at_the_same_point_blame_nobody_and_one_process_has_no_heartbeat():
    rank0, rank1 = processes(2)
    rank0.beat("rollout 0")
    rank1.beat("rollout 0")
    assert rank0.blame(GLOO_TIMEOUT) is None
    alone = Heartbeat.for_process_group(20)  # no process group here
    alone.beat("rollout 0")
    assert alone.store is None and alone.blame(GLOO_TIMEOUT) is None


def test_around_the_loop_a_collectives_failure_leaves_as_rank_failure_and_others_pass_through():
    rank0, rank1 = processes(2)
    rank1.beat("rollout 0")
    rank0.beat("rollout 0")
    rank0.beat("optimizer step 1")
    with pytest.raises(RankFailure, match=r"rank 1 \(last at 'rollout 0' \d+ s ago\) stopped") as caught:
        with rank0:
            raise GLOO_TIMEOUT
    assert caught.value.__cause__ is GLOO_TIMEOUT
    with pytest.raises(KeyError):
        with rank0:
            raise KeyError("not a collective's")

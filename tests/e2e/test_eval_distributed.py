"""evaluate() split over two processes: the same metrics as one process, hand values, every prompt
scored exactly once (5 prompts over 2 processes, and 1 prompt, where one process has none), and only
the main process writes the logged eval."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from conftest import torchrun
from rloo.config import RLOOConfig
from rloo.evaluation import evaluate
from rloo.generation.base import SampledBatch
from rloo.rewards.scoring import ScoredBatch

SCRIPT = Path(__file__).parents[1] / "scripts" / "eval_run.py"
N = 4  # num_generations_eval in eval_run.py
FIVE = ["0+1=1", "1+1=2", "2+1=3", "3+1=4", "4+1=5"]


def run_one_process(out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, timeout=600,
                            env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "rank0.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    one_dir, two_dir = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    single = run_one_process(one_dir)
    result = torchrun(SCRIPT, two_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((two_dir / f"rank{r}.json").read_text()) for r in range(2)]
    return single, ranks, two_dir


def test_two_processes_give_one_processs_metrics_on_every_process(runs):
    single, ranks, _ = runs
    assert single["num_processes"] == 1 and [r["num_processes"] for r in ranks] == [2, 2]
    assert ranks[0]["metrics"] == ranks[1]["metrics"]  # every process returns the global metrics
    assert set(ranks[0]["metrics"]) == set(single["metrics"])
    assert ranks[0]["metrics"] == pytest.approx(single["metrics"], abs=1e-6)


def test_eval_metrics_are_the_hand_values(runs):
    # Greedy (top_k=1): "a+1=d" completes "dddddd", cut by the stop strings "22" and "4": lengths 6, 2, 6, 1, 6
    # (the three of 6 are truncated). first_c_correct gives c = 1, 2, 3, 4, 0 of the 4 samples of each prompt.
    _, ranks, _ = runs
    m = ranks[0]["metrics"]
    assert m["eval_five/completions/mean_length"] == pytest.approx(21 / 5)
    assert m["eval_five/completions/min_length"] == 1 and m["eval_five/completions/max_length"] == 6
    assert m["eval_five/completions/clipped_ratio"] == pytest.approx(3 / 5)
    assert m["eval_five/rewards/first_c_correct/mean"] == pytest.approx(10 / 20)
    assert m["eval_five/rewards/completion_tokens/mean"] == pytest.approx(21 / 5)
    assert m["eval_five/reward"] == pytest.approx(10 / 20 + 21 / 5)  # weights 1 and 1
    # Sample std within a group: 0.5 for c = 1 or 3 of 4, sqrt(1/3) for 2 of 4, 0 for 0 or 4 (lengths are constant).
    assert m["eval_five/reward_std"] == pytest.approx((0.5 + 3 ** -0.5 + 0.5) / 5)
    # pass@k = 1 - C(4 - c, k) / C(4, k), averaged over the five prompts.
    assert m["eval_five/rewards/first_c_correct/pass@1"] == pytest.approx((1 + 2 + 3 + 4 + 0) / 4 / 5)
    assert m["eval_five/rewards/first_c_correct/pass@2"] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6) + 1 + 1 + 0) / 5)
    assert m["eval_five/rewards/first_c_correct/pass@4"] == pytest.approx(4 / 5)
    # "7+2=9": c = 9 mod 5 = 4 of 4, six tokens each, all truncated.
    assert m["eval_one/reward"] == pytest.approx(1 + 6) and m["eval_one/rewards/first_c_correct/pass@1"] == 1
    assert m["eval_one/completions/clipped_ratio"] == 1


def test_every_process_holds_every_sample_in_the_eval_sets_order(runs):
    """The eval sample rows (eval_completions.jsonl) gathered from two processes: each set's rows in its own order,
    on every process, equal to one process's."""
    single, ranks, _ = runs
    keys = [(row["eval_set"], row["index"], row["sample"]) for row in single["samples"]]
    assert keys == [("five", i, k) for i in range(5) for k in range(N)] + [("one", 0, k) for k in range(N)]
    assert [row["prompt"] for row in single["samples"]] == [p for p in FIVE for _ in range(N)] + ["7+2=9"] * N
    c = [1, 2, 3, 4, 0, 4]  # first_c_correct's correct samples per prompt (answer mod 5)
    assert [row["first_c_correct"] for row in single["samples"]] == [float(k < n) for n in c for k in range(N)]
    assert ranks[0]["samples"] == ranks[1]["samples"] == single["samples"]


def test_every_eval_prompt_is_scored_exactly_once(runs):
    single, ranks, _ = runs
    expected = Counter({prompt: N for prompt in [*FIVE, "7+2=9"]})
    assert Counter(row["prompt"] for row in single["scored"]) == expected
    assert Counter(row["prompt"] for rank in ranks for row in rank["scored"]) == expected  # none doubled or dropped
    per_rank = [{row["prompt"] for row in rank["scored"]} for rank in ranks]
    assert per_rank[0].isdisjoint(per_rank[1]) and len(per_rank[0]) == 4 and len(per_rank[1]) == 2  # 3 + 1 and 2 + 0
    # The same greedy completions whichever process sampled them.
    by_prompt = {row["prompt"]: row["ids"] for row in single["scored"]}
    assert all(row["ids"] == by_prompt[row["prompt"]] for rank in ranks for row in rank["scored"])


def test_only_the_main_process_logs_the_eval(runs):
    _, ranks, two_dir = runs
    lines = [json.loads(line) for line in (two_dir / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [line for line in lines if "eval_five/reward" in line]
    assert len(lines) == 2 and len(evals) == 1  # one training row and one eval row, from one process
    # lr 1e-30 moved no weight: the logged eval is the one evaluate() returned before training.
    assert {k: v for k, v in evals[0].items() if k != "step"} == pytest.approx(ranks[0]["metrics"], abs=1e-6)


class FakeProcess:
    """What evaluate() reads of an accelerator: this process's place among `num_processes`."""

    def __init__(self, process_index: int, num_processes: int):
        self.process_index, self.num_processes = process_index, num_processes


class CountingCollector:
    """A collector that records its sample and score calls; every completion is the prompt's number."""

    def __init__(self, process_index: int, num_processes: int):
        self.accelerator = FakeProcess(process_index, num_processes)
        self.args = RLOOConfig(output_dir="unused")  # evaluate() reads the loss settings for eval/loss
        self.model = torch.nn.Linear(1, 1)
        self.sampled: list[list[str]] = []
        self.scored: list[str] = []

    def sample(self, prompts, num_generations):
        self.sampled.append(list(prompts))
        rows = len(prompts) * num_generations
        ids = torch.tensor([[int(p)] for p in prompts for _ in range(num_generations)])
        return SampledBatch(prompt_ids=ids, prompt_mask=torch.ones_like(ids), completion_ids=ids,
                            completion_mask=torch.ones_like(ids), has_eos=torch.ones(rows, dtype=torch.bool))

    def sample_rows(self, rows, num_generations):  # RolloutCollector.sample_rows without tools: no episodes
        return self.sample([row["prompt"] for row in rows], num_generations), None

    def score(self, rows, sampled, num_generations, global_step, episodes=None):
        assert sampled.completion_ids.shape[0] == len(rows) * num_generations
        self.scored += [row["prompt"] for row in rows]
        values = sampled.completion_ids[:, 0].float()
        return ScoredBatch(scores=values, per_function=values[:, None], valid=torch.ones_like(values, dtype=torch.bool)), None


@pytest.mark.parametrize("size", [1, 4, 5, 7])
def test_every_process_samples_as_often_and_scores_only_its_own_prompts(size, monkeypatch):
    # Under FSDP2 / ZeRO-3 every sample call is a collective (the weights are gathered): a process with a
    # smaller share must still call it as often as the others, and must not score the stand-in it samples.
    other_process = {"scores": torch.zeros(1, 2), "per_function": torch.zeros(1, 2, 1),
                     "lengths": torch.ones(1, 2, dtype=torch.long), "truncated": torch.zeros(1, 2, dtype=torch.bool)}
    monkeypatch.setattr("rloo.evaluation.gather_object", lambda parts: [*parts, other_process])  # one process here
    dataset = [{"prompt": str(i)} for i in range(size)]
    collectors = [CountingCollector(rank, 2) for rank in range(2)]
    for collector in collectors:
        evaluate(collector, dataset, ["number"], num_generations=2, prompts_per_batch=2, global_step=0)
    assert len(collectors[0].sampled) == len(collectors[1].sampled) == -(-(-(-size // 2)) // 2)
    assert [len(batch) for batch in collectors[0].sampled] == [len(batch) for batch in collectors[1].sampled]
    assert sorted(collectors[0].scored + collectors[1].scored, key=int) == [str(i) for i in range(size)]
    assert collectors[0].scored == [str(i) for i in range(0, size, 2)]
    assert collectors[1].scored == [str(i) for i in range(1, size, 2)]

"""Multi-turn tool rollouts through vLLM's real engine (the CPU build): colocate with an `environment_factory`
whose method is the tool, and server mode with `tools=[add]`.

A tiny model warm-started on the toy tool task's exchange (vllm_tool_rollout.save_tool_model) writes a Hermes
`<tool_call>` on its first turn and an answer after the tool's result, sampled by the engine at temperature 1.
On the trajectories the trainer gets, checked against the engine's own outputs (every `generate` call recorded):
the tool ran (calls counted, its result appended), every model turn is exactly what the engine drew after exactly
that context (token in, token out), the tool's tokens are exactly its rendered message and carry no loss, the
engine's log-probs are kept at model tokens and zero at tool tokens, the trainer's log-probs of the model tokens
match the engine's across turns (so the importance weights are 1 there), and two steps train with
`vllm_importance_sampling_correction`, the second sampling from the pushed weights.

Run by scripts/test_vllm.sh; skipped where vLLM is not installed, except with RLOO_REQUIRE_VLLM set (CI).
"""

import json
import os
from pathlib import Path

import pytest

if os.environ.get("RLOO_REQUIRE_VLLM", "").lower() in ("1", "true", "yes"):
    import vllm  # noqa: F401  (CI: a missing vLLM is a failure, not a skip)
else:
    pytest.importorskip("vllm", reason="vLLM is not installed; scripts/test_vllm.sh builds a venv with it")

from test_vllm_server import serving  # noqa: E402
from vllm_tool_rollout import K, add, alternating, run_and_record, save_tool_model, tool_config, tool_dataset  # noqa: E402

from conftest import run_plain_python  # noqa: E402
from rloo import RLOOTrainer  # noqa: E402
from rloo.toy.tool_task import build_tool_tokenizer  # noqa: E402

TOLERANCE = 1e-4  # engine vs trainer log-probs of the same tokens, fp32 tiny Qwen2 (test_vllm_engine: ~1e-6)


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tool_model")
    save_tool_model(str(folder))
    return folder


def runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(start, end, value) of each run of equal values in `mask`."""
    spans, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            spans.append((start, i, mask[start]))
            start = i
    return spans


def tool_rounds(messages: list[dict]) -> list[list[dict]]:
    """The tool messages of a trajectory, one list per round (each run of consecutive tool messages)."""
    rounds, current = [], []
    for message in messages:
        if message["role"] == "tool":
            current.append(message)
        elif current:
            rounds.append(current)
            current = []
    return rounds + ([current] if current else [])


def check_trajectories(record: dict) -> None:
    """Every trajectory is the engine's draws and the tools' messages, in order, with the right masks and log-probs."""
    tokenizer = build_tool_tokenizer()
    drawn: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = {}  # context -> the engine's completions of it
    for call in record["engine_calls"]:
        for prompt, outputs in zip(call["prompts"], call["outputs"]):
            drawn.setdefault(tuple(prompt), []).extend((ids, logps) for ids, logps in outputs)
    draws, model_turns = sum(len(outputs) for outputs in drawn.values()), 0
    assert len(record["engine_calls"]) >= 2  # the first turn, and a turn after the tools' results
    for row, (prompt, ids, tool_mask, logps) in enumerate(zip(record["prompt_ids"], record["completion_ids"],
                                                             record["tool_mask"], record["logprobs"])):
        rounds = iter(tool_rounds(record["messages"][row]))
        assistant_turns = [m for m in record["messages"][row] if m["role"] == "assistant"]
        for start, end, from_model in runs(tool_mask):
            segment = ids[start:end]
            if from_model:  # exactly one of the engine's completions of exactly this context, with its log-probs
                candidates = drawn.get(tuple(prompt + ids[:start]), [])
                match = next((c for c in candidates if c[0] == segment), None)
                assert match is not None, f"row {row}: tokens {start}-{end} are not what the engine drew there"
                candidates.remove(match)
                assert logps[start:end] == pytest.approx(match[1], abs=1e-6)
                model_turns += 1
            else:  # the tool's message rendered for itself, no log-prob, no loss
                messages = next(rounds)
                expected = "".join(f"\ntool: <tool_response>{m['content']}</tool_response><eos>" for m in messages)
                assert tokenizer.decode(segment) == expected + "\nassistant: "
                assert all(value == 0.0 for value in logps[start:end])
                assert all(value == 0.0 for value in record["loss_mask"][row][start:end])
        assert model_turns and len(assistant_turns) == len([r for r in runs(tool_mask) if r[2]])
        assert next(rounds, None) is None  # every tool round's message is in the trajectory
        model_tokens = [i for i, m in enumerate(tool_mask) if m]
        assert all(record["loss_mask"][row][i] == 1.0 for i in model_tokens)  # alternating: every row trained
        gap = max(abs(record["trainer_logprobs"][row][i] - logps[i]) for i in model_tokens)
        assert gap < TOLERANCE, f"row {row}: trainer vs engine log-probs of model tokens differ by {gap:.2e}"
        assert all(abs(record["is_weights"][row][i] - 1) < 1e-3 for i in model_tokens)
    assert model_turns == draws  # every draw of the engine is in exactly one trajectory


def check_calls_and_steps(record: dict) -> None:
    """The tools ran on the first turns (the warm start calls add), and two steps trained with the correction."""
    trajectories = len(record["completion_ids"])
    calls_per_row = [sum(len(m.get("tool_calls") or []) for m in messages) for messages in record["messages"]]
    print(f"tool calls {record['tool_calls']} in {trajectories} trajectories, failures {record['tool_failures']}, "
          f"{len(record['engine_calls'])} engine calls")
    assert trajectories == 2 * K and record["tool_calls"] == sum(calls_per_row) >= trajectories // 2
    assert record["tool_failures"] == 0
    assert sum(0 in mask for mask in record["tool_mask"]) >= trajectories // 2  # tool tokens appended
    steps = [entry for entry in record["log_history"] if "sampler/max_abs_log_ratio" in entry]
    print("per step: tools/call_frequency", [entry["tools/call_frequency"] for entry in steps],
          "sampler/max_abs_log_ratio", [entry["sampler/max_abs_log_ratio"] for entry in steps])
    assert len(steps) == 2 and all(entry["tools/call_frequency"] > 0 for entry in steps)
    assert max(entry["sampler/max_abs_log_ratio"] for entry in steps) < TOLERANCE  # step 2: from the pushed weights
    assert record["weights_changed"]


def test_colocated_engine_runs_tool_turns_token_in_token_out(tool_model, tmp_path):
    """colocate, environment_factory: one process of its own (vllm_tool_rollout.py) holds the engine."""
    script = Path(__file__).with_name("vllm_tool_rollout.py")
    result = run_plain_python(str(script), str(tool_model), str(tmp_path / "out"),
                              str(tmp_path / "record.json"))
    assert result.returncode == 0 and "RECORDED" in result.stdout, result.stderr[-4000:]
    record = json.loads((tmp_path / "record.json").read_text())
    check_trajectories(record)
    check_calls_and_steps(record)
    calls_per_row = [sum(len(m.get("tool_calls") or []) for m in messages) for messages in record["messages"]]
    assert record["environment_calls"] == calls_per_row  # each trajectory's own environment served its calls


def test_server_runs_tool_turns_token_in_token_out(tool_model, tmp_path):
    """server mode, tools=[add]: the trainer in this process, the engine behind `rloo vllm-serve`."""
    with serving(tool_model) as url:
        args = tool_config(str(tmp_path / "out"), vllm_mode="server", vllm_server_base_url=url,
                           vllm_server_timeout=120)
        trainer = RLOOTrainer(model=str(tool_model), reward_funcs=[alternating], args=args,
                              train_dataset=tool_dataset(), processing_class=build_tool_tokenizer(), tools=[add])
        record = run_and_record(trainer)
    check_trajectories(record)
    check_calls_and_steps(record)
    assert record["environment_calls"] is None

"""TRL 1.16's agent example runs as a script with rloo (issue #47): examples/trl_agent_increment.py is the docs'
IncrementEnv example (the environment owns the data and the reward, no train_dataset) with only the import line and
the model changed, and this test runs that file unchanged, on Qwen3's chat template and on Llama 3.1's (the real
tokenizers rebuilt offline from llama.cpp's vocabularies, TRL's templates; tests/rollout/family_tokenizers.py).

The model is a tiny random one saved with the family's tokenizer; what it writes comes from a scripted sampler (the
sampler of tests/rollout/tool_chat.py, given to the trainer here): in turn 1 the call increment(step=N) for the task
"Increment the counter by N.", exactly as the family's template renders a call (a Qwen3 `<tool_call>` JSON block, a
Llama 3 `{"name": ..., "parameters": ...}` turn), after the tool's result an answer. So the call frequency and the
failures measure rloo reading each family's native calls and running the environment's tool through the example's
code. What the test changes around the file: `max_steps` 1000 -> 1 and `output_dir` a temporary folder (a subclass
of rloo.RLOOConfig put where `from rloo import RLOOConfig` finds it), the sampler, and it keeps the trainer to read
its logs."""

import random
import re
import runpy
import sys
from pathlib import Path

import pytest
from family_tokenizers import family_tokenizer, needs_family_tokenizers
from tool_chat import ScriptedSampler

import rloo
from rloo.tools.formats import rendered_call_turn
from rloo.tools.rendering import call_turn_end
from rloo.toy import build_tiny_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_agent_increment.py"
KWARGS = {"enable_thinking": False}  # the example's chat_template_kwargs


class NativeCalls(ScriptedSampler):
    """The family's native call of increment(step=N), N read from the task; once that call is in the conversation
    (the tool's result follows it), an answer."""

    def __init__(self, tokenizer, stops):
        super().__init__(tokenizer, self.write)
        self.eos_token_ids = sorted(stops)
        self.end = tokenizer.convert_ids_to_tokens(call_turn_end(tokenizer, stops, KWARGS))

    def write(self, text: str, row: int) -> str:
        target = int(re.findall(r"Increment the counter by (\d+)\.", text)[-1])
        call = rendered_call_turn(self.tokenizer, KWARGS, [("increment", {"step": target})])
        call = call[: call.index(self.end)]  # the sampler appends the end-of-turn id
        return "The counter is there." if call in text else call


@pytest.mark.parametrize("family", ["qwen3", "llama3_1"])
def test_trl_s_agent_example_runs_unchanged(tmp_path, monkeypatch, family):
    needs_family_tokenizers()
    tokenizer, stops = family_tokenizer(family)
    model = build_tiny_model(tokenizer, seed=0, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=32, max_position_embeddings=1024)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    if tokenizer.pad_token is None:  # Llama 3's: the trainer picks its own for the saved one; the script's padding
        tokenizer.pad_token = tokenizer.eos_token
    sampler = NativeCalls(tokenizer, stops)
    trainers = []

    class OneStep(rloo.RLOOConfig):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "max_steps": 1, "output_dir": str(tmp_path / "run"),
                                       "logging_steps": 1, "save_steps": 0})

    init = rloo.RLOOTrainer.__init__

    def with_sampler(self, *args, **kwargs):
        trainers.append(self)
        init(self, *args, sampler=sampler, **kwargs)

    monkeypatch.setattr(rloo, "RLOOConfig", OneStep)
    monkeypatch.setattr(rloo.RLOOTrainer, "__init__", with_sampler)
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), str(tmp_path / "model")])
    random.seed(0)
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    [trainer] = trainers
    logged = [entry for entry in trainer.state.log_history if "tools/call_frequency" in entry][-1]
    print(f"{family}: format {trainer.multi_turn.call_format.name}, call frequency {logged['tools/call_frequency']}, "
          f"failure frequency {logged['tools/failure_frequency']}, reward {logged['reward']}")
    assert logged["tools/call_frequency"] == 1.0  # every trajectory: one call, then the answer
    assert logged["tools/failure_frequency"] == 0.0  # no call failed, from its format or otherwise
    assert logged["reward"] == 1.0  # IncrementEnv.get_reward: each call reached the tool with its typed step

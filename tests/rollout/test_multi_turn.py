"""Multi-turn rollouts (rollout.multi_turn, tools/): token in, token out; tool tokens out of the loss,
the KL and the lengths; tool failures as messages; environments; rollout_func; TRL's interface."""

import asyncio
import json
import os
import threading
import time

import pytest
import torch
from datasets import Dataset
from tool_chat import HERMES, THINK_DROPPING, ScriptedSampler, call, tool_tokenizer

from rloo import RLOOConfig, RLOOTrainer
from rloo.config import ConfigError
from rloo.rollout import Rollout
from rloo.tools import ToolCall, parse_tool_calls, run_tool_calls, tool_suffix_ids
from rloo.toy import build_tiny_model


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def _model(tokenizer, seed=0):
    return build_tiny_model(tokenizer, seed=seed, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                            intermediate_size=64)


def _dataset(n=4):
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"{a}+{a + 1}?"}], "answer": str(2 * a + 1)}
                              for a in range(n)])


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                  max_completion_length=120, learning_rate=1e-2, beta=0.0, max_steps=1, logging_steps=1, save_steps=0,
                  seed=0, overwrite_output_dir=True)
    return RLOOConfig(**{**values, **overrides})


def contains_answer(completions, answer, **kwargs):
    return [float(a in json.dumps(c)) for c, a in zip(completions, answer)]


def call_then_answer(text, row):
    """Turn 1: even rows call add, odd rows answer; after a tool result: answer."""
    if "<tool_response>" in text:
        return "<think>sum</think>it is done"
    return call("add", a=1, b=2) if row % 2 == 0 else "no tool"


def _trainer(tmp_path, script, tokenizer=None, **kwargs):
    tokenizer = tokenizer or tool_tokenizer()
    sampler = ScriptedSampler(tokenizer, script)
    config = kwargs.pop("args", None) or _config(tmp_path)
    trainer = RLOOTrainer(model=kwargs.pop("model", None) or _model(tokenizer), args=config,
                          train_dataset=kwargs.pop("train_dataset", _dataset()), processing_class=tokenizer,
                          sampler=sampler, **{"reward_funcs": [contains_answer], **kwargs})
    return trainer, sampler


# ------------------------------------------------------------------ token in, token out


def test_trained_ids_are_the_sampled_ids_and_the_appended_ids(tmp_path):
    """With a template that re-renders earlier assistant turns without their <think> block, the trajectory
    still holds exactly the sampled turn-1 ids, the tool message's ids and the sampled turn-2 ids."""
    tokenizer = tool_tokenizer(THINK_DROPPING)

    def script(text, row):
        return "<think>sum</think>ok" if "<tool_response>" in text else "<think>plan</think>" + call("add", a=1, b=2)

    trainer, sampler = _trainer(tmp_path, script, tokenizer=tokenizer, tools=[add])
    rollout, samples = trainer.collector.collect(trainer.train_dataset.select(range(2)).to_list())
    first, second = sampler.sampled  # turn 1 (2 prompts x K=2), turn 2 (4 trajectories x 1)
    suffix = tool_suffix_ids(tokenizer, [{"role": "tool", "name": "add", "content": "3"}], {tokenizer.eos_token_id})
    assert tokenizer.decode(suffix) == "\ntool: <tool_response>3</tool_response><eos>\nassistant: "
    for row in range(4):
        ids = rollout.completion_ids[row][rollout.completion_mask[row].bool()].tolist()
        assert ids == first[row] + suffix + second[row]
        assert rollout.tool_mask[row, :len(ids)].tolist() == [1] * len(first[row]) + [0] * len(suffix) + [1] * len(second[row])
        # The turn-2 prompt the sampler saw is the prompt plus exactly these ids, not a re-rendering.
        prompt = rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist()
        assert sampler.calls[1][row] == prompt + first[row] + suffix
    # Re-rendering the conversation drops the first turn's <think> block: other ids than were sampled.
    messages = [{"role": "user", "content": "0+1?"}, {"role": "assistant", "content": "<think>plan</think>",
                                                       "tool_calls": [ToolCall("add", {"a": 1, "b": 2}).as_message_call()]},
                {"role": "tool", "name": "add", "content": "3"}, {"role": "assistant", "content": "<think>sum</think>ok"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert "plan" not in rendered
    assert "plan" in tokenizer.decode(rollout.completion_ids[0])
    # Reward functions get the trajectory as messages: the assistant's call, the tool's result, the answer.
    assert samples.completions[0].count("<tool_response>3</tool_response>") == 1


def test_sampler_logprobs_are_zero_at_tool_tokens_and_kept_for_model_tokens(tmp_path):
    trainer, sampler = _trainer(tmp_path, call_then_answer, tools=[add])
    rows = trainer.train_dataset.select(range(2)).to_list()
    sampled, episodes = trainer.collector.sample_rows(rows)
    model_tokens = sampled.completion_mask * sampled.tool_mask
    assert torch.all(sampled.logprobs[model_tokens.bool()] == -0.5)
    assert torch.all(sampled.logprobs[(sampled.completion_mask * (1 - sampled.tool_mask)).bool()] == 0)
    assert episodes.tool_calls == 2  # rows 0 and 2 of the 4 trajectories called add once


# ------------------------------------------------------------------ masks: loss, KL, lengths


def _hand_rollout(tool_mask):
    """Two completions of 4 tokens: row 0 (advantage +1) has tokens 2-3 from a tool, row 1 (advantage -1) none."""
    ids = torch.tensor([[10, 11, 12, 13], [10, 11, 12, 13]])
    ones = torch.ones(2, 4, dtype=torch.long)
    return Rollout(prompt_ids=torch.tensor([[20], [20]]), prompt_mask=torch.ones(2, 1, dtype=torch.long),
                   completion_ids=ids, completion_mask=ones, old_logps=None, ref_logps=None,
                   raw_scores=torch.zeros(2), reward_columns=torch.zeros(2, 1), scores=torch.zeros(2),
                   seq_kl=torch.zeros(2), rewards=torch.zeros(2), advantages=torch.tensor([1.0, -1.0]),
                   token_advantages=None, has_eos=torch.ones(2, dtype=torch.bool), trained=torch.ones(2, dtype=torch.bool),
                   tool_mask=tool_mask)


def test_tool_tokens_carry_no_loss_and_no_denominator(tmp_path):
    """token-mean at ratio 1: loss = sum over trained tokens of -A / their count. Row 0's two model tokens give
    -1 each, row 1's four tokens +1 each: (-2 + 4) / 6 = 1/3. Were the tool mask dropped, row 0's tool
    tokens would count too: (-4 + 4) / 8 = 0."""
    trainer, _ = _trainer(tmp_path, call_then_answer, tools=[add], args=_config(tmp_path, loss_agg_mode="token-mean",
                                                                                 per_device_train_batch_size=2))
    tool_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    stats = trainer.learner.accumulate_gradients(_hand_rollout(tool_mask))
    assert stats["loss/policy_avg"] == pytest.approx(1 / 3, abs=1e-6)
    trainer.optimizer.zero_grad()
    assert trainer.learner.accumulate_gradients(_hand_rollout(None))["loss/policy_avg"] == pytest.approx(0.0, abs=1e-6)


def test_tool_tokens_carry_no_kl_and_no_length(tmp_path):
    """beta > 0: the per-token KL to the reference is zero at tool positions (and counted at the model's),
    and completions/mean_length counts the model's tokens only."""
    trainer, _ = _trainer(tmp_path, call_then_answer, tools=[add], args=_config(tmp_path, beta=0.1))
    with torch.no_grad():  # a reference that differs from the policy, so that every model token has a KL
        for p in trainer.reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    rows = trainer.train_dataset.select(range(2)).to_list()
    sampled, _ = trainer.collector.sample_rows(rows)
    _, _, token_kls = trainer.collector.kl_terms(sampled, from_engine=True)
    tool_positions = (sampled.completion_mask * (1 - sampled.tool_mask)).bool()
    assert tool_positions.any()
    assert torch.all(token_kls[tool_positions] == 0)
    assert (token_kls[(sampled.completion_mask * sampled.tool_mask).bool()] != 0).all()
    rollout, _ = trainer.collector.collect(rows)
    from rloo.run.metrics import rollout_metrics

    stats = rollout_metrics(rollout, trainer.accelerator, 2, ["contains_answer"])
    assert stats["completions/mean_length"] == pytest.approx(float(rollout.model_mask().sum()) / 4)
    assert stats["completions/mean_length"] < float(rollout.completion_mask.sum()) / 4


# ------------------------------------------------------------------ tools: failures, async, limits


def test_every_tool_failure_becomes_an_error_message():
    def boom(x: int) -> int:
        """Raise.

        Args:
            x: anything
        """
        raise RuntimeError("kaput")

    def slow(x: int) -> int:
        """Sleep.

        Args:
            x: anything
        """
        time.sleep(2)
        return x

    _, malformed = parse_tool_calls("<tool_call>{not json</tool_call>")
    _, nameless = parse_tool_calls('<tool_call>{"arguments": {"a": 1}}</tool_call>')
    _, unclosed = parse_tool_calls('<tool_call>{"name": "add"')
    calls = [ToolCall("boom", {"x": 1}), ToolCall("nope", {}), ToolCall("add", {"a": 1, "c": 2}), *malformed, *nameless,
             *unclosed, ToolCall("add", {"a": 1, "b": 2}), ToolCall("slow", {"x": 1})]
    results = run_tool_calls([calls], [{"boom": boom, "slow": slow, "add": add}], timeout=0.2)[0]
    assert [r.failed for r in results] == [True] * 6 + [False, True]
    errors = [json.loads(r.content)["error"] for r in results[:6] + results[7:]]
    assert "RuntimeError: kaput" in errors[0]
    assert "unknown tool 'nope'" in errors[1] and "add" in errors[1]
    assert "TypeError" in errors[2]
    assert "not valid JSON" in errors[3] and 'no "name"' in errors[4] and "not closed" in errors[5]
    assert "did not return within 0.2 s" in errors[6]
    assert results[6].content == "3"


def test_async_tools_of_different_trajectories_run_concurrently():
    """Two async calls that each wait until both have started: run one after the other, the first would time out."""
    started = []

    async def rendezvous(tag: str) -> str:
        """Wait for the other call.

        Args:
            tag: a label
        """
        started.append(tag)
        while len(started) < 2:
            await asyncio.sleep(0.01)
        return tag

    calls = [[ToolCall("rendezvous", {"tag": "a"})], [ToolCall("rendezvous", {"tag": "b"})]]
    results = run_tool_calls(calls, [{"rendezvous": rendezvous}] * 2, timeout=5)
    assert [[r.content for r in turn] for turn in results] == [["a"], ["b"]]
    assert not any(r.failed for turn in results for r in turn)


def test_call_and_failure_frequencies_are_logged(tmp_path):
    """4 trajectories: one valid call, one call with a wrong argument, two without: 2/4 calls, 1/2 failed."""
    def script(text, row):
        if "<tool_response>" in text:
            return "done"
        return [call("add", a=3, b=4), call("add", a=3, c=4), "no", "no"][row]

    trainer, _ = _trainer(tmp_path, script, tools=[add], train_dataset=_dataset(2),
                          args=_config(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=2))
    trainer.train()
    last = [entry for entry in trainer.state.log_history if "tools/call_frequency" in entry][-1]
    assert last["tools/call_frequency"] == pytest.approx(2 / 4)
    assert last["tools/failure_frequency"] == pytest.approx(1 / 2)


def test_the_completions_table_file_and_report_show_each_trajectory_turn_by_turn(tmp_path, capsys):
    """log_completions: the console table, completions.jsonl and `rloo report` show the model's turns, its
    tool calls and the tool results marked (`call ▸ add(a=1, b=2)`, `result → 3`); a tool's markup, escapes and HTML
    stay inert. (tests/rollout/test_trajectory_view.py: a failed call, eval_samples.jsonl, the report's turns.)"""
    from rloo.run.report import build_report

    def note(text: str) -> str:
        """Echo a note.

        Args:
            text: The note.
        """
        return "[bold]x[/bold] <b>y</b> \x1b[2J"

    def script(text, row):
        if "<tool_response>" in text:
            return "it is done"
        return call("add", a=1, b=2) if row % 2 == 0 else call("note", text="hi")

    trainer, _ = _trainer(tmp_path, script, tools=[add, note], args=_config(tmp_path, log_completions=True))
    trainer.train()
    shown = capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert rows[0]["completion"] == [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "add",
                                                                                           "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "name": "add", "content": "3"},
        {"role": "assistant", "content": "it is done"}]
    assert rows[1]["completion"][1] == {"role": "tool", "name": "note", "content": "[bold]x[/bold] <b>y</b> \x1b[2J"}
    assert "call \u25b8 add(a=1, b=2)" in shown and "result \u2192 3" in shown and 'call \u25b8 note(text="hi")' in shown
    assert "[bold]x[/bold] <b>y</b> \\x1b[2J" in shown and "\x1b" not in shown
    assert "'role'" not in shown and "<tool_response>" not in shown
    page = build_report(tmp_path / "run").read_text(encoding="utf-8")
    assert "result \u2192 3" in page and "result \u2192 [bold]x[/bold] &lt;b&gt;y&lt;/b&gt; \\x1b[2J" in page
    assert "<b>y</b>" not in page


def test_max_tool_calling_iterations_and_the_completion_budget(tmp_path):
    """A model that always calls: rounds stop at max_tool_calling_iterations; the budget counts tool tokens."""
    always = lambda text, row: call("add", a=1, b=2)  # noqa: E731
    trainer, sampler = _trainer(tmp_path, always, tools=[add], args=_config(tmp_path, max_tool_calling_iterations=2,
                                                                                  max_completion_length=1000))
    rollout, _ = trainer.collector.collect(trainer.train_dataset.select(range(2)).to_list())
    assert len(sampler.calls) == 3  # the first turn and two rounds of calls
    for row in range(4):  # three model turns, two tool results: model, tool, model, tool, model
        mask = rollout.tool_mask[row][rollout.completion_mask[row].bool()]
        assert int((mask[1:] != mask[:-1]).sum()) == 4

    trainer, sampler = _trainer(tmp_path, always, tools=[add], args=_config(tmp_path, max_completion_length=130))
    rollout, _ = trainer.collector.collect(trainer.train_dataset.select(range(2)).to_list())
    assert int(rollout.completion_mask.sum(dim=1).max()) <= 130
    assert len(sampler.calls) >= 2
    # a trajectory whose tool results do not fit ends with unanswered calls: truncated (clipped_ratio,
    # mask_truncated_completions), though its last turn ended with an end id
    assert not rollout.has_eos.any()


def test_tools_need_a_template_that_renders_them(tmp_path):
    plain = tool_tokenizer("{% for m in messages %}{{ m.role + ': ' + m.content + '\\n' }}{% endfor %}")
    with pytest.raises(ConfigError, match="drops part of a tool conversation"):
        _trainer(tmp_path, call_then_answer, tokenizer=plain, tools=[add])

    def undocumented(a: int) -> int:
        return a

    with pytest.raises(ConfigError, match="cannot be described to the model"):
        _trainer(tmp_path, call_then_answer, tools=[undocumented])


# ------------------------------------------------------------------ environments


class Counter:
    def reset(self, **row):
        self.total = 0
        self.row = row
        return " Count up."

    def increment(self, step: int) -> int:
        """Add to the counter.

        Args:
            step: how much to add
        """
        self.total += step
        return self.total

    def get_reward(self):
        return [0.5, float(self.total)]  # per-turn rewards, summed into the episode reward


class Echo:
    def reset(self, **row):
        self.said = []

    def shout(self, text: str) -> str:
        """Shout back.

        Args:
            text: what to shout
        """
        self.said.append(text)
        return text.upper()


def test_environment_factory_resets_tools_and_owns_the_reward(tmp_path):
    def script(text, row):
        if "<tool_response>" in text:
            return "done"
        assert text.rstrip().endswith("Count up.<eos>\nassistant:")  # reset's text joined the last user message
        return [call("increment", step=2), call("decrement", step=1), "no"][row % 3]

    trainer, _ = _trainer(tmp_path, script, environment_factory=Counter, reward_funcs=None,
                          args=_config(tmp_path, num_generations=3, per_device_train_batch_size=3))
    assert [fn.name for fn in trainer.reward_functions] == ["Counter"]
    assert trainer.reward_func_names == ["Counter"] and trainer.reward_weights.tolist() == [1.0]  # TRL's attributes
    rows = trainer.train_dataset.select(range(1)).to_list()
    rollout, _ = trainer.collector.collect(rows)
    assert [e.total for e in trainer.environments] == [2, 0, 0]
    assert trainer.environments[0].row == rows[0]
    assert rollout.raw_scores.tolist() == [2.5, 0.5, 0.5]


def test_a_dict_of_environments_is_chosen_by_the_environment_column(tmp_path):
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "go"}], "environment": name}
                                 for name in ("counter", "echo")])

    def script(text, row):
        if "<tool_response>" in text:
            return "done"
        return call("increment", step=1) if "increment" in text else call("shout", text="hi")

    trainer, _ = _trainer(tmp_path, script, train_dataset=dataset, environment_factory={"counter": Counter, "echo": Echo},
                          reward_funcs=[lambda completions, **kw: [1.0] * len(completions)])
    rollout, samples = trainer.collector.collect(dataset.to_list())
    kinds = [type(e).__name__ for e in trainer.environments]
    assert kinds == ["Counter", "Counter", "Echo", "Echo"]
    assert [e.total for e in trainer.environments[:2]] == [1, 1] and trainer.environments[2].said == ["hi"]
    assert all("HI" in text for text in samples.completions[2:])
    bad = Dataset.from_list([{"prompt": [{"role": "user", "content": "go"}], "environment": "maze"}])
    with pytest.raises(ValueError, match="not among the environments"):
        trainer.collector.collect(bad.to_list())


# ------------------------------------------------------------------ rollout_func


def test_rollout_func_env_mask_and_extra_fields_reach_reward_functions(tmp_path):
    tokenizer = tool_tokenizer(HERMES)
    seen = {}

    def rollout_func(prompts, trainer):
        seen["trainer"] = trainer
        n = len(prompts)
        return {"prompt_ids": [[30, 31]] * n, "completion_ids": [[40, 41, 42, 1]] * n, "logprobs": [[-1.0] * 4] * n,
                "env_mask": [[1, 0, 0, 1]] * n, "trace": [f"t{i}" for i in range(n)]}

    def reward(completions, trace, env_mask, **kwargs):
        seen["trace"], seen["env_mask"] = trace, env_mask
        return [float(i) for i in range(len(completions))]

    trainer = RLOOTrainer(model=_model(tokenizer), reward_funcs=[reward], args=_config(tmp_path),
                          train_dataset=_dataset(), processing_class=tokenizer, rollout_func=rollout_func)
    rollout, _ = trainer.collector.collect(trainer.train_dataset.select(range(2)).to_list())
    assert seen["trainer"] is trainer and seen["trace"] == ["t0", "t1", "t2", "t3"]
    assert rollout.tool_mask[0].tolist() == [1, 0, 0, 1] and rollout.has_eos.all()
    assert rollout.loss_mask()[0].tolist() == [1, 0, 0, 1]

    with pytest.raises(ValueError, match="rollout_func must return keys"):
        trainer.multi_turn.rollout_func = lambda prompts, trainer: {"prompt_ids": [[1]], "completion_ids": [[2]]}
        trainer.collector.collect(trainer.train_dataset.select(range(2)).to_list())


# ------------------------------------------------------------------ training paths


def _weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("options", [dict(shared_prefix_forward=True), dict(use_peft=True)], ids=["shared_prefix", "lora"])
def test_training_with_tools_on_the_shared_prefix_and_lora_paths(tmp_path, options):
    peft_config = None
    if options.pop("use_peft", False):
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer, _ = _trainer(tmp_path, call_then_answer, tools=[add], peft_config=peft_config,
                          args=_config(tmp_path, max_steps=2, **options))
    before = _weights(trainer.model)
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert changed
    assert torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))


def count_up(text, row):
    return "done" if "<tool_response>" in text else call("increment", step=row + 1)


@pytest.mark.parametrize("script, options", [(call_then_answer, dict(tools=[add])),
                                             (count_up, dict(environment_factory=Counter, reward_funcs=None))],
                         ids=["tools", "environment"])
def test_exact_resume_with_tools(tmp_path, script, options):
    """Training 4 steps straight and 2 + resume 2 give the same weights (environments are not checkpointed:
    each trajectory's is reset from its row, so the resumed run's fresh instances behave the same; the
    scripted sampler is stateless, so the two runs see the same trajectories)."""
    straight, _ = _trainer(tmp_path / "a", script, **options, args=_config(tmp_path / "a", max_steps=4))
    straight.train()
    first, _ = _trainer(tmp_path / "b", script, **options, args=_config(tmp_path / "b", max_steps=4, save_steps=2))
    first.train()  # leaves checkpoint-2
    resumed, _ = _trainer(tmp_path / "b", script, **options,
                          args=_config(tmp_path / "b", max_steps=4, save_steps=2, overwrite_output_dir=False))
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "run" / "checkpoint-2"))
    for name, p in straight.model.named_parameters():
        assert torch.equal(p, resumed.model.get_parameter(name)), name


# ------------------------------------------------------------------ the real samplers


def _forced_ids(tokenizer, prompt_text):
    """What the forced model writes: a call on turn 1, an answer after a tool result; then EOS."""
    text = "ok" if "<tool_response>" in prompt_text else call("add", a=1, b=2)
    return tokenizer.encode(text) + [tokenizer.eos_token_id]


@pytest.mark.parametrize("keep_turn_cache", [True, False], ids=["kept cache", "re-prefill"])
def test_fast_sampler_logprobs_across_turns_match_the_training_pass(tmp_path, keep_turn_cache):
    """The fast sampler's own log-probs of turn 2, sampled after the tool tokens, are the trainer's log-probs of
    the same positions in the whole trajectory: the trusted pi_old is right across turns, with the cache kept
    across the call or the trajectory re-prefilled. Its tokens are forced (a tiny random model would not call a
    tool): a call on the first turn, an answer on the next; its log-probs are its own."""
    from rloo.generation.fast import FastSampler

    tokenizer = tool_tokenizer()

    class ForcedFastSampler(FastSampler):
        turns = 0

        def _decode_from(self, *args, **kwargs):  # once per turn on either path
            self.forced, self.step = _forced_ids(tokenizer, "<tool_response>" * self.turns), 0
            self.turns += 1
            return super()._decode_from(*args, **kwargs)

        def _next_token(self, logits, suppressed=None):
            token = torch.full((logits.shape[0],), self.forced[min(self.step, len(self.forced) - 1)])
            self.step += 1
            log_probs = torch.log_softmax(logits.float() / self.temperature, dim=-1)
            return token, log_probs.gather(1, token.unsqueeze(1)).squeeze(1)

    sampler = ForcedFastSampler(pad_token_id=0, eos_token_ids=[tokenizer.eos_token_id], max_new_tokens=200,
                                keep_turn_cache=keep_turn_cache)
    trainer = RLOOTrainer(model=_model(tokenizer), reward_funcs=[contains_answer], args=_config(tmp_path),
                          train_dataset=_dataset(), processing_class=tokenizer, sampler=sampler, tools=[add])
    sampled, episodes = trainer.collector.sample_rows(trainer.train_dataset.select(range(2)).to_list())
    assert episodes.tool_calls == 4 and sampled.logprobs_from_policy and sampler.turns == 2
    recomputed = trainer.collector.logprobs(trainer.model, sampled)
    model_tokens = (sampled.completion_mask * sampled.tool_mask).bool()
    assert (sampled.tool_mask == 0).any()
    torch.testing.assert_close(sampled.logprobs[model_tokens], recomputed[model_tokens], atol=1e-5, rtol=0)
    assert trainer.collector.trusted_sampler_logprobs(sampled) is not None  # fp32, one iteration: used as pi_old


def test_generate_sampler_with_tools_trains(tmp_path):
    """transformers' generate as the sampler (its prefix_allowed_tokens_fn forces the text), a tool call and a
    second turn, and an optimizer step that changes the weights."""
    tokenizer = tool_tokenizer()

    def allowed(batch_id, input_ids):
        text = tokenizer.decode(input_ids)
        prompt, _, written = text.rpartition("assistant: ")
        forced = _forced_ids(tokenizer, prompt)
        done = len(tokenizer.encode(written))
        return [forced[min(done, len(forced) - 1)]]

    args = _config(tmp_path, sampler="generate", generation_kwargs={"prefix_allowed_tokens_fn": allowed})
    alternating = lambda completions, **kwargs: [float(i % 2) for i in range(len(completions))]  # noqa: E731
    trainer = RLOOTrainer(model=_model(tokenizer), reward_funcs=[alternating], args=args, train_dataset=_dataset(),
                          processing_class=tokenizer, tools=[add])
    before = _weights(trainer.model)
    trainer.train()
    last = [entry for entry in trainer.state.log_history if "tools/call_frequency" in entry][-1]
    assert last["tools/call_frequency"] == 1.0 and last["tools/failure_frequency"] == 0.0
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_evaluation_runs_the_trajectories_too(tmp_path):
    trainer, sampler = _trainer(tmp_path, call_then_answer, tools=[add], eval_dataset=_dataset(2))
    metrics = trainer.evaluate()
    assert len(sampler.calls) == 2  # the first turn and the turn after the tool results
    # Half the trajectories call add(1, 2): their messages hold the answers "1" (the argument) and "3" (the result).
    assert metrics["eval/reward"] == pytest.approx(0.5)
    # Training's tools/ metrics on the eval trajectories: one call in half of them, none failed.
    assert metrics["eval/tools/call_frequency"] == pytest.approx(0.5)
    assert metrics["eval/tools/failure_frequency"] == 0.0


# ------------------------------------------------------------------ the CLI


def test_cli_yaml_takes_tools_and_an_environment_factory(tmp_path, monkeypatch):
    """`tools: file.py:fn` and `environment_factory: file.py:Class` in YAML reach the trainer; the environment's
    get_reward stands in for --reward_funcs."""
    from rloo.cli import main
    from rloo.trainer import RLOOTrainer as Trainer

    tokenizer = tool_tokenizer()
    model_dir = tmp_path / "model"
    _model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps({"prompt": [{"role": "user", "content": f"{a}+1?"}]})
                                                   for a in range(4)))
    (tmp_path / "my_tools.py").write_text(
        "def add(a: int, b: int) -> int:\n    '''Add.\n\n    Args:\n        a: first\n        b: second\n    '''\n"
        "    return a + b\n")
    (tmp_path / "my_env.py").write_text(
        "class Counter:\n    def reset(self, **row):\n        self.total = 0\n"
        "    def increment(self, step: int) -> int:\n        '''Add.\n\n        Args:\n            step: how much\n        '''\n"
        "        self.total += step\n        return self.total\n    def get_reward(self):\n        return float(self.total)\n")
    (tmp_path / "run.yaml").write_text(
        f"model_name_or_path: {model_dir}\ndataset_name: {tmp_path / 'data.jsonl'}\noutput_dir: {tmp_path / 'out'}\n"
        f"tools: {tmp_path / 'my_tools.py'}:add\nenvironment_factory: {tmp_path / 'my_env.py'}:Counter\n"
        "max_tool_calling_iterations: 2\nper_device_train_batch_size: 4\nnum_generations: 2\nmax_steps: 1\n"
        "max_completion_length: 8\nsave_steps: 0\n")
    built = []
    monkeypatch.setattr(Trainer, "train", lambda self, resume_from_checkpoint=None: built.append(self))
    main(["train", "--config", str(tmp_path / "run.yaml")])
    trainer = built[0]
    assert [tool.__name__ for tool in trainer.tools] == ["add", "increment"]  # then the environment's, as TRL
    assert [fn.name for fn in trainer.reward_functions] == ["Counter"]
    assert trainer.reward_func_names == ["Counter"] and trainer.reward_weights.tolist() == [1.0]  # TRL's attributes
    assert [s["function"]["name"] for s in trainer.multi_turn.schemas[None]] == ["add", "increment"]
    assert trainer.max_tool_calling_iterations == 2


# ------------------------------------------------------------------ environment-owned data


class GuessWord:
    def reset(self, **row):
        self.row = row
        return "Guess the word."

    def get_reward(self):
        return 1.0


def test_an_environment_can_own_the_data(tmp_path):
    """No train_dataset: max_steps sets the length, reset's text is the prompt, reset gets no placeholder."""
    def script(text, row):
        assert text.endswith("user: Guess the word.<eos>\nassistant: ")
        return "word" * (row + 1)

    trainer, _ = _trainer(tmp_path, script, environment_factory=GuessWord, reward_funcs=None, train_dataset=None,
                          args=_config(tmp_path, max_steps=2))
    trainer.train()
    assert trainer.global_step == 2 and trainer.environments[0].row == {}
    with pytest.raises(ValueError, match="max_steps"):
        _trainer(tmp_path, script, environment_factory=GuessWord, reward_funcs=None, train_dataset=None,
                 args=_config(tmp_path, max_steps=-1))
    with pytest.raises(ValueError, match="requires a `train_dataset`"):
        _trainer(tmp_path, script, environment_factory={"a": GuessWord}, reward_funcs=None, train_dataset=None)
    routed = Dataset.from_list([{"environment": "a"}, {"environment": "a"}])
    trainer, _ = _trainer(tmp_path, script, environment_factory={"a": GuessWord}, reward_funcs=None,
                          train_dataset=routed)
    trainer.collector.collect(trainer.train_dataset.to_list())
    assert trainer.environments[0].row == {}


# ------------------------------------------------------------------ dynamic sampling and async rollouts


def test_dynamic_sampling_with_tools_keeps_each_trajectory_with_its_masks_and_turns(tmp_path):
    """Prompts 0+1 and 2+3 call the tool in both generations (zero spread, dropped while other groups differ);
    the others call in one generation of two. The rollout assembled over rounds keeps, row by row, the tool
    mask, the score and the logged turns of the same trajectory."""
    def script(text, row):
        if "<tool_response>" in text:
            return "done"
        return call("add", a=1, b=2) if ("0+1?" in text or "2+3?" in text or row % 2 == 0) else "no tool"

    def used_the_tool(completions, **kwargs):
        return [float(any(m["role"] == "tool" for m in c)) for c in completions]

    trainer, _ = _trainer(tmp_path, script, tools=[add], reward_funcs=[used_the_tool], train_dataset=_dataset(8),
                          args=_config(tmp_path, dynamic_sampling=True, dynamic_sampling_max_rounds=3,
                                       log_completions=True, num_completions_to_print=4))
    seen = []
    original = trainer.learner.step
    trainer.learner.step = lambda batch: seen.append(batch) or original(batch)
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert rows and all(row["used_the_tool"] == float(any(m["role"] == "tool" for m in row["completion"])) for row in rows)
    assert seen
    for batch in seen:
        called = (batch.completion_mask.bool() & ~batch.tool_mask.bool()).any(dim=1)  # tool tokens present
        assert called.tolist() == (batch.advantages > 0).tolist()  # one caller per kept group, rewarded 1
    last = [entry for entry in trainer.state.log_history if "dynamic_sampling/dropped_frac" in entry][-1]
    assert last["dynamic_sampling/dropped_frac"] > 0 and last["tools/call_frequency"] > 0


class WhereRun:
    """An environment noting, in `record_to`, the process and thread of every reset and which instance."""

    record_to = None

    def reset(self, **row):
        with open(WhereRun.record_to, "a") as handle:
            handle.write(json.dumps([os.getpid(), threading.current_thread().name, id(self)]) + "\n")

    def double(self, x: int) -> int:
        """Double a number.

        Args:
            x: the number
        """
        self.doubled = 2 * x
        return self.doubled

    def get_reward(self):
        return float(getattr(self, "doubled", 0))


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_async_rollouts_with_an_environment_run_the_sampler_s_own_environments(tmp_path, worker, monkeypatch):
    import functools

    from rloo.rollout.async_rollouts import AsyncRollouts

    monkeypatch.setattr("rloo.rollout.async_rollouts.AsyncRollouts", functools.partial(AsyncRollouts, worker=worker))
    monkeypatch.setattr(WhereRun, "record_to", str(tmp_path / "resets.jsonl"))

    def script(text, row):
        return "done" if "<tool_response>" in text else (call("double", x=row + 1) if row % 2 == 0 else "no")

    trainer, _ = _trainer(tmp_path, script, environment_factory=WhereRun, reward_funcs=None,
                          args=_config(tmp_path, async_rollouts=True, max_steps=3))
    trainer_instances = {id(e) for pool in trainer.multi_turn.environment_pool.values() for e in pool}
    trainer.train()
    resets = [json.loads(line) for line in (tmp_path / "resets.jsonl").read_text().splitlines()]
    assert len(resets) >= 3 * 4  # every rollout's trajectories reset an environment
    if worker == "process":
        assert all(pid != os.getpid() for pid, _, _ in resets)
    else:
        assert all(name.startswith("rloo-sampler") for _, name, _ in resets)
        assert not {instance for _, _, instance in resets} & trainer_instances  # the trainer's are never used
    logged = [entry for entry in trainer.state.log_history if "tools/call_frequency" in entry]
    assert logged and all(entry["tools/call_frequency"] == pytest.approx(0.5) for entry in logged)
    assert all(entry["reward"] > 0 for entry in logged)  # get_reward of the sampler's environments scored them


def test_rollout_func_with_async_rollouts_is_refused(tmp_path):
    tokenizer = tool_tokenizer()
    with pytest.raises(ConfigError, match="rollout_func .* async_rollouts=False"):
        RLOOTrainer(model=_model(tokenizer), reward_funcs=[contains_answer],
                    args=_config(tmp_path, async_rollouts=True), train_dataset=_dataset(),
                    processing_class=tokenizer, rollout_func=lambda prompts, trainer: {})


# ------------------------------------------------------------------ rloo eval


def test_rloo_eval_runs_the_config_s_environment(tmp_path, capsys):
    """`rloo eval` with a config naming an environment_factory: its environments are reset for every
    trajectory and their get_reward scores them (eval/rewards/<class>), as in training."""
    import textwrap

    from rloo.cli import main

    tokenizer = tool_tokenizer()
    _model(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": [{"role": "user", "content": f"{a}?"}]})
                                                      for a in range(3)))
    (tmp_path / "env.py").write_text(textwrap.dedent(f"""\
        class Noted:
            def reset(self, **row):
                with open({str(tmp_path / "resets.txt")!r}, "a") as handle:
                    handle.write(row["prompt"][-1]["content"] + "\\n")

            def note(self, text: str) -> str:
                \"\"\"Note a text.

                Args:
                    text: the text
                \"\"\"
                return text

            def get_reward(self):
                return 0.25
        """))
    (tmp_path / "run.yaml").write_text(textwrap.dedent(f"""\
        dataset_name: {tmp_path / "prompts.jsonl"}
        environment_factory: {tmp_path / "env.py"}:Noted
        output_dir: {tmp_path / "out"}
        per_device_train_batch_size: 4
        num_generations: 2
        max_completion_length: 4
        """))
    main(["eval", "--model", str(tmp_path / "model"), "--config", str(tmp_path / "run.yaml")])
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert results["eval/rewards/Noted/mean"] == pytest.approx(0.25) and results["eval/reward"] == pytest.approx(0.25)
    assert sorted((tmp_path / "resets.txt").read_text().split()) == ["0?", "0?", "1?", "1?", "2?", "2?"]


# ------------------------------------------------------------------ bad inputs (docs/errors.md, "Tools and environments")


def test_tool_and_environment_inputs_are_refused_by_name(tmp_path):

    from rloo.builders import build_multi_turn
    from rloo.rollout.multi_turn import MultiTurnRollout
    from rloo.tools import check_tool_template, tool_schemas
    from rloo.toy import build_char_tokenizer

    with pytest.raises(ConfigError, match="max_tool_calling_iterations must be >= 0"):
        _config(tmp_path, max_tool_calling_iterations=-1)
    with pytest.raises(ConfigError, match="tool_call_timeout must be > 0 seconds"):
        _config(tmp_path, tool_call_timeout=0)
    with pytest.raises(ConfigError, match="two tools are named 'add'"):
        tool_schemas([add, add])
    with pytest.raises(ConfigError, match="tool 5 is not callable"):
        tool_schemas([5])
    no_template = build_char_tokenizer()
    no_template.chat_template = None
    with pytest.raises(ConfigError, match="tools need a chat template"):
        check_tool_template(no_template, None)

    class NoReset:
        pass

    with pytest.raises(ConfigError, match="the environment NoReset .* has no `reset` method"):
        MultiTurnRollout(None, 8, 8, None, {0}, environment_factories={None: NoReset})
    with pytest.raises(ConfigError, match="give either rollout_func or tools / environment_factory, not both"):
        build_multi_turn(_config(tmp_path), None, None, [add], None, lambda prompts, trainer: {})

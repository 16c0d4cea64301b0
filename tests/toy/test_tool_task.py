"""The toy tool task (rloo.toy.tool_task): the `add` tool runs during rollouts, its tokens are out of the
loss, and the reward reads the final answer, which only the tool's result makes right.

The sampler is scripted (a tiny random model would never write the call): turn 1 of the first trajectory of
each prompt calls `add` with the prompt's operands, the others answer "0"; a turn that follows a tool
result copies the number inside `<tool_response>`. So a trajectory is right only if the tool really ran.
"""

import re

import pytest
import torch

from rloo import RLOOConfig, RLOOTrainer
from rloo.generation.base import batch_from_token_lists
from rloo.rewards import exact_match
from rloo.tools import tool_schemas
from rloo.toy import build_tiny_model
from rloo.toy.tool_task import add, build_tool_tokenizer, evaluate_with_tool, tool_addition_split, tool_exchange_text


class CopyingSampler:
    """Turn 1: trajectory k=0 of each prompt calls add(a, b) as the chat template writes it, others answer "0".
    After a tool result: the number in the last `<tool_response>`. Every turn ends with EOS."""

    def __init__(self, tokenizer):
        self.tokenizer, self.eos_token_ids = tokenizer, [tokenizer.eos_token_id]

    def sample(self, model, prompts, num_generations):
        completions = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt)
            for k in range(num_generations):
                completions.append(self.tokenizer.encode(self.reply(text, k), add_special_tokens=False)
                                   + [self.tokenizer.eos_token_id])
        batch = batch_from_token_lists(prompts, completions, [[-0.5] * len(c) for c in completions], num_generations,
                                       self.tokenizer.pad_token_id, self.eos_token_ids)
        batch.logprobs_from_policy = False
        return batch

    def reply(self, text, k):
        results = re.findall(r"<tool_response>(.*?)</tool_response>", text)
        if results:
            return results[-1]
        if k > 0:
            return "0"
        a, b = re.findall(r"user: (\d+)\+(\d+)=", text)[-1]
        _, exchange = tool_exchange_text(self.tokenizer, [{"role": "user", "content": f"{a}+{b}="}], "")
        return exchange.split("<eos>")[0]  # the call, up to the end of the turn

    def on_optimizer_step(self, model):
        pass


def _trainer(tmp_path, tools):
    tokenizer = build_tool_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    train, _ = tool_addition_split(8, 2, seed=0)
    config = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                        max_completion_length=96, learning_rate=1e-3, beta=0.0, max_steps=2, logging_steps=1,
                        save_steps=0, seed=0, overwrite_output_dir=True, max_tool_calling_iterations=1, report_to="none")
    return RLOOTrainer(model, reward_funcs=exact_match, args=config, train_dataset=train, processing_class=tokenizer,
                       tools=tools, sampler=CopyingSampler(tokenizer))


def test_the_tool_runs_its_tokens_are_context_and_the_reward_reads_the_final_answer(tmp_path):
    trainer = _trainer(tmp_path, tools=[add])
    rows = trainer.train_dataset.select(range(2)).to_list()
    sampled, episodes = trainer.collector.sample_rows(rows)
    tokenizer = trainer.collector.tokenizer
    for row, messages in zip(rows, episodes.messages[::2]):  # k = 0: called the tool
        a, b = (int(x) for x in row["prompt"][0]["content"].rstrip("=").split("+"))
        assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
        assert messages[1]["content"] == str(a + b) == messages[2]["content"] == row["answer"]
    assert all([m["role"] for m in messages] == ["assistant"] for messages in episodes.messages[1::2])
    assert episodes.tool_calls == 2 and episodes.metrics()["tools/call_frequency"] == pytest.approx(0.5)
    # The tool's tokens (from "\ntool: <tool_response>" to the next "assistant: ") are masked out of the loss.
    response_id = tokenizer.convert_tokens_to_ids("<tool_response>")
    for row in (0, 2):
        ids, mask = sampled.completion_ids[row].tolist(), sampled.tool_mask[row].tolist()
        at = ids.index(response_id)
        assert mask[at] == 0 and mask[0] == 1 and mask[int(sampled.completion_mask[row].sum()) - 1] == 1
        tool_span = [i for i, m in enumerate(mask) if m == 0 and sampled.completion_mask[row, i]]
        assert tokenizer.decode([ids[i] for i in tool_span]).startswith("\ntool: <tool_response>" + rows[row // 2]["answer"])
    model_tokens = sampled.completion_mask * sampled.tool_mask
    assert model_tokens.sum() < sampled.completion_mask.sum()
    # The reward reads the final answer: 1 for the trajectories that used the tool, 0 for the direct "0".
    rewards = exact_match([m for m in episodes.messages], [r["answer"] for r in rows for _ in range(2)])
    assert rewards == [1.0, 0.0, 1.0, 0.0]
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "tools/call_frequency" in entry]
    assert logged and all(entry["tools/call_frequency"] > 0 for entry in logged)
    rewards_logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert rewards_logged and all(entry["reward"] == pytest.approx(0.5) for entry in rewards_logged)


def test_without_tools_the_call_is_never_answered_and_earns_nothing(tmp_path):
    """The control: tools= not passed, the call is plain text ending the trajectory, and no row is right."""
    trainer = _trainer(tmp_path, tools=None)
    rows = trainer.train_dataset.select(range(2)).to_list()
    sampled, episodes = trainer.collector.sample_rows(rows)
    assert episodes is None and sampled.tool_mask is None  # one turn, all of it the model's
    texts = trainer.collector.tokenizer.batch_decode(sampled.completion_ids, skip_special_tokens=True)
    assert texts[0].startswith("<tool_call>") and "<tool_response>" not in texts[0]
    assert exact_match(texts, [r["answer"] for r in rows for _ in range(2)]) == [0.0] * 4


def test_evaluate_with_tool_runs_the_tool_on_a_model_that_calls_it():
    tokenizer = build_tool_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    _, held_out = tool_addition_split(4, 4, seed=1)
    figures = evaluate_with_tool(model, tokenizer, held_out, max_new_tokens=4)
    assert figures == {"accuracy": 0.0, "tool_call_rate": 0.0}  # a random model neither calls nor adds


def test_evaluate_with_tool_runs_the_tool_and_scores_the_second_turn():
    """Every first turn calls add (k = 0 of the scripted sampler): right only when the tool's result comes back."""
    tokenizer = build_tool_tokenizer()
    _, held_out = tool_addition_split(4, 4, seed=1)
    sampler = CopyingSampler(tokenizer)
    assert evaluate_with_tool(None, tokenizer, held_out, sampler=sampler) == {"accuracy": 1.0, "tool_call_rate": 1.0}
    assert evaluate_with_tool(None, tokenizer, held_out, sampler=sampler, use_tool=False) == {
        "accuracy": 0.0, "tool_call_rate": 1.0}


def test_rloo_demo_task_add_tool_reaches_the_tool_demo(capsys):
    from rloo.toy.demo import main

    with pytest.raises(SystemExit):
        main(["--task", "add_tool", "--help"])
    assert "rloo demo --task add_tool" in capsys.readouterr().out


def test_operands_have_exactly_the_digits_asked_so_copying_is_a_fixed_offset():
    train, held_out = tool_addition_split(40, 10, seed=0, digits=4)
    prompts = [row["prompt"][0]["content"] for row in [*train, *held_out]]
    assert all(len(a) == len(b) == 4 for a, b in (p.rstrip("=").split("+") for p in prompts))
    assert all(len(answer) == 4 for answer in [*train["answer"], *held_out["answer"]])
    assert not set(map(str, train["prompt"])) & set(map(str, held_out["prompt"]))
    tokenizer = build_tool_tokenizer()
    offsets = set()
    for row in train.select(range(10)):
        prompt_text, exchange = tool_exchange_text(tokenizer, row["prompt"], row["answer"])
        text = prompt_text + exchange
        a = row["prompt"][0]["content"].split("+")[0]
        offsets.add((text.index('"a": ' + a) - text.index("user: " + a),
                     text.rindex(row["answer"]) - text.index("<tool_response>" + row["answer"])))
    assert len(offsets) == 1  # each digit of the call and of the answer is the digit a fixed number of characters back


def test_the_warm_start_is_cached_and_reused(tmp_path, capsys):
    from rloo.toy.tool_task import warm_started_tool_model

    train, _ = tool_addition_split(16, 2, seed=0)
    tiny = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 32}
    first, _ = warm_started_tool_model(train, steps=2, batch_size=4, model_kwargs=tiny, cache_dir=tmp_path)
    assert "loaded from cache" not in capsys.readouterr().out
    again, tokenizer = warm_started_tool_model(train, steps=2, batch_size=4, model_kwargs=tiny, cache_dir=tmp_path)
    assert "loaded from cache" in capsys.readouterr().out
    # The reloaded tokenizer encodes as the built one (a saved and reloaded one dropped every space and newline).
    text = tokenizer.apply_chat_template(train[0]["prompt"], tools=tool_schemas([add]), add_generation_prompt=True,
                                         tokenize=False)
    assert tokenizer.encode(text) == build_tool_tokenizer().encode(text)
    other, _ = warm_started_tool_model(train, steps=3, batch_size=4, model_kwargs=tiny, cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 2 and tokenizer.chat_template == build_tool_tokenizer().chat_template
    for name, weight in first.state_dict().items():
        assert torch.equal(weight, again.state_dict()[name])
    assert any(not torch.equal(w, other.state_dict()[n]) for n, w in first.state_dict().items())


def test_the_warm_start_cache_key_follows_the_rows_the_model_imitates(tmp_path, capsys, monkeypatch):
    """Bare rows written another way (here: the true sum, as they once were) never load the cached model."""
    import rloo.toy.tool_task as tool_task

    train, _ = tool_addition_split(16, 2, seed=0)
    tiny = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 32}
    tool_task.warm_started_tool_model(train, steps=2, batch_size=4, model_kwargs=tiny, cache_dir=tmp_path)
    monkeypatch.setattr(tool_task, "_wrong_guess", lambda rng, prompt, total: str(total))
    capsys.readouterr()
    tool_task.warm_started_tool_model(train, steps=2, batch_size=4, model_kwargs=tiny, cache_dir=tmp_path)
    assert "loaded from cache" not in capsys.readouterr().out and len(list(tmp_path.iterdir())) == 2


def test_answer_rows_teach_the_final_copy_alone():
    from rloo.toy.tool_task import warm_start_rows

    tokenizer = build_tool_tokenizer()
    train, _ = tool_addition_split(20, 2, seed=0)
    plain = warm_start_rows(tokenizer, train, 0.5, seed=0, answer_rows=False)
    rows = warm_start_rows(tokenizer, train, 0.5, seed=0, answer_rows=True)
    tool_rows = [i for i, completion in enumerate(plain["answer"]) if completion.startswith("<tool_call>")]
    assert 0 < len(tool_rows) < len(plain) and len(rows) == len(plain) + len(tool_rows)
    copies = [(p, a) for p, a in zip(rows["prompt"], rows["answer"]) if p.endswith("</tool_response><eos>\nassistant: ")]
    assert len(copies) == len(tool_rows)
    for prompt, answer in copies:  # the completion is the tool's result, which the prompt holds
        assert "<tool_response>" + answer + "</tool_response>" in prompt and answer.isdigit()


def test_the_bare_rows_answer_with_a_guess_that_is_never_the_sum():
    """Bare rows that wrote the sum let a warm start learn four-digit addition itself (seed 2: 0.89 held-out
    accuracy without calling); their guesses are four-digit numbers, never the sum, and seeded."""
    from rloo.toy.tool_task import warm_start_rows

    tokenizer = build_tool_tokenizer()
    train, _ = tool_addition_split(400, 2, seed=2)
    rows = warm_start_rows(tokenizer, train, 0.4, seed=2)
    sums = {tokenizer.apply_chat_template(p, tools=tool_schemas([add]), add_generation_prompt=True, tokenize=False): a
            for p, a in zip(train["prompt"], train["answer"])}
    bare = [(sums[p], a) for p, a in zip(rows["prompt"], rows["answer"]) if p in sums and not a.startswith("<tool_call>")]
    assert len(bare) > 150
    assert all(len(guess) == 4 and guess.isdigit() and guess != total for total, guess in bare)
    assert len({guess for _, guess in bare}) > 100  # guesses, not one constant
    assert warm_start_rows(tokenizer, train, 0.4, seed=2)["answer"] == rows["answer"]
    # The same rows show the tool as with the true sums (the guesses have their own random stream).
    shown = [a.startswith("<tool_call>") for p, a in zip(rows["prompt"], rows["answer"]) if p in sums]
    assert sum(shown) == len(train) - len(bare)


class SwappingSampler(CopyingSampler):
    """CopyingSampler whose call swaps the operands (a wrong copy) and whose answer after a result is "0"."""

    def reply(self, text, k):
        if "<tool_response>" in text:
            return "0"
        a, b = re.findall(r"user: (\d+)\+(\d+)=", text)[-1]
        _, exchange = tool_exchange_text(self.tokenizer, [{"role": "user", "content": f"{b}+{a}="}], "")
        return exchange.split("<eos>")[0]


def test_copy_accuracy_scores_the_call_s_operands_and_the_copied_result_apart():
    from rloo.toy.tool_task import copy_accuracy

    tokenizer = build_tool_tokenizer()
    _, held_out = tool_addition_split(4, 4, seed=1)
    assert copy_accuracy(None, tokenizer, held_out, sampler=CopyingSampler(tokenizer)) == {
        "call_rate": 1.0, "operands_right": 1.0, "answer_copied": 1.0}
    assert copy_accuracy(None, tokenizer, held_out, sampler=SwappingSampler(tokenizer)) == {
        "call_rate": 1.0, "operands_right": 0.0, "answer_copied": 0.0}


class RecordingSampler(CopyingSampler):
    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.prompts = []

    def sample(self, model, prompts, num_generations):
        self.prompts.append([list(p) for p in prompts])
        return super().sample(model, prompts, num_generations)


def test_the_demo_s_control_sees_the_same_prompts_as_the_run_with_tools(tmp_path):
    """The warm start saw only prompts that list the tool: the control must too, or it measures a new prompt."""
    from rloo.toy.tool_demo import build_parser, demo_config

    tokenizer = build_tool_tokenizer()
    train, _ = tool_addition_split(8, 2, seed=0)
    seen = {}
    for arm in ([], ["--no_tools"]):
        options = build_parser().parse_args(["--output_dir", str(tmp_path / f"run{len(arm)}"), "--batch_size", "4",
                                             "--num_generations", "2", "--episodes", "4", *arm])
        config, tools = demo_config(options)
        model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
        sampler = RecordingSampler(tokenizer)
        trainer = RLOOTrainer(model, reward_funcs=exact_match, args=config, train_dataset=train, processing_class=tokenizer,
                              tools=tools, sampler=sampler)
        trainer.collector.sample_rows(trainer.train_dataset.select(range(2)).to_list())
        seen[bool(arm)] = sampler.prompts[0]
    assert (tools, seen[True]) == (None, seen[False])
    assert tokenizer.decode(seen[True][0]).startswith("system: tools add")

"""The fast sampler's kept cache across tool calls (`generation.kept_turns`) gives the re-prefill path's rollout.

A multi-turn rollout on a tiny model with the `add` tool, through the trainer's collector, once with each
trajectory's KV cache kept across its calls (only the tool message's tokens run at a later turn) and once with
every later turn re-prefilled: the trajectories' ids, masks and the sampler's log-probs must agree, on a rotary
model (Llama) and on GPT-2 (absolute positions: a token at a wrong position changes every log-prob), with rows
that finish at different turns (an answer, the length limit) and left-padded prompts of different lengths.
A tiny random model does not call tools, so the calls are forced (`ScriptedTurns`); the log-probs are its own
and the free turns are its own greedy (or sampled) tokens.
"""

import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from conftest import gpt2_model
from rloo import RLOOConfig, RLOOTrainer
from rloo.generation import fast
from rloo.generation.fast import FastSampler
from rloo.generation.kept_turns import packing_index
from rloo.generation.static_decode import make_step
from rloo.toy import build_tiny_model

sys.path.insert(0, str(Path(__file__).parent.parent / "rollout"))
from tool_chat import call, tool_tokenizer  # noqa: E402


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


CALL, ANSWER, FREE = "call", "answer", "free"
# Each trajectory's turns (rows p*K + k, K = 2): a forced call, a forced answer, or the model's own free tokens (to
# its EOS or the length limit). Rows finish at turns 1, 2, 3 and 4.
PLAN = [[CALL, CALL, FREE], [ANSWER], [CALL, ANSWER], [CALL, FREE], [FREE], [CALL, CALL, CALL, ANSWER]]


def turn_rows(turn: int) -> list[int]:
    """The trajectories sampled at `turn`: those whose turns before it were all calls."""
    return [i for i, plan in enumerate(PLAN) if len(plan) > turn and all(t == CALL for t in plan[:turn])]


class ScriptedTurns(FastSampler):
    """The fast sampler with the tokens of PLAN's forced turns imposed; the free rows keep the drawn token (never
    `<tool_call>`; its log-prob is still the unfiltered softmax's)."""

    def __init__(self, tokenizer, **kwargs):
        super().__init__(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id], **kwargs)
        eos = [tokenizer.eos_token_id]
        self.texts = {CALL: tokenizer.encode(call("add", a=1, b=2)) + eos, ANSWER: tokenizer.encode("ok 3") + eos}
        self.turn, self.no_call = 0, tokenizer.convert_tokens_to_ids("<tool_call>")

    def _decode_from(self, *args, **kwargs):  # once per turn on either path
        self.forced = [self.texts.get(PLAN[i][self.turn]) for i in turn_rows(self.turn)]
        self.step, self.turn = 0, self.turn + 1
        return super()._decode_from(*args, **kwargs)

    def _next_token(self, logits, suppressed=None):
        token, _ = super()._next_token(logits, self.no_call)  # a free turn never opens a call of its own
        for row, forced in enumerate(self.forced):
            if forced is not None:
                token[row] = forced[min(self.step, len(forced) - 1)]
        self.step += 1
        log_probs = torch.log_softmax(logits.float() / self.temperature, dim=-1)
        return token, log_probs.gather(1, token.unsqueeze(1)).squeeze(1)


def _models(tokenizer):
    llama = build_tiny_model(tokenizer, arch="llama", seed=1, hidden_size=32, num_layers=2, num_heads=2,
                             num_kv_heads=1, intermediate_size=64, max_position_embeddings=2048)
    gpt2 = gpt2_model(tokenizer, n_positions=2048)
    with torch.no_grad():
        for model in (llama, gpt2):
            model.get_input_embeddings().weight.mul_(4.0)  # a peaked distribution: a wrong position shows
        for layer in llama.model.layers:  # sharp attention: a rotary position off by one shows too
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.mul_(4.0)
    return {"llama (rotary)": llama, "gpt2 (absolute positions)": gpt2}


def _rollout(tmp_path, model, tokenizer, keep_turn_cache, do_sample, stop_strings, **options):
    """The trajectories of 3 prompts x K=2 and the forward calls' input widths, with a fixed seed."""
    sampler = ScriptedTurns(tokenizer, max_new_tokens=64, do_sample=do_sample, keep_turn_cache=keep_turn_cache,
                            **options)
    config = RLOOConfig(output_dir=str(tmp_path / f"run{keep_turn_cache}"), per_device_train_batch_size=6,
                        num_generations=2, max_completion_length=400, beta=0.0, max_steps=1, save_steps=0, seed=0,
                        overwrite_output_dir=True, stop_strings=stop_strings, report_to=[])
    prompts = ["1+2?", "what is 11+22 then?", "3?"]  # different lengths: left padding
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts])
    trainer = RLOOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)], args=config,
                          train_dataset=dataset, processing_class=tokenizer, sampler=sampler, tools=[add])
    widths = []
    hook = model.register_forward_hook(lambda m, a, kw, out: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    torch.manual_seed(0)
    sampled, episodes = trainer.collector.sample_rows(dataset.to_list())
    hook.remove()
    assert sampler.turn == 4
    return trainer, sampled, episodes, widths


@pytest.mark.parametrize("name", ["llama (rotary)", "gpt2 (absolute positions)"])
@pytest.mark.parametrize("do_sample,stop_strings", [(False, None), (True, ["</tool_call>"])],
                         ids=["greedy", "sampled, stop string"])
def test_kept_cache_gives_the_re_prefill_path_s_tokens_and_logprobs(tmp_path, name, do_sample, stop_strings):
    tokenizer = tool_tokenizer()
    model = _models(tokenizer)[name]
    trainer, kept, episodes, kept_widths = _rollout(tmp_path, model, tokenizer, True, do_sample, stop_strings)
    _, again, _, again_widths = _rollout(tmp_path, model, tokenizer, False, do_sample, stop_strings)

    assert episodes.tool_calls == 7
    for field in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask", "has_eos"):
        assert torch.equal(getattr(kept, field), getattr(again, field)), field
    torch.testing.assert_close(kept.logprobs, again.logprobs, atol=2e-5, rtol=0)
    assert (kept.tool_mask == 0).any() and not kept.has_eos.all()  # tool tokens, and a row cut at the length limit
    # The sampler's log-probs are the training pass's at the model's tokens.
    model_tokens = (kept.completion_mask * kept.tool_mask).bool()
    recomputed = trainer.collector.logprobs(trainer.model, kept)
    torch.testing.assert_close(kept.logprobs[model_tokens], recomputed[model_tokens], atol=2e-5, rtol=0)

    # The kept cache runs the tool message's tokens at a later turn; the re-prefill path the whole trajectory.
    tool_message = int((kept.completion_mask[2] * (1 - kept.tool_mask[2])).sum())  # row 2 made one call
    kept_prefills, again_prefills = [w for w in kept_widths if w > 1], [w for w in again_widths if w > 1]
    assert kept_prefills[:2] == again_prefills[:2]  # turn 1: the shared head, then the prompts' tails
    # (+1: the end token a stop string cut from the call turn; the tool message's tokens start with it)
    assert len(kept_prefills) == 5 and max(kept_prefills[2:]) <= tool_message + 1
    assert sum(again_prefills[2:]) > 3 * kept.prompt_ids.shape[1]  # the re-prefill path: each trajectory again


@pytest.mark.parametrize("decode_step", ["static", pytest.param("graph", marks=pytest.mark.cuda)])
def test_kept_cache_after_the_static_decode_step(tmp_path, monkeypatch, decode_step):
    """The static step (CUDA's, here on CPU; graphed on CUDA) replaces the cache's layers and decodes past the rows'
    ends between its checks (eos_check_every=4): the kept cache reads its buffers and drops the columns fed after
    each end."""
    tokenizer = tool_tokenizer()
    model = build_tiny_model(tokenizer, seed=1, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, max_position_embeddings=2048)  # Qwen2: takes the static step
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(4.0)
    made = []
    monkeypatch.setattr(fast, "make_step", lambda *args, **kwargs: made.append(1) or make_step(*args, **kwargs))
    _, kept, _, _ = _rollout(tmp_path, model, tokenizer, True, False, None, decode_step=decode_step,
                             eos_check_every=4)
    assert len(made) == 4  # every turn ran the static step
    monkeypatch.undo()
    _, again, _, _ = _rollout(tmp_path, model, tokenizer, False, False, None)
    for field in ("completion_ids", "completion_mask", "tool_mask", "has_eos"):
        assert torch.equal(getattr(kept, field), getattr(again, field)), field
    torch.testing.assert_close(kept.logprobs, again.logprobs, atol=2e-5, rtol=0)


def test_packing_index_right_aligns_each_row_s_kept_columns():
    mask = torch.tensor([[0, 1, 1, 0, 1, 1],
                         [1, 1, 0, 0, 1, 0],
                         [0, 0, 1, 1, 1, 1]])
    source, packed = packing_index(mask, torch.tensor([3, 2, 4]))
    assert packed.tolist() == [[0, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1]]
    assert source.tolist() == [[0, 1, 2, 4], [0, 0, 0, 1], [2, 3, 4, 5]]

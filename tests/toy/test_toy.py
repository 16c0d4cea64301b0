"""Tests of rloo.toy: the offline tokenizer, tiny models, tasks, rewards, warm start and cache."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
import transformers
from transformers.modeling_outputs import CausalLMOutputWithPast

from rloo import toy
from rloo.passes.logprobs import position_ids_from_mask
from rloo.toy import warm_start
from rloo.toy.early_stopping import TARGET_WINDOW, sequence_exact_match

# A model small enough that a few training steps take well under a second.
TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
        "max_position_embeddings": 64}


@pytest.fixture(scope="module")
def tok() -> transformers.PreTrainedTokenizerFast:
    return toy.build_char_tokenizer()


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --- tokenizer ----------------------------------------------------------------------------------

ROUND_TRIP = ["12+34=", "reverse:abc=", "Hello, World! (a.b) [c;d] 'e' \"f\" #_<>?", "a . b , c", "x\ny  z", ""]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok, text):
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, nothing added (no BOS/EOS)
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text


def test_special_ids_and_settings(tok):
    assert tok.pad_token == "<pad>" and tok.pad_token_id == 0
    assert (tok.eos_token, tok.bos_token, tok.unk_token) == ("<eos>", "<bos>", "<unk>")
    assert tok.padding_side == "left"
    assert tok.model_max_length == 1024
    assert tok("é")["input_ids"] == [tok.unk_token_id]
    # Digits, both cases, space, newline and the punctuation are all single tokens.
    assert len(tok) == 6 + len(toy.CHARACTERS)


def test_think_tags_are_single_special_tokens(tok):
    ids = tok("<think>ab</think>cd")["input_ids"]
    think, end_think = tok.convert_tokens_to_ids(["<think>", "</think>"])
    assert ids[0] == think and ids[3] == end_think and len(ids) == 6
    assert tok.decode(ids) == "<think>ab</think>cd"
    # They are special tokens, so skipping special tokens drops them (and eos/pad).
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == "abcd"


def test_left_padding(tok):
    batch = tok(["1+2=", "12+34="], padding=True, return_tensors="pt")
    assert batch["input_ids"][0, :2].tolist() == [tok.pad_token_id] * 2
    assert batch["attention_mask"][0].tolist() == [0, 0, 1, 1, 1, 1]


def test_save_and_reload(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in ROUND_TRIP + ["<think>1</think>2<eos>"]:
        assert loaded(text)["input_ids"] == tok(text)["input_ids"]
        assert loaded.decode(loaded(text)["input_ids"]) == text
    assert loaded.padding_side == "left"
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.bos_token_id) == (0, tok.eos_token_id, tok.bos_token_id)
    assert loaded.chat_template == tok.chat_template


def test_add_bos_prepends_bos_and_survives_a_reload(tok, tmp_path):
    adding = toy.build_char_tokenizer(add_bos=True)
    assert adding("1+2=")["input_ids"] == [tok.bos_token_id] + tok("1+2=")["input_ids"]
    assert adding("1+2=", add_special_tokens=False)["input_ids"] == tok("1+2=")["input_ids"]
    assert adding.decode(adding("1+2=")["input_ids"], skip_special_tokens=True) == "1+2="
    adding.save_pretrained(tmp_path)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path)("1+2=")["input_ids"] == adding("1+2=")["input_ids"]


def test_chat_template(tok):
    messages = [{"role": "system", "content": "add"}, {"role": "user", "content": "12+34="}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "system: add\nuser: 12+34=\nassistant: "
    assert tok.apply_chat_template(messages, tokenize=False) == "system: add\nuser: 12+34=\n"
    assert tok.unk_token_id not in tok(text)["input_ids"]


# --- model --------------------------------------------------------------------------------------


def test_default_model_size_and_settings(tok):
    model = toy.build_tiny_model(tok)
    assert 2_000_000 < model.num_parameters() < 2_600_000
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tok)
    assert model.config.tie_word_embeddings
    assert model.dtype == torch.float32
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id


def test_model_is_deterministic_by_seed(tok):
    rng_before = torch.random.get_rng_state()
    a = toy.build_tiny_model(tok, seed=3, **TINY)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # the caller's RNG is untouched
    assert _same_weights(a, toy.build_tiny_model(tok, seed=3, **TINY))
    assert not _same_weights(a, toy.build_tiny_model(tok, seed=4, **TINY))


def test_llama_arch(tok):
    model = toy.build_tiny_model(tok, arch="llama", **TINY)
    assert model.config.model_type == "llama"
    with pytest.raises(ValueError):
        toy.build_tiny_model(tok, arch="gpt9")


# --- tasks --------------------------------------------------------------------------------------


def test_addition_dataset():
    ds = toy.addition_dataset(200, seed=1)
    assert ds.column_names == ["prompt", "answer"]
    assert ds[:] == toy.addition_dataset(200, seed=1)[:]
    assert ds[:] != toy.addition_dataset(200, seed=2)[:]
    for prompt, answer in zip(ds["prompt"], ds["answer"]):
        a, b = prompt.removesuffix("=").split("+")
        assert str(int(a)) == a and str(int(b)) == b  # no leading zeros
        assert 0 <= int(a) <= 99 and 0 <= int(b) <= 99
        assert answer == str(int(a) + int(b))
    three = toy.addition_dataset(50, digits=3)
    assert max(int(x) for p in three["prompt"] for x in p[:-1].split("+")) > 99


def test_addition_split_is_disjoint_and_deterministic():
    train, held_out = toy.addition_split(3000, 500, seed=0)
    assert (len(train), len(held_out)) == (3000, 500)
    assert len(set(train["prompt"])) == 3000 and len(set(held_out["prompt"])) == 500
    assert not set(train["prompt"]) & set(held_out["prompt"])
    again = toy.addition_split(3000, 500, seed=0)
    assert again[0][:] == train[:] and again[1][:] == held_out[:]
    with pytest.raises(ValueError):
        toy.addition_split(9800, 300)


def test_addition_split_eval_set_does_not_depend_on_train_size():
    # A warm start on a small split and RL on a larger one must share the held-out set.
    small_train, small_eval = toy.addition_split(400, 50, seed=3)
    large_train, large_eval = toy.addition_split(3000, 50, seed=3)
    assert small_eval[:] == large_eval[:]
    assert large_train[:400] == small_train[:]
    everything_train, everything_eval = toy.addition_split(10_000 - 50, 50, seed=3)  # every problem
    assert len(set(everything_train["prompt"]) | set(everything_eval["prompt"])) == 10_000


def test_reverse_dataset():
    ds = toy.reverse_dataset(20, seed=0, min_length=5, max_length=9)
    assert ds[:] == toy.reverse_dataset(20, seed=0, min_length=5, max_length=9)[:]
    for prompt, answer in zip(ds["prompt"], ds["answer"]):
        text = prompt.removeprefix("reverse:").removesuffix("=")
        assert 5 <= len(text) <= 9 and text.isalpha() and text.islower()
        assert answer == text[::-1]


# --- rewards ------------------------------------------------------------------------------------


def test_exact_match_reward():
    rewards = toy.exact_match_reward(
        prompts=["1+2="] * 4,
        completions=["3", " 3\n", "30", ""],
        completion_ids=[[]] * 4,
        answer=["3", "3", "3", "3"],
    )
    assert rewards == [1.0, 1.0, 0.0, 0.0]


def test_char_match_reward():
    answer = ["abcd"] * 6
    completions = ["abcd", "abxd", "ab", "abcdef", "dcba", "abcdxxxxxxxxxx"]
    rewards = toy.char_match_reward(prompts=[""] * 6, completions=completions, completion_ids=[[]] * 6, answer=answer)
    assert rewards == pytest.approx([1.0, 0.75, 0.5, 1.0 - 0.5 * 2 / 4, 0.0, 0.0])
    assert toy.char_match_reward(["", "x"], ["", ""]) == [1.0, 0.0]


# --- warm start and greedy evaluation -----------------------------------------------------------


def test_warm_start_lowers_loss_and_is_deterministic(tok):
    data = toy.addition_dataset(256, seed=0)
    model = toy.build_tiny_model(tok, seed=0, **TINY)
    losses = toy.supervised_warm_start(model, tok, data, steps=40, batch_size=32, learning_rate=1e-2, seed=0)
    assert len(losses) == 40 and not model.training
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    again = toy.build_tiny_model(tok, seed=0, **TINY)
    assert toy.supervised_warm_start(again, tok, data, steps=40, batch_size=32, learning_rate=1e-2, seed=0) == losses


def test_warm_start_masks_prompt_and_padding(tok):
    batch = warm_start._teacher_forcing_batch(tok, ["1+2=", "12+34="], ["3", "46"])
    eos = tok.eos_token_id
    assert batch["labels"][0].tolist() == [-100] * 7 + tok("3")["input_ids"] + [eos]
    assert batch["labels"][1].tolist() == [-100] * 6 + tok("46")["input_ids"] + [eos]
    assert batch["attention_mask"][0].tolist() == [0, 0, 0] + [1] * 6


class _ScriptedLM(torch.nn.Module):
    """Stands in for a causal LM: greedy decoding continues each (left-padded) prompt with a scripted reply.

    The logits favour the reply's next token by a margin of 1 only, so a sampler that draws
    instead of taking the argmax would almost never reproduce a reply.
    """

    def __init__(self, tok, replies: dict[str, str]):
        super().__init__()
        self.tok, self.replies = tok, replies
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config = transformers.Qwen2Config(num_hidden_layers=1)  # shapes the sampler's KV cache
        self.cache, self.scripts, self.step = None, [], 0

    def forward(self, input_ids, attention_mask, past_key_values, **kwargs):
        assert not self.training
        if past_key_values is not self.cache:  # a new cache: the prefill of a new batch of prompts
            assert attention_mask[:, -1].all()  # left padding: every prompt ends at the right edge
            prompts = [self.tok.decode(ids[mask.bool()]) for ids, mask in zip(input_ids, attention_mask)]
            self.scripts = [self.tok(self.replies[p])["input_ids"] + [self.tok.eos_token_id] for p in prompts]
            self.cache, self.step = past_key_values, 0
        else:  # one decode step: greedy decoding followed the script so far
            self.step += 1
        logits = torch.zeros(len(self.scripts), 1, len(self.tok))
        for row, script in enumerate(self.scripts):
            if self.step < len(script):
                logits[row, -1, script[self.step]] = 1.0
        return CausalLMOutputWithPast(logits=logits)


def test_greedy_accuracy_scripted(tok):
    from datasets import Dataset

    data = Dataset.from_dict({"prompt": ["1+2=", "12+34=", "5+5=", "9+90="], "answer": ["3", "46", "10", "99"]})
    # Right; right after stripping; wrong; wrong (too long).
    model = _ScriptedLM(tok, {"1+2=": "3", "12+34=": " 46 ", "5+5=": "11", "9+90=": "999"})
    assert toy.greedy_accuracy(model, tok, data, max_new_tokens=8, batch_size=3) == 0.5
    # Cut off by max_new_tokens after "99": still an exact match; " 46 " is cut to " 4".
    assert toy.greedy_accuracy(model, tok, data, max_new_tokens=2) == 0.5
    model.replies.update({"5+5=": "10", "9+90=": "99"})
    assert toy.greedy_accuracy(model, tok, data) == 1.0
    assert toy.greedy_accuracy(model, tok, data.select([])) == 0.0


def test_greedy_accuracy_after_memorising(tok):
    # A real model memorises prompts of different lengths, trained left-padded with positions
    # that skip padding, and generate (which pads the same way) must reproduce every answer.
    from datasets import Dataset

    data = Dataset.from_dict({"prompt": ["1+2=", "12+34=", "7+80=", "99+99="], "answer": ["3", "46", "87", "198"]})
    model = toy.build_tiny_model(tok, seed=0, **TINY)
    assert toy.greedy_accuracy(model, tok, data) == 0.0
    losses = toy.supervised_warm_start(model, tok, data, steps=150, batch_size=4, learning_rate=1e-2, seed=0)
    assert losses[-1] < 0.05
    assert toy.greedy_accuracy(model, tok, data, batch_size=3) == 1.0
    # The teacher-forced form of greedy exact match that early stopping uses agrees.
    batch = warm_start._teacher_forcing_batch(tok, list(data["prompt"]), list(data["answer"]))
    logits = model(**batch, position_ids=position_ids_from_mask(batch["attention_mask"])).logits
    assert sequence_exact_match(logits, batch["labels"]).all()


# --- cached warm-started addition model ---------------------------------------------------------

SMALL = {"warm_start_steps": 5, "num_train": 64, "num_eval": 16, "batch_size": 8, "model_kwargs": TINY}


def test_cache_trains_once_then_loads(tmp_path, capsys, monkeypatch):
    model, tokenizer = toy.warm_started_addition_model(tmp_path, **SMALL)
    assert "trained 5 steps" in capsys.readouterr().out
    (entry,) = tmp_path.iterdir()  # one entry, no temporary directory left behind
    assert entry.name.startswith("addition-")
    record = json.loads((entry / "warm_start.json").read_text())
    assert record["steps_run"] == 5 and 0.0 <= record["held_out_greedy_accuracy"] <= 1.0

    def no_training(*args, **kwargs):
        raise AssertionError("the second call must load from the cache")

    monkeypatch.setattr(warm_start, "_train_supervised", no_training)
    loaded, loaded_tok = toy.warm_started_addition_model(tmp_path, **SMALL)
    assert "loaded from cache" in capsys.readouterr().out
    assert _same_weights(model, loaded) and not loaded.training
    assert loaded_tok("12+34=")["input_ids"] == tokenizer("12+34=")["input_ids"]
    # The prompt as the demo gives it, spaces and newline included (transformers 5 alone reloads the entry's
    # tokenizer as Qwen2Tokenizer, which drops them: model_loading.load_tokenizer).
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "12+34="}], tokenize=False,
                                           add_generation_prompt=True)
    assert " " in prompt and "\n" in prompt
    assert loaded_tok(prompt)["input_ids"] == tokenizer(prompt)["input_ids"]
    assert loaded.generation_config.pad_token_id == tokenizer.pad_token_id


def test_cache_key_depends_on_settings(tmp_path):
    toy.warm_started_addition_model(tmp_path, verbose=False, **SMALL)
    toy.warm_started_addition_model(tmp_path, verbose=False, **{**SMALL, "warm_start_steps": 6})
    assert len(list(tmp_path.iterdir())) == 2


def test_target_accuracy_stops_early(tmp_path):
    # A target of 0 is met as soon as the accuracy window is full: 256 rows, 32 batches of 8.
    toy.warm_started_addition_model(tmp_path, verbose=False, **{**SMALL, "warm_start_steps": 100, "target_accuracy": 0.0})
    (entry,) = tmp_path.iterdir()
    assert json.loads((entry / "warm_start.json").read_text())["steps_run"] == TARGET_WINDOW // 8


def test_interrupted_write_leaves_no_entry(tmp_path, monkeypatch):
    broken = toy.build_char_tokenizer()

    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    broken.save_pretrained = fail
    monkeypatch.setattr(warm_start, "build_char_tokenizer", lambda **kwargs: broken)
    with pytest.raises(KeyboardInterrupt):
        toy.warm_started_addition_model(tmp_path, **SMALL)
    assert list(tmp_path.iterdir()) == []


# --- outside the core ---------------------------------------------------------------------------

_IMPORT_CORE = """
import importlib, pkgutil, sys
import rloo, rloo.trainer, rloo.cli
OUTSIDE = ("rloo.toy", "rloo.assets")
assert not set(OUTSIDE) & set(sys.modules), "importing rloo, rloo.trainer or rloo.cli imported rloo.toy or rloo.assets"

def import_all(package):  # every module below `package`, rloo.toy and rloo.assets left out
    for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if module.name not in OUTSIDE:
            imported = importlib.import_module(module.name)
            if module.ispkg:
                import_all(imported)

import_all(rloo)
outside = sorted(name for name in sys.modules if name in OUTSIDE or name.startswith(tuple(o + "." for o in OUTSIDE)))
assert not outside, f"importing the core imported {outside}"
"""


def test_core_does_not_import_toy_or_assets():
    # In a fresh interpreter: this test process has imported rloo.toy already.
    result = subprocess.run([sys.executable, "-c", _IMPORT_CORE], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_a_warm_start_with_a_target_prints_its_pace_the_expected_time_and_its_accuracy(tok, capsys):
    data = toy.addition_dataset(128, seed=0)
    model = toy.build_tiny_model(tok, seed=0, **TINY)
    warm_start._train_supervised(model, tok, data, steps=40, batch_size=8, learning_rate=1e-2, seed=0, log_every=20,
                                 target_accuracy=1.0, typical_steps=(300, 900))
    out = capsys.readouterr().out
    assert re.search(r"warm start: \d+\.\d\d s a step here; it usually reaches the target between steps 300 and 900, "
                     r"about \d+-\d+ s in all \(at most 40 steps\)", out), out
    assert re.search(r"warm start step 40/40: loss \d\.\d+, recent training accuracy \d\.\d\d of 1\.0, \d+ s", out), out


def test_the_typical_steps_are_known_for_the_default_and_the_demo_settings_only():
    settings = {"seed": 3, "warm_start_steps": warm_start.WARM_START_STEPS, "target_accuracy": 0.35,
                "num_train": toy.ADDITION_NUM_TRAIN, "num_eval": 100, "batch_size": 64, "learning_rate": 5e-4,
                "digits": 2, "model_kwargs": {}}
    assert warm_start._typical_steps(settings) == warm_start.WARM_START_TYPICAL_STEPS
    demo = {**settings, **warm_start.DEMO_WARM_START}
    assert warm_start._typical_steps(demo) == warm_start.DEMO_WARM_START_TYPICAL_STEPS
    assert warm_start._typical_steps({**demo, "learning_rate": 2e-3}) is None

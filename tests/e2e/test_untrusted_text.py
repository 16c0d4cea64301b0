"""Untrusted text everywhere: a short run whose completions, prompts, dataset columns, reward function
names, logged columns and logged metric names hold rich markup, terminal escapes, control bytes,
random bytes and HTML, with every logging option on (the completions table, TensorBoard, an eval, a
checkpoint, `rloo report`). The run completes, every file is intact, the console never receives a raw
escape byte and the report holds no live HTML.

The completions are real samples: the tokenizer's vocabulary is mostly hostile "characters" (`\\x1b[2J`,
`[/]`, `<script>`, a C1 CSI byte, a bidi override ...), so a random tiny model writes them."""

import json
import random

import pytest
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rloo import RLOOConfig, RLOOTrainer
from rloo.cli import main
from rloo.run.checkpoint import read_state
from rloo.toy import build_tiny_model
from rloo.toy.tokenizer import CHAT_TEMPLATE

HOSTILE_TOKENS = ["\x1b[2J", "\x1b[31m", "\x1b]8;;http://evil.example\x1b\\", "\x1b]0;title\x07", "\r", "\x00", "\x08",
                  "\x7f", "\x9b31m", "\u202e", "\u2028", "[/]", "[bold]", "[/bold]", "[link=http://x]", "[red on white]",
                  ":smile:", "<script>", "</script>", "<img src=x onerror=alert(1)>", "&amp;", "$\\frac{", "|", "\t",
                  "\n", "}}{%"]
CHARACTERS = "abcxyz0123 "
SPECIAL = ("<pad>", "<eos>", "<bos>", "<unk>")
MARKUP = ["[/]", "[bold]x[/bold]", "[link=http://x]click[/link]", "[/m3wVvu]", "\x1b[31mred\x1b[0m", "\x1b]8;;http://x\x1b\\",
          "<script>alert(1)</script>", "\r\x00\x9b\u202e", "$\\frac{"]
# A reward function's name, a logged column's name and a logged metric's name, hostile too; names can
# hold lone surrogates (Python strings can, JSON files can), Arrow columns cannot.
NAMES = ["acc[/]\x1b[2J<script>$\\frac{", "[link=http://x]len\u202e\udc80", "extra\x1b[31m[/]\ud800"]


def hostile_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of CHARACTERS, plus the hostile tokens (decoded as they are)."""
    vocab = {token: index for index, token in enumerate(dict.fromkeys([*SPECIAL, *CHARACTERS, *HOSTILE_TOKENS]))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                        bos_token="<bos>", unk_token="<unk>", padding_side="left",
                                        clean_up_tokenization_spaces=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def random_text(rng: random.Random) -> str:
    """Markup, escapes and random bytes (read as Latin-1: every C0 and C1 control can occur)."""
    noise = bytes(rng.randrange(256) for _ in range(rng.randrange(4, 24))).decode("latin-1")
    return f"abc {rng.choice(MARKUP)} {noise} {rng.choice(MARKUP)}"


def hostile_dataset(rng: random.Random, chat: bool) -> Dataset:
    rows = []
    for _ in range(8):
        prompt = random_text(rng)
        if chat:
            prompt = [{"role": "system", "content": random_text(rng)}, {"role": "user", "content": prompt}]
        rows.append({"prompt": prompt, "answer": random_text(rng), "note": random_text(rng)})
    return Dataset.from_list(rows)


def hostile_rewards(rng: random.Random):
    def first(completions, answer, log_extra, log_metric, **kwargs):
        log_extra(NAMES[2], [random_text(rng) + "\udc80" for _ in completions])
        log_metric("metric[/]\x1b[2J<b>", 1.0)
        return [len(c) % 3 / 2 for c in completions]

    def second(completions, note, **kwargs):
        return [float("\x1b" in c) for c in completions]

    first.__name__, second.__name__ = NAMES[0], NAMES[1]
    return [first, second]


@pytest.fixture
def quiet_library_bars():
    """transformers' nested "Writing model shards" bar moves the cursor up with its own `\x1b[A`; the
    console checked here is rloo's, so the library's bars are off for the test."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    yield
    transformers_logging.enable_progress_bar()


@pytest.mark.parametrize("chat", [False, True], ids=["text-prompts", "chat-prompts"])
def test_a_run_with_hostile_text_in_every_field_completes_with_its_files_intact(tmp_path, capfd, chat, quiet_library_bars):
    rng = random.Random(1234 + chat)
    tokenizer = hostile_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64)
    dataset = hostile_dataset(rng, chat)
    out = tmp_path / "run"
    args = RLOOConfig(output_dir=str(out), per_device_train_batch_size=8, num_generations=4, max_completion_length=12,
                      max_steps=2, logging_steps=1, save_steps=1, eval_steps=2, beta=0.04, log_completions=True,
                      num_completions_to_print=8, report_to="tensorboard", seed=0, max_prompt_length=256)
    trainer = RLOOTrainer(model, hostile_rewards(rng), args=args, train_dataset=dataset, eval_dataset=dataset,
                          processing_class=tokenizer)
    trainer.train()
    main(["report", str(out)])
    console = capfd.readouterr()

    # The files: every line parses, the checkpoints are complete, the completions hold the hostile text
    # (the fuzz reached them), TensorBoard wrote its events.
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "episode" in m] == [1, 2]
    assert any(k.startswith("eval/") for m in metrics for k in m)
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and {r["step"] for r in rows} == {1, 2}
    assert any("\x1b" in r["completion"] for r in rows) and any("[/]" in r["completion"] for r in rows)
    assert all(NAMES[2] in r for r in rows) and all(r["prompt"] in dataset["prompt"] for r in rows)
    assert read_state(out / "checkpoint-2") is not None and read_state(out / "checkpoint-1") is not None
    assert list(out.rglob("events.out.tfevents*"))
    assert (out / "model.safetensors").is_file()

    # The console: the tables were printed, with the markup as text and no raw escape or control byte.
    printed = console.out + console.err
    assert "Sample completions at step 2" in printed and "[/]" in printed and "\\x1b" in printed
    for raw in ("\x1b", "\x9b", "\x00", "\x07", "\u202e", "\x7f"):
        assert raw not in printed, repr(raw)
    if chat:
        assert "system: " in printed and "user: " in printed and "{'role'" not in printed

    # The report: every text escaped, no live tag from the run's text, the names shown.
    page = (out / "report.html").read_text(encoding="utf-8")
    lowered = page.lower()
    assert "<script" not in lowered and "<img src=x" not in lowered and "&lt;script&gt;" in lowered
    assert "\x1b" not in page and "\\x1b" in page and "\\udc80" in page
    assert "acc[/]\\x1b[2J&lt;script&gt;" in page  # the reward function's name, in the run's description
    if chat:
        assert "system: " in page and "{&#x27;role&#x27;" not in page

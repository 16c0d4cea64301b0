"""What rloo feeds the model and the reward functions, pinned on real tokenizers (Qwen2, Llama 3,
Llama 2, Phi-3, GPT-2), and compared with TRL 1.16 on the same prompts.

The vocabularies are llama.cpp's GGUF files, read from the cached llama-cpp-python sdist
(rloo.assets.vocabularies). Offline they are skipped with the command that caches them; in CI
(CI=true) a missing vocabulary fails instead.

The policy is a "scripted" Llama sized to each vocabulary: its layers add nothing to the residual
stream (zero output projections), so the next token depends only on the current one, and its
embedding and head are set so that the prompt's last token is followed by "Hello world" and then
the end-of-turn token, with probability ~1 even when sampling. So the sampled ids are known.
"""

import os

import pytest
import torch
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer
from rloo.assets.vocabularies import DOWNLOAD_HINT, load_vocab_tokenizer, vocabularies_available
from rloo.builders import default_sampler
from rloo.data.prompts import render_prompt, tokenize_prompts

if not vocabularies_available():
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must cache the real tokenizers: {DOWNLOAD_HINT}", pytrace=False)
    pytest.skip(f"the real tokenizers are not cached ({DOWNLOAD_HINT})", allow_module_level=True)

# Llama 3's chat format (the GGUF carries no template): BOS, header tokens, <|eot_id|> after each turn.
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

# family -> (end-of-turn token, chat template to set or None to keep the file's, the generation prompt
# a rendered conversation ends with, BOS ids a conversation starts with, BOS ids a plain prompt starts with)
FAMILIES = {
    "qwen2": ("<|im_end|>", None, "<|im_start|>assistant\n", 0, 0),
    "llama3": ("<|eot_id|>", LLAMA3_TEMPLATE, "<|start_header_id|>assistant<|end_header_id|>\n\n", 1, 0),
    "phi3": ("<|end|>", None, "<|assistant|>\n", 1, 1),
    "llama2": ("</s>", None, None, None, 1),
    "gpt2": ("<|endoftext|>", None, None, None, 0),
}
CHAT_FAMILIES = [name for name, family in FAMILIES.items() if family[2] is not None]
QUESTION = "What is 2 + 3?"


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    name = request.param
    tokenizer = load_vocab_tokenizer(name)
    end_token, template = FAMILIES[name][:2]
    if template is not None:
        tokenizer.chat_template = template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return name, tokenizer, tokenizer.convert_tokens_to_ids(end_token)


def prompts_of(name):
    conversation = [{"role": "user", "content": QUESTION}]
    return [conversation, conversation] if name in CHAT_FAMILIES else [QUESTION, QUESTION]


def scripted_model(tokenizer, prompt_last_id: int, script: list[int], end_id: int):
    """A Llama whose next token is a function of the current one: prompt_last_id -> script[0] -> ... ->
    script[-1] -> end_id; every other token -> end_id. The generation config declares end_id, as a chat
    checkpoint's does."""
    from transformers import LlamaConfig, LlamaForCausalLM

    chain = [prompt_last_id, *script]
    size = len(chain) + 1  # dimension 0: every other token
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=size * 2, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=size, tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=end_id, bos_token_id=tokenizer.bos_token_id)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.lm_head.weight.zero_()
        targets = [*script, end_id]
        for state, (token, target) in enumerate(zip(chain, targets), start=1):
            model.model.embed_tokens.weight[token] = 0.0
            model.model.embed_tokens.weight[token, state] = 1.0
            model.lm_head.weight[target, state] = 60.0
        model.lm_head.weight[end_id, 0] = 60.0
    model.generation_config.eos_token_id = end_id
    return model


def script_for(tokenizer):
    return tokenizer("Hello world", add_special_tokens=False)["input_ids"]


class Recorder:
    """A reward function that keeps what it was given."""

    __name__ = "recorder"

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        self.calls.append({"prompts": prompts, "completions": completions, "completion_ids": [list(c) for c in completion_ids]})
        return [float(len(c)) for c in completion_ids]


def test_prompt_ids_are_trls_with_bos_once(family):
    name, tokenizer, _ = family
    prompts = prompts_of(name)
    ids = tokenize_prompts(prompts, tokenizer, max_length=512)
    if name in CHAT_FAMILIES:  # TRL: apply_chat_template(tokenize=True) over the conversations
        trl_ids = tokenizer.apply_chat_template(conversation=prompts, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"]
        expected_bos = FAMILIES[name][3]
    else:  # TRL: the tokenizer's defaults on the text
        trl_ids = tokenizer(text=prompts)["input_ids"]
        expected_bos = FAMILIES[name][4]
    assert ids == [list(row) for row in trl_ids]
    bos = tokenizer.bos_token_id
    leading = 1 if ids[0][0] == bos else 0
    assert leading == expected_bos and ids[0].count(bos) == expected_bos  # at most once, and only in front


@pytest.mark.parametrize("name", CHAT_FAMILIES)
def test_chat_prompts_end_with_the_generation_prompt(name):
    tokenizer = load_vocab_tokenizer(name)
    if FAMILIES[name][1] is not None:
        tokenizer.chat_template = FAMILIES[name][1]
    prompt = prompts_of(name)[0]
    text = render_prompt(prompt, tokenizer)  # what is tokenized (decoding SentencePiece ids adds spaces)
    assert text.endswith(FAMILIES[name][2]) and QUESTION in text
    assert tokenize_prompts([prompt], tokenizer, max_length=512)[0] == tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_sampler_stops_at_the_end_of_turn_id(family, tmp_path):
    name, tokenizer, end_id = family
    model = scripted_model(tokenizer, 0, script_for(tokenizer), end_id)
    sampler = default_sampler(RLOOConfig(output_dir=str(tmp_path)), tokenizer, model)
    assert end_id in sampler.eos_token_ids and tokenizer.eos_token_id in sampler.eos_token_ids


def rloo_rewards_seen(tokenizer, model, prompts, tmp_path):
    recorder = Recorder()
    args = RLOOConfig(output_dir=str(tmp_path / "rloo"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=8, beta=0.0, max_steps=1, save_steps=0, seed=0, report_to=[])
    trainer = RLOOTrainer(model, recorder, args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]))
    rollout, samples = trainer.collector.collect([{"prompt": p} for p in prompts], trainer.global_step, trainer.episode)
    return recorder.calls[0], rollout


def test_rewards_get_the_completion_text_and_ids_up_to_the_end_of_turn(family, tmp_path):
    name, tokenizer, end_id = family
    prompts = prompts_of(name)
    prompt_ids = tokenize_prompts(prompts[:1], tokenizer, max_length=512)[0]
    script = script_for(tokenizer)
    seen, rollout = rloo_rewards_seen(tokenizer, scripted_model(tokenizer, prompt_ids[-1], script, end_id), prompts,
                                      tmp_path)
    text = tokenizer.decode(script)
    assert text.strip() == "Hello world"
    assert seen["completion_ids"] == [script + [end_id]] * 4  # the end-of-turn id is included, once
    expected = [{"role": "assistant", "content": text}] if name in CHAT_FAMILIES else text
    assert seen["completions"] == [expected] * 4  # the end-of-turn token is not in the text
    assert seen["prompts"] == [prompts[0]] * 2 + [prompts[1]] * 2  # each prompt repeated K times, in order
    assert rollout.has_eos.all()
    row = rollout.prompt_ids[0][rollout.prompt_mask[0].bool()].tolist()
    assert row == prompt_ids  # the model saw the prompt as tokenized above


@pytest.mark.parametrize("name", ["qwen2", "llama3", "llama2"])
def test_trl_gives_reward_functions_the_same(name, tmp_path):
    from trl import RLOOConfig as TRLConfig
    from trl import RLOOTrainer as TRLTrainer

    tokenizer = load_vocab_tokenizer(name)
    if FAMILIES[name][1] is not None:
        tokenizer.chat_template = FAMILIES[name][1]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    end_id = tokenizer.convert_tokens_to_ids(FAMILIES[name][0])
    prompts = prompts_of(name)
    prompt_ids = tokenize_prompts(prompts[:1], tokenizer, max_length=512)[0]
    script = script_for(tokenizer)
    ours, _ = rloo_rewards_seen(tokenizer, scripted_model(tokenizer, prompt_ids[-1], script, end_id), prompts, tmp_path)
    recorder = Recorder()
    args = TRLConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=4, num_generations=2,
                     max_completion_length=8, beta=0.0, max_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                     seed=0, logging_steps=1)
    trainer = TRLTrainer(scripted_model(tokenizer, prompt_ids[-1], script, end_id), recorder, args=args,
                         processing_class=tokenizer, train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]))
    trainer.train()
    theirs = recorder.calls[0]
    assert theirs["completion_ids"] == ours["completion_ids"]
    assert theirs["completions"] == ours["completions"]
    assert sorted(map(str, theirs["prompts"])) == sorted(map(str, ours["prompts"]))  # TRL shuffles the order

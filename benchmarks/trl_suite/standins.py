"""Local stand-ins for the Hub ids that TRL's RLOOTrainer tests load.

Nothing here is downloaded. Each model is the architecture class the Hub repository holds, with a
tiny configuration (hidden size 8 or 16, two layers), random weights in bfloat16 (as the Hub copies
are stored), and a byte-level tokenizer whose vocabulary has the real model's size with the real
special tokens at their real ids; the two Qwen3 causal LMs, whose tool tests script real token ids, get Qwen3's
real tokenizer and tool template instead (qwen_tokenizer.py). The prompt data set is built from the Zen of Python (the `this`
module), split 17 train / 2 test as the Hub copy is.

`hub_cache.build_hub_cache(root)` writes these and the VLM stand-ins (vlm_standins.py, which builds on this
module) in the Hugging Face cache layout; `hub_redirect.py` points transformers and datasets at them.
"""

from __future__ import annotations

import codecs
import contextlib
import importlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from datasets import Dataset
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

ORG = "trl-internal-testing"
REVISION = "0" * 39 + "1"  # the snapshot name the cache's refs/main points at
BUILD_VERSION = "9"  # bump when a stand-in changes, so that cached copies are rebuilt

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


@dataclass
class TokenizerSpec:
    """The facts of a real tokenizer that the tests can see: vocabulary size, special tokens and their ids."""

    vocab_size: int
    specials: dict[str, int]  # token text -> id
    eos: str
    pad: str | None = None
    bos: str | None = None
    add_bos: bool = False
    chat_template: str = CHATML
    named: dict[str, str] = field(default_factory=dict)  # attribute -> token, e.g. image_token (read by processors)


QWEN25 = TokenizerSpec(151665, {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645},
                       eos="<|im_end|>", pad="<|endoftext|>")
QWEN3 = TokenizerSpec(151669, {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                               "<think>": 151667, "</think>": 151668}, eos="<|im_end|>", pad="<|endoftext|>")
LLAMA32 = TokenizerSpec(128256, {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001,
                                 "<|finetune_right_pad_id|>": 128004, "<|start_header_id|>": 128006,
                                 "<|end_header_id|>": 128007, "<|eot_id|>": 128009},
                        eos="<|eot_id|>", pad="<|finetune_right_pad_id|>", bos="<|begin_of_text|>", add_bos=True,
                        chat_template=LLAMA3)
COHERE2 = TokenizerSpec(262144, {"<PAD>": 0, "<BOS_TOKEN>": 2, "<|END_OF_TURN_TOKEN|>": 3,
                                 "<|im_start|>": 4, "<|im_end|>": 5},
                        eos="<|END_OF_TURN_TOKEN|>", pad="<PAD>", bos="<BOS_TOKEN>")
GLM45 = TokenizerSpec(151365, {"<|endoftext|>": 151329, "<|user|>": 151336, "<|observation|>": 151338,
                               "<|im_start|>": 151340, "<|im_end|>": 151341}, eos="<|endoftext|>", pad="<|endoftext|>")
GPT_OSS = TokenizerSpec(201088, {"<|endoftext|>": 199999, "<|return|>": 200002, "<|im_start|>": 200006,
                                 "<|im_end|>": 200007}, eos="<|return|>", pad="<|endoftext|>")
NEMOTRON_H = TokenizerSpec(131072, {"<unk>": 0, "<s>": 1, "</s>": 2, "<|im_start|>": 10, "<|im_end|>": 11},
                           eos="<|im_end|>", pad="</s>", bos="<s>")


def byte_alphabet() -> list[str]:
    """The 256 printable stand-ins for bytes that byte-level BPE uses (GPT-2's mapping)."""
    return sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda ch: _byte_of(ch))


def _byte_of(ch: str) -> int:
    code = ord(ch)
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    if code in printable:
        return code
    missing = [b for b in range(256) if b not in printable]
    return missing[code - 256]


def build_tokenizer(spec: TokenizerSpec) -> transformers.PreTrainedTokenizerFast:
    """A byte-level tokenizer (one token per byte, no merges) with `spec`'s vocabulary size and special ids.

    Ids that are neither a byte nor a special token hold unused filler tokens, so that a random model's
    samples decode to text and `len(tokenizer)` equals the real one.
    """
    vocab = {f"<|filler_{i}|>": i for i in range(spec.vocab_size)}
    taken = set(spec.specials.values())
    free = (i for i in range(spec.vocab_size) if i not in taken)
    inverse = {i: t for t, i in vocab.items()}
    for ch in byte_alphabet():
        inverse[next(free)] = ch
    for token, index in spec.specials.items():
        inverse[index] = token
    vocab = {token: index for index, token in inverse.items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    extra = [t for t in spec.specials if t not in (spec.eos, spec.pad, spec.bos)]
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=spec.eos, pad_token=spec.pad, bos_token=spec.bos,
        additional_special_tokens=extra, model_max_length=131072, clean_up_tokenization_spaces=False,
        **({"extra_special_tokens": spec.named} if spec.named else {}))
    if spec.named:  # transformers 5 keeps the named tokens in place of additional_special_tokens: add those back
        tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in extra], special_tokens=True)
    if spec.add_bos:
        from tokenizers import processors

        backend = tokenizer.backend_tokenizer
        backend.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos} $A", pair=f"{spec.bos} $A {spec.bos} $B", special_tokens=[(spec.bos, spec.specials[spec.bos])])
    tokenizer.chat_template = spec.chat_template
    return tokenizer


SMALL = dict(hidden_size=8, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=32)
SMALL_RM = {**SMALL, "hidden_size": 16, "num_labels": 1}


@dataclass
class StandIn:
    """One Hub id: the config class and model class to build, the config's keyword arguments, the tokenizer."""

    name: str
    config_class: str
    model_class: str
    tokenizer: TokenizerSpec
    config: dict = field(default_factory=dict)
    remote_code: bool = False
    real_qwen3_tokenizer: bool = False  # Qwen3's real BPE and tool template (qwen_tokenizer.py), for scripted ids


def _ids(spec: TokenizerSpec, **more) -> dict:
    out = {"eos_token_id": spec.specials[spec.eos], "vocab_size": spec.vocab_size}
    if spec.pad:
        out["pad_token_id"] = spec.specials[spec.pad]
    if spec.bos:
        out["bos_token_id"] = spec.specials[spec.bos]
    return {**out, **more}


STANDINS = [
    StandIn("tiny-Qwen2ForCausalLM-2.5", "Qwen2Config", "Qwen2ForCausalLM", QWEN25, {**SMALL, **_ids(QWEN25)}),
    StandIn("tiny-Qwen2ForSequenceClassification-2.5", "Qwen2Config", "Qwen2ForSequenceClassification", QWEN25,
            {**SMALL_RM, **_ids(QWEN25)}),
    StandIn("tiny-Qwen3ForCausalLM", "Qwen3Config", "Qwen3ForCausalLM", QWEN3, {**SMALL, **_ids(QWEN3)},
            real_qwen3_tokenizer=True),
    StandIn("tiny-Qwen3ForSequenceClassification", "Qwen3Config", "Qwen3ForSequenceClassification", QWEN3,
            {**SMALL_RM, **_ids(QWEN3)}),
    StandIn("tiny-Qwen3MoeForCausalLM", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", QWEN3,
            {**SMALL, **_ids(QWEN3, vocab_size=151936), "num_experts": 4, "num_experts_per_tok": 2,
             "moe_intermediate_size": 32, "norm_topk_prob": True}, real_qwen3_tokenizer=True),
    StandIn("tiny-LlamaForSequenceClassification-3.2", "LlamaConfig", "LlamaForSequenceClassification", LLAMA32,
            {**SMALL_RM, **_ids(LLAMA32)}),
    StandIn("tiny-Cohere2ForCausalLM", "Cohere2Config", "Cohere2ForCausalLM", COHERE2,
            {**SMALL, **_ids(COHERE2), "logit_scale": 1.0, "sliding_window": 4096}),
    StandIn("tiny-Glm4MoeForCausalLM", "Glm4MoeConfig", "Glm4MoeForCausalLM", GLM45,
            {**SMALL, **_ids(GLM45, eos_token_id=[151329, 151336, 151338]), "moe_intermediate_size": 32,
             "head_dim": 2, "n_routed_experts": 4, "num_experts_per_tok": 2, "attention_bias": True,
             "use_qk_norm": True, "first_k_dense_replace": 1}),
    StandIn("tiny-GptOssForCausalLM", "GptOssConfig", "GptOssForCausalLM", GPT_OSS,
            {**SMALL, **_ids(GPT_OSS), "num_local_experts": 4, "num_experts_per_tok": 2}),
    StandIn("tiny-NemotronHForCausalLM-nano", "NemotronHConfig", "NemotronHForCausalLM", NEMOTRON_H,
            {**_ids(NEMOTRON_H), "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 32, "layers_block_type": ["mamba", "attention", "moe"], "mamba_num_heads": 8,
             "mamba_head_dim": 4, "mamba_n_groups": 1, "ssm_state_size": 16, "mamba_d_conv": 4, "mamba_expand": 2,
             "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
             "moe_shared_expert_intermediate_size": 32, "use_mamba_kernels": False}),
    StandIn("tiny-RemoteForCausalLM", "LlamaConfig", "LlamaForCausalLM", LLAMA32, {**SMALL, **_ids(LLAMA32)},
            remote_code=True),
]

# Custom code for the trust_remote_code test: a Llama under another name, loadable only with trust_remote_code.
REMOTE_CONFIG_PY = '''from transformers import LlamaConfig


class RemoteConfig(LlamaConfig):
    model_type = "remote"
'''
REMOTE_MODELING_PY = '''from transformers import LlamaForCausalLM, LlamaModel

from .configuration_remote import RemoteConfig


class RemoteModel(LlamaModel):
    config_class = RemoteConfig


class RemoteForCausalLM(LlamaForCausalLM):
    config_class = RemoteConfig
'''


def init_small_weights(model: torch.nn.Module, seed: int = 0) -> None:
    """Random weights that give finite outputs: Xavier for linear maps, N(0, 0.02) for embeddings."""
    torch.manual_seed(seed)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, torch.nn.Embedding):
            torch.nn.init.normal_(module.weight, std=0.02)


def build_model(standin: StandIn, target: Path) -> None:
    """Write `standin`'s config, bfloat16 weights, tokenizer and generation config into `target`."""
    config = getattr(transformers, standin.config_class)(**standin.config)
    if hasattr(config, "layer_types") and config.layer_types is not None:
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    model = getattr(transformers, standin.model_class)(config)
    init_small_weights(model)
    for module in model.modules():  # NemotronH keeps its state-space decay parameters in float32
        for name in ("A_log", "D"):
            if isinstance(getattr(module, name, None), torch.nn.Parameter):
                getattr(module, name).data = getattr(module, name).data.float()
    keep = {n for n, p in model.named_parameters() if n.endswith((".A_log", ".D"))}
    for n, p in model.named_parameters():
        if n not in keep:
            p.data = p.data.to(torch.bfloat16)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    if standin.real_qwen3_tokenizer:
        from qwen_tokenizer import qwen3_tokenizer

        tokenizer = qwen3_tokenizer()
    else:
        tokenizer = build_tokenizer(standin.tokenizer)
    tokenizer.save_pretrained(target)
    eos = standin.config["eos_token_id"]
    transformers.GenerationConfig(
        eos_token_id=eos, pad_token_id=standin.config.get("pad_token_id"),
        bos_token_id=standin.config.get("bos_token_id"), do_sample=True, temperature=0.7,
    ).save_pretrained(target)
    if standin.remote_code:
        (target / "configuration_remote.py").write_text(REMOTE_CONFIG_PY)
        (target / "modeling_remote.py").write_text(REMOTE_MODELING_PY)
        data = json.loads((target / "config.json").read_text())
        data.update(model_type="remote", architectures=["RemoteForCausalLM"], auto_map={
            "AutoConfig": "configuration_remote.RemoteConfig",
            "AutoModel": "modeling_remote.RemoteModel",
            "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM"})
        (target / "config.json").write_text(json.dumps(data, indent=2))


def zen_lines() -> list[str]:
    """The nineteen aphorisms of the Zen of Python, from the standard library's `this` module."""
    with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints the poem
        this = importlib.import_module("this")
    text = codecs.decode(this.s, "rot13")
    return [line for line in text.splitlines()[1:] if line.strip()]


def zen_prompts() -> list[str]:
    """The first half of each aphorism."""
    return [" ".join(line.split()[: max(1, len(line.split()) // 2)]) for line in zen_lines()]


def zen_datasets() -> dict[str, dict[str, Dataset]]:
    """The prompt-only configurations of the test data set: each prompt is the first half of an aphorism."""
    prompts = zen_prompts()
    standard = Dataset.from_dict({"prompt": prompts})
    conversational = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts]})
    out = {}
    for name, data in (("standard_prompt_only", standard), ("conversational_prompt_only", conversational)):
        split = data.train_test_split(test_size=0.1, shuffle=False)
        out[name] = {"train": split["train"], "test": split["test"]}
    return out

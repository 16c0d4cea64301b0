"""The toy's character-level tokenizer: one token per character, a plain chat template, left padding."""

from __future__ import annotations

import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
BOS_TOKEN = "<bos>"
UNK_TOKEN = "<unk>"
THINK_TOKENS = ("<think>", "</think>")
# Order fixes the ids: <pad>=0, <eos>=1, <bos>=2, <unk>=3, <think>=4, </think>=5.
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN, *THINK_TOKENS)
PUNCTUATION = "+-*/=?!.,:;()[]'\"#<>_"
# "\n" is in the vocabulary because the chat template ends every message with a newline.
CHARACTERS = "0123456789" + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + " \n" + PUNCTUATION
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] + ': ' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)
MODEL_MAX_LENGTH = 1024


def build_char_tokenizer(*, add_bos: bool = False) -> transformers.PreTrainedTokenizerFast:
    """A character-level fast tokenizer: every character of `CHARACTERS` is one token.

    Special tokens: "<pad>" (id 0), "<eos>" (1), "<bos>" (2), "<unk>" (3), "<think>" (4) and
    "</think>" (5). All of them are matched as single tokens when they appear in text, and all
    of them (the think tags included) are dropped by `decode(..., skip_special_tokens=True)`.
    By default encoding adds no BOS or EOS: a prompt is encoded exactly as written. Padding is on
    the left, as generation needs. Characters outside the vocabulary encode as "<unk>".

    Args:
        add_bos: give the tokenizer a post-processor that prepends "<bos>" whenever special tokens
            are added (`add_special_tokens=True`, the default), as Llama, Mistral and Gemma
            tokenizers do; the chat template then writes no BOS of its own.

    Returns:
        A `PreTrainedTokenizerFast` with a "role: content\\n" chat template; it round-trips
        through `save_pretrained` / `AutoTokenizer.from_pretrained`.
    """
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + tuple(CHARACTERS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Isolate every character (newline included, hence [\s\S] rather than "."), so that
    # spaces are tokens of their own instead of word separators.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse concatenates tokens with nothing in between: the default WordLevel decoding would
    # join them with spaces.
    backend.decoder = decoders.Fuse()
    if add_bos:
        bos_id = vocab[BOS_TOKEN]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B", special_tokens=[(BOS_TOKEN, bos_id)])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=list(THINK_TOKENS),
        padding_side="left",
        model_max_length=MODEL_MAX_LENGTH,
        # The default cleanup would turn "a ." into "a.", breaking the round trip.
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer

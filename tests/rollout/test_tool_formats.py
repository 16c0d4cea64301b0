"""Tool calls in each family's own format (tools/formats.py): the format is read from the chat template, each
family's call round-trips from ids through parse and back through the template to the same ids, arguments are
typed by the tool's schema, and a family rloo cannot read is refused at construction by name.

Templates: the families' published chat templates as TRL ships them; tokenizers: real (Qwen3, Llama 3) or Qwen's
BPE with the family's control tokens (family_tokenizers.py)."""

import json

import pytest
from datasets import Dataset
from family_tokenizers import family_tokenizer, needs_family_tokenizers
from tool_chat import ScriptedSampler, tool_tokenizer

from rloo import RLOOConfig, RLOOTrainer
from rloo.config import ConfigError
from rloo.tools import prepare_tool_calls, tool_schemas, tool_suffix_ids
from rloo.tools.formats import FORMATS, call_format, cast_arguments, rendered_call_turn
from rloo.tools.rendering import call_turn_ending
from rloo.toy import build_tiny_model


def add(a: int, b: str) -> str:
    """Add a number to a code.

    Args:
        a: a number
        b: a code (digits, kept as text)
    """
    return f"{a}:{b}"


SCHEMAS = tool_schemas([add])
READ = {  # template -> the format rloo reads it in
    "qwen2_5": "hermes", "qwen3": "hermes", "qwen3_5_think": "qwen-xml", "qwen3_6": "qwen-xml",
    "nemotron_3_nano": "qwen-xml", "llama3_1": "llama3-json", "llama3_2": "llama3-json", "lfm2_2_5": "pythonic",
    "gptoss": "harmony", "gemma4": "gemma4", "glm4moe": "glm-xml",
}


@pytest.fixture(autouse=True)
def _tokenizers():
    needs_family_tokenizers()


@pytest.mark.parametrize("family", sorted(READ))
def test_each_family_s_call_round_trips_through_parse_and_render(family):
    """ids the template gives a call -> text -> parsed call (typed by the schema: 7 an int, "75001" a string, though
    XML formats write both as bare text) -> rendered again: the same ids."""
    tokenizer, stops = family_tokenizer(family)
    chosen = prepare_tool_calls(tokenizer, {None: SCHEMAS}, stops)
    assert chosen.name == READ[family]
    ids = tokenizer.encode(rendered_call_turn(tokenizer, None, [("add", {"a": 7, "b": "75001"})]), add_special_tokens=False)
    content, calls = chosen.parse(tokenizer.decode(ids))
    assert [(c.name, c.arguments, c.error) for c in calls] == [("add", {"a": 7, "b": "75001"}, None)]
    again = rendered_call_turn(tokenizer, None, [(c.name, c.arguments) for c in calls])
    assert tokenizer.encode(again, add_special_tokens=False) == ids
    assert "tool_call" not in content and "75001" not in content


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5_think", "lfm2_2_5", "gemma4", "glm4moe"])
def test_two_calls_in_one_turn(family):
    """(GPT-OSS's and Llama 3's templates render one call per turn.)"""
    tokenizer, stops = family_tokenizer(family)
    chosen = prepare_tool_calls(tokenizer, {None: SCHEMAS}, stops)
    text = rendered_call_turn(tokenizer, None, [("add", {"a": 1, "b": "2"}), ("add", {"a": 3, "b": "4"})])
    _, calls = chosen.parse(tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)))
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 1, "b": "2"}), ("add", {"a": 3, "b": "4"})]


def test_a_turn_without_a_call_is_its_text_and_a_broken_call_is_an_error():
    tokenizer, stops = family_tokenizer("llama3_1")
    llama = prepare_tool_calls(tokenizer, {None: SCHEMAS}, stops)
    assert llama.parse("The answer is 5.<|eot_id|>") == ("The answer is 5.", [])
    _, [broken] = llama.parse('{"name": "add", "parameters": {"a": 7,<|eot_id|>')
    assert broken.error and "not valid JSON" in broken.error
    tokenizer, stops = family_tokenizer("qwen3_5_think")
    xml = prepare_tool_calls(tokenizer, {None: SCHEMAS}, stops)
    _, [unclosed] = xml.parse("<tool_call>\n<function=add>\n<parameter=a>\n7\n</parameter>\n")
    assert "not closed" in unclosed.error
    _, [json_in_xml] = xml.parse('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>')
    assert "<function=name>" in json_in_xml.error


def test_arguments_are_typed_by_the_tool_s_schema():
    parameters = {"properties": {"n": {"type": "integer"}, "x": {"type": "number"}, "ok": {"type": "boolean"},
                                 "tags": {"type": "array"}, "s": {"type": "string"}, "any": {}}}
    given = {"n": "7", "x": "2.5", "ok": "true", "tags": '["a"]', "s": "0012", "any": "3", "extra": "4"}
    assert cast_arguments(given, parameters) == {"n": 7, "x": 2.5, "ok": True, "tags": ["a"], "s": "0012",
                                                 "any": "3", "extra": "4"}
    assert cast_arguments({"n": "seven", "ok": "1"}, parameters) == {"n": "seven", "ok": "1"}  # left for the tool


def test_a_tokenizer_carrying_a_response_schema_is_parsed_by_transformers():
    from trl.chat_template_utils import add_response_schema

    tokenizer, stops = family_tokenizer("qwen3")
    tokenizer = add_response_schema(tokenizer)
    chosen = call_format(tokenizer, SCHEMAS)
    assert chosen.name == "transformers"
    text = rendered_call_turn(tokenizer, None, [("add", {"a": 7, "b": "75001"})])
    _, calls = chosen.parse(text)
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 7, "b": "75001"})]


def test_a_family_rloo_cannot_read_is_refused_by_name():
    tokenizer, stops = family_tokenizer("deepseek_r1_distill")
    with pytest.raises(ConfigError, match=r"DeepSeek-R1"):
        prepare_tool_calls(tokenizer, {None: SCHEMAS}, stops)
    tokenizer, stops = family_tokenizer("glm4moe")  # its call turn ends at <|observation|>: refused if no stop there
    observation = tokenizer.convert_tokens_to_ids("<|observation|>")
    with pytest.raises(ConfigError, match=r"GLM-4.*'</tool_call>'.*nor at the token the tool message begins with"):
        prepare_tool_calls(tokenizer, {None: SCHEMAS}, stops - {observation})
    odd = tool_tokenizer("{% for m in messages %}{{ m.role + ': ' + (m.content or '') }}{% for c in m.tool_calls or [] %}"
                         "{{ 'CALL ' + c.function.name + ' ' + (c.function.arguments | tojson) }}{% endfor %}"
                         "{{ '<eos>' }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(ConfigError, match=r"an unknown family.*CALL tool_name.*none of rloo's formats \(hermes, qwen-xml"):
        call_format(odd, SCHEMAS)
    assert set(READ.values()) <= set(FORMATS)


# ------------------------------------------------------------------ a GRPO tool script on Llama 3 and Qwen3.5


def test_glm_s_call_turn_ends_at_the_tool_message_s_first_token():
    """GLM-4's turns have no end token of their own: generation stops at the next message's first token, and a call
    turn is followed by `<|observation|>`, the tool message's. That id ends the sampled turn, and the tool results
    appended after it are the rest of the tool message: the ids of the template's own rendering."""
    tokenizer, stops = family_tokenizer("glm4moe")
    chosen = prepare_tool_calls(tokenizer, {None: SCHEMAS}, stops)
    observation = tokenizer.convert_tokens_to_ids("<|observation|>")
    assert (call_turn_ending(tokenizer, stops), chosen.end_opens_next) == ((observation, True), True)
    call = [{"type": "function", "function": {"name": "add", "arguments": {"a": 7, "b": "75001"}}}]
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": call},
                    {"role": "tool", "name": "add", "content": "7:75001"}]
    whole = tokenizer.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True, return_dict=False)
    prompt = tokenizer.apply_chat_template(conversation[:1], tokenize=True, add_generation_prompt=True,
                                           return_dict=False)
    sampled = tokenizer.encode(rendered_call_turn(tokenizer, None, [("add", {"a": 7, "b": "75001"})]),
                               add_special_tokens=False) + [observation]
    suffix = tool_suffix_ids(tokenizer, conversation[2:], stops, None, chosen.end_opens_next)
    assert prompt + sampled + suffix == whole
    assert chosen.parse(tokenizer.decode(sampled))[1][0].arguments == {"a": 7, "b": "75001"}


@pytest.mark.parametrize("family", ["llama3_1", "qwen3_5_think", "qwen3", "glm4moe"])
def test_training_with_each_family_s_native_calls(tmp_path, family):
    """The model writes calls in its family's own format: they are run (call frequency 1 per trajectory: one call,
    then an answer), none fails from the format, and the tool receives typed arguments."""
    tokenizer, stops = family_tokenizer(family)
    call_text = rendered_call_turn(tokenizer, None, [("add", {"a": 7, "b": "75001"})])
    end, end_opens_next = call_turn_ending(tokenizer, stops)
    if end_opens_next:  # GLM-4: the turn ends with the tool message's first token, which generation stops at
        call_text += tokenizer.convert_ids_to_tokens(end)
    seen = []

    def traced(a: int, b: str) -> str:
        """Add a number to a code.

        Args:
            a: a number
            b: a code (digits, kept as text)
        """
        seen.append((a, b))
        return f"{a}:{b}"

    traced.__name__ = "add"

    def script(text, row):
        return "It is 7:75001." if "7:75001" in text else call_text

    class Sampler(ScriptedSampler):
        def sample(self, model, prompts, num_generations):
            batch = super().sample(model, prompts, num_generations)
            return batch

    sampler = Sampler(tokenizer, script)
    sampler.eos_token_ids = sorted(stops)
    model = build_tiny_model(tokenizer, seed=0, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=32)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Add 7 to 75001."}]}] * 2)
    config = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=2,
                        max_completion_length=400, learning_rate=1e-3, beta=0.0, max_steps=1, logging_steps=1,
                        save_steps=0, seed=0, overwrite_output_dir=True)
    trainer = RLOOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer, sampler=sampler,
                          reward_funcs=[lambda completions, **kw: [float("7:75001" in json.dumps(c)) for c in completions]],
                          tools=[traced])
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "tools/call_frequency" in entry][-1]
    assert logged["tools/call_frequency"] == 1.0 and logged["tools/failure_frequency"] == 0.0
    assert seen == [(7, "75001")] * 4

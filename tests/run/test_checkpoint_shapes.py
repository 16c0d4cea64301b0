"""Checkpoints shaped like the ones users bring: a tokenizer that adds BOS, a model whose turns
end at a token other than `tokenizer.eos_token`, a Qwen3-style thinking template."""

import copy

import torch
from datasets import Dataset
from tokenizers.processors import TemplateProcessing

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.data.prompts import tokenize_prompts
from rloo.rewards.reward_model import RewardModel

BOS_CHAT_TEMPLATE = (  # writes its own BOS, as Llama's and Gemma's templates do
    "{{ bos_token }}{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def bos_tokenizer(tokenizer):
    """The toy tokenizer with a post-processor that prepends BOS, as Llama/Mistral/Gemma tokenizers do."""
    adding = copy.deepcopy(tokenizer)
    adding.backend_tokenizer.post_processor = TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", tokenizer.bos_token_id)])
    adding.chat_template = BOS_CHAT_TEMPLATE
    return adding


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=4, beta=0.0, max_steps=1, logging_steps=1, save_steps=0, seed=0)
    return RLOOConfig(**{**values, **overrides})


class RecordingSampler:
    """Wraps a sampler and keeps the prompt ids it was given."""

    def __init__(self, inner):
        self.inner, self.prompts = inner, []

    def sample(self, model, prompts, num_generations):
        self.prompts.append(prompts)
        return self.inner.sample(model, prompts, num_generations)

    def on_optimizer_step(self, model):
        self.inner.on_optimizer_step(model)


def test_plain_prompts_keep_the_tokenizers_bos_and_templated_ones_get_exactly_one(tmp_path, make_model, tokenizer):
    adding = bos_tokenizer(tokenizer)
    bos = adding.bos_token_id
    assert adding("1+1=")["input_ids"][0] == bos  # the fixture really adds BOS
    ids = tokenize_prompts(["1+1=", [{"role": "user", "content": "1+1="}]], adding, 100)
    assert ids[0] == adding("1+1=")["input_ids"]
    assert ids[1][0] == bos and ids[1].count(bos) == 1  # the template's BOS, none added on top
    assert adding.decode(ids[1]) == "<bos>user: 1+1=\nassistant: "

    from rloo.builders import default_sampler
    args = _config(tmp_path)
    sampler = RecordingSampler(default_sampler(args, adding))
    rows = [{"prompt": f"{a}+{a}="} for a in range(4)]
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=adding, sampler=sampler)
    rollout, _ = trainer.collector.collect(rows[:2], trainer.global_step, trainer.episode)
    assert sampler.prompts[-1] == [adding(r["prompt"])["input_ids"] for r in rows[:2]]
    assert rollout.prompt_ids[0][rollout.prompt_mask[0].bool()].tolist() == adding("0+0=")["input_ids"]


def test_prompt_length_check_counts_the_added_bos(tmp_path, make_model, tokenizer):
    adding = bos_tokenizer(tokenizer)
    rows = Dataset.from_list([{"prompt": "1234"}])  # 4 characters, 5 tokens with BOS
    import pytest
    with pytest.raises(ValueError, match="prompt of 5 tokens"):
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path, max_prompt_length=4, truncate_prompts="error"),
                    train_dataset=rows, processing_class=adding)


def test_reward_model_reads_plain_text_with_bos_and_templates_with_one(tokenizer):
    import transformers
    adding = bos_tokenizer(tokenizer)
    config = transformers.Qwen2Config(vocab_size=len(adding), hidden_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, intermediate_size=32,
                                      num_labels=1, pad_token_id=adding.pad_token_id)
    torch.manual_seed(0)
    reward_model = RewardModel(transformers.Qwen2ForSequenceClassification(config), adding)
    plain = reward_model.encode(reward_model.texts(["1+1="], ["2"]), ["1+1="])
    assert plain["input_ids"][0].tolist() == adding("1+1=2")["input_ids"]
    chat = [{"role": "user", "content": "1+1="}]
    templated = reward_model.encode(reward_model.texts([chat], ["2"]), [chat])["input_ids"][0].tolist()
    assert templated[0] == adding.bos_token_id and templated.count(adding.bos_token_id) == 1


def _greedy(model, tokenizer, prompt_ids, length=6):
    from rloo.generation import FastSampler
    sampler = FastSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                          max_new_tokens=length, do_sample=False)
    return sampler.sample(model, [prompt_ids], 1).completion_ids[0].tolist()


import pytest  # noqa: E402


@pytest.mark.parametrize("sampler_name", ["fast", "generate"])
def test_sampler_stops_at_every_end_id_the_generation_config_declares(tmp_path, make_model, tokenizer, sampler_name):
    from rloo.builders import default_sampler
    model = make_model(seed=3)
    prompt = tokenizer("1+2=")["input_ids"]
    greedy = _greedy(model, tokenizer, prompt)
    unused = tokenizer.convert_tokens_to_ids("<think>")
    assert unused not in greedy and tokenizer.eos_token_id not in greedy[:3]
    # Near-greedy sampling: a temperature this low puts all the mass on the argmax.
    args = _config(tmp_path, sampler=sampler_name, temperature=1e-4, max_completion_length=6)
    for declared, stop_at in (([greedy[2], unused], greedy.index(greedy[2])), ([unused, greedy[0]], 0)):
        model.generation_config.eos_token_id = declared
        sampled = default_sampler(args, tokenizer, model).sample(model, [prompt], 2)
        assert sampled.has_eos.tolist() == [True, True]
        assert sampled.completion_mask.sum(dim=1).tolist() == [stop_at + 1] * 2
        assert sampled.completion_ids[0, : stop_at + 1].tolist() == greedy[: stop_at + 1]
    model.generation_config.eos_token_id = tokenizer.eos_token_id  # an int works too
    assert default_sampler(args, tokenizer, model).eos_token_ids == [tokenizer.eos_token_id]


def test_trainer_default_sampler_reads_the_models_end_ids(tmp_path, make_model, tokenizer, digit_dataset):
    model = make_model()
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, 7, 9]
    trainer = RLOOTrainer(model, digit_fraction, args=_config(tmp_path, stop_token_ids=[9, 11]),
                          train_dataset=digit_dataset, processing_class=tokenizer)
    assert trainer.sampler.eos_token_ids == [tokenizer.eos_token_id, 7, 9, 11]


@pytest.mark.parametrize("column", ["prompts", "completions", "completion_ids", "trainer_state"])
def test_a_column_named_like_a_reward_argument_is_refused(tmp_path, make_model, tokenizer, column):
    rows = Dataset.from_list([{"prompt": "1+1=", column: "2"}])
    with pytest.raises(ValueError, match=rf"train_dataset has a column named '{column}'.*Rename the column"):
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), train_dataset=rows, processing_class=tokenizer)
    with pytest.raises(ValueError, match=rf"eval_dataset has a column named '{column}'"):
        RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), train_dataset=Dataset.from_list([{"prompt": "1"}]),
                    eval_dataset=rows, processing_class=tokenizer)


QWEN3_STYLE_TEMPLATE = (  # Qwen3's generation prompt: with enable_thinking=False it closes an empty think block
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{% endif %}"
)


def test_thinking_answer_reward_with_thinking_on_and_off(tokenizer):
    from rloo.cli import resolve_reward_func
    from rloo.rewards import thinking_answer_reward

    qwen3 = copy.deepcopy(tokenizer)
    qwen3.chat_template = QWEN3_STYLE_TEMPLATE
    prompt = [{"role": "user", "content": "2+2="}]
    ids = lambda text: qwen3(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    completions = [ids("4"), ids("<think>2+2 is 4</think>4"), ids("5"), ids("<think>still thinking")]
    off = {"enable_thinking": False}
    assert qwen3.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, **off).endswith("</think>\n\n")

    thinking_off = thinking_answer_reward(qwen3, chat_template_kwargs=off)
    # The prompt closed the think block: the whole completion is the answer (a second block is still skipped).
    assert thinking_off(completion_ids=completions, answer=["4"] * 4, prompts=[prompt] * 4) == [1.0, 1.0, 0.0, 0.0]
    thinking_on = thinking_answer_reward(qwen3, unclosed_reward=-1.0)
    assert thinking_on(completion_ids=completions, answer=["4"] * 4, prompts=[prompt] * 4) == [-1.0, 1.0, -1.0, -1.0]
    # Plain prompts are read as written; the CLI passes the config's chat_template_kwargs on.
    assert thinking_on(completion_ids=completions[:1], answer=["4"], prompts=["2+2=<think></think>"]) == [1.0]
    from_cli = resolve_reward_func("thinking_answer_reward", qwen3, off)
    assert from_cli(completion_ids=completions[:1], answer=["4"], prompts=[prompt]) == [1.0]

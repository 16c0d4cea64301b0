"""Each prompt once per group (passes.prefix_logprobs): the same no-grad log-probs as running every
row whole, on a rotary (Qwen2) and an absolute-position (GPT-2) model, with left-padded prompts."""

import copy

import pytest
import torch
import transformers
from datasets import Dataset

from conftest import digit_fraction, gpt2_model
from rloo import RLOOConfig, RLOOTrainer
from rloo import rollout as rollout_module
from rloo.passes import prefix_logprobs
from rloo.passes.logprobs import completion_logprobs
from rloo.passes.prefix_logprobs import can_share_prompts, grouped_completion_logprobs, groups_share_prompts

N, K, P, C = 3, 4, 7, 5


@pytest.fixture(params=["qwen2", "gpt2"])
def model(request, make_model, tokenizer):
    return make_model(seed=3).eval() if request.param == "qwen2" else gpt2_model(tokenizer, n_positions=64)


def grouped_batch(vocab: int, completion: int = C):
    """N left-padded prompts of lengths 7, 3, 5, each repeated K times, and right-padded completions
    of lengths 1..completion (pad id 0 at padding, as samplers leave it)."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([7, 3, 5])
    prompt_mask = (torch.arange(P)[None] >= P - lengths[:, None]).long()  # (N, P)
    prompt_ids = torch.randint(3, vocab, (N, P), generator=gen) * prompt_mask
    completion_lengths = torch.randint(1, completion + 1, (N * K,), generator=gen)
    completion_mask = (torch.arange(completion)[None] < completion_lengths[:, None]).long()  # (N*K, C)
    completion_ids = torch.randint(3, vocab, (N * K, completion), generator=gen) * completion_mask
    return prompt_ids.repeat_interleave(K, 0), prompt_mask.repeat_interleave(K, 0), completion_ids, completion_mask


def row_alone(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """(len(completion),) log-probs of one unpadded row with the model's default positions (a slow loop)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double() / temperature
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)


def plain(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature):
    with torch.no_grad():
        logps, _ = completion_logprobs(model, torch.cat([prompt_ids, completion_ids], 1),
                                       torch.cat([prompt_mask, completion_mask], 1), completion_ids.shape[1], temperature)
    return logps


@pytest.mark.parametrize("rows_per_pass", [None, 1, 3, K, 2 * K + 1])
def test_grouped_equals_plain_and_each_row_alone(model, rows_per_pass):
    batch = grouped_batch(model.config.vocab_size)
    grouped = grouped_completion_logprobs(model, *batch, group_size=K, temperature=0.7, rows_per_pass=rows_per_pass)
    torch.testing.assert_close(grouped, plain(model, *batch, 0.7), atol=1e-5, rtol=1e-5)  # padding included
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch
    for row in range(N * K):
        prompt = prompt_ids[row][prompt_mask[row].bool()].tolist()
        completion = completion_ids[row][completion_mask[row].bool()].tolist()
        torch.testing.assert_close(grouped[row, : len(completion)].double(), row_alone(model, prompt, completion, 0.7),
                                   atol=1e-5, rtol=1e-5)


def test_grouped_logits_path_and_one_token_completions(model, monkeypatch):
    batch = grouped_batch(model.config.vocab_size, completion=1)
    want = plain(model, *batch, 1.3)
    monkeypatch.setattr(prefix_logprobs, "reachable_head", lambda model: None)  # the head the tiled path cannot reach
    torch.testing.assert_close(grouped_completion_logprobs(model, *batch, group_size=K, temperature=1.3), want,
                               atol=1e-5, rtol=1e-5)


def test_groups_must_share_their_prompt(make_model):
    prompt_ids, prompt_mask, completion_ids, completion_mask = grouped_batch(50)
    assert groups_share_prompts(prompt_ids, prompt_mask, K)
    assert not groups_share_prompts(prompt_ids, prompt_mask, K + 1)  # B not a multiple of the group size
    assert not groups_share_prompts(prompt_ids, prompt_mask, 2 * K)  # a group spanning two prompts
    shifted = prompt_mask.clone()
    shifted[1, -4] = 0  # row 1 is prompt 0 with one token fewer
    assert not groups_share_prompts(prompt_ids, shifted, K)
    with pytest.raises(ValueError, match="groups of group_size=8"):
        grouped_completion_logprobs(make_model(), prompt_ids, prompt_mask, completion_ids, completion_mask, 2 * K)


def sliding_window_models(vocab: int) -> dict[str, transformers.PreTrainedModel]:
    """Models whose windows (4 and 3 tokens) are shorter than the rows (up to 7 + 5): Qwen2 with every layer
    sliding, Mistral, and a Gemma 3 text model mixing sliding and full layers, each in eager and sdpa attention."""
    small = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=64)
    configs = {"qwen2": transformers.Qwen2Config(**small, use_sliding_window=True, sliding_window=4, max_window_layers=0),
               "mistral": transformers.MistralConfig(**small, sliding_window=4),
               "gemma3": transformers.Gemma3TextConfig(**{**small, "num_hidden_layers": 3}, head_dim=16, sliding_window=3,
                                                       layer_types=["sliding_attention", "full_attention",
                                                                    "sliding_attention"])}
    classes = {"qwen2": transformers.Qwen2ForCausalLM, "mistral": transformers.MistralForCausalLM,
               "gemma3": transformers.Gemma3ForCausalLM}
    models = {}
    for name, config in configs.items():
        for implementation in ("eager", "sdpa"):
            torch.manual_seed(5)
            config._attn_implementation = implementation
            models[f"{name}-{implementation}"] = classes[name](config).eval()
    return models


def test_sliding_window_models_share_with_the_window_applied_over_the_copied_prompt(tokenizer):
    """The copied prompt cache keeps every key and the model's mask applies the window over them, so the grouped
    log-probs equal the whole rows' even with windows shorter than the rows (which do change the log-probs)."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = grouped_batch(len(tokenizer))
    input_ids, attention_mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    for name, model in sliding_window_models(len(tokenizer)).items():
        assert can_share_prompts(model), name
        want, _ = completion_logprobs(model, input_ids, attention_mask, C)
        got = grouped_completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, K)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=name)
        # The window matters here: the same weights with full attention in every layer give other log-probs.
        config = copy.deepcopy(model.config)
        if getattr(config, "layer_types", None):  # Qwen2, Gemma 3: per-layer types
            config.layer_types = ["full_attention"] * config.num_hidden_layers
        else:  # Mistral: one window for every layer
            config.sliding_window = None
        unwindowed = type(model)(config).eval()
        unwindowed.load_state_dict(model.state_dict())
        full, _ = completion_logprobs(unwindowed, input_ids, attention_mask, C)
        assert (full - want).abs().max() > 1e-3, name


def test_a_sliding_window_under_a_kernel_and_recurrent_layers_are_not_shared(tokenizer):
    """Flash attention applies the window in its kernel (not verified to see the copied prompt as the whole row
    does); Qwen3.5's linear-attention layers keep no keys to copy. A full-attention model under flash is shared."""
    model = sliding_window_models(len(tokenizer))["mistral-sdpa"]
    model.config._attn_implementation = "flash_attention_2"
    assert not can_share_prompts(model)
    with pytest.raises(ValueError, match="sliding-window model runs with attn_implementation 'sdpa' or 'eager'.*"
                                         "not 'flash_attention_2'"):
        prefix_logprobs.check_shared_prompt_model(model)
    model.config.sliding_window = None
    assert can_share_prompts(model)
    config = transformers.Qwen3_5TextConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)
    assert not can_share_prompts(transformers.Qwen3_5ForCausalLM(config))


def spy_grouped(monkeypatch) -> list:
    """Count the collector's calls of grouped_completion_logprobs."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0])
        return grouped_completion_logprobs(*args, **kwargs)

    monkeypatch.setattr(rollout_module, "grouped_completion_logprobs", counted)
    return calls


ROWS = [{"prompt": "1+1="}, {"prompt": "12+34+5="}]


def test_rollout_reference_and_old_passes_share_prompts(tmp_path, make_model, tokenizer, monkeypatch):
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=2, gradient_accumulation_steps=2,
                      num_generations=4,
                      max_completion_length=5, beta=0.1, num_iterations=2, temperature=0.7, max_steps=1,
                      save_steps=0, seed=0)
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=Dataset.from_list(ROWS),
                          processing_class=tokenizer)
    reference = make_model(seed=1)
    trainer.collector.reference = reference
    calls = spy_grouped(monkeypatch)
    rollout, _ = trainer.collector.collect(ROWS, trainer.global_step, trainer.episode)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    assert calls == [policy, reference]  # pi_old (num_iterations 2) and pi_ref, each prompt once
    batch = (rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask)
    torch.testing.assert_close(rollout.old_logps, plain(policy, *batch, 0.7), atol=1e-5, rtol=1e-5)
    ref = plain(reference, *batch, 0.7)
    torch.testing.assert_close(rollout.seq_kl, ((rollout.old_logps - ref) * rollout.completion_mask).sum(1),
                               atol=1e-5, rtol=1e-5)


def test_lora_reference_pass_shares_prompts_with_adapters_disabled(tmp_path, make_model, tokenizer, monkeypatch):
    peft = pytest.importorskip("peft")
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=5, beta=0.1, kl_estimator="k1", max_steps=1, save_steps=0, seed=0)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = RLOOTrainer(make_model(), digit_fraction, args=args, train_dataset=Dataset.from_list(ROWS),
                          processing_class=tokenizer, peft_config=lora)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    with torch.no_grad():  # adapters that move the policy away from the base
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    sampled = trainer.collector.sample([row["prompt"] for row in ROWS])
    calls = spy_grouped(monkeypatch)
    with trainer.collector.reference_model() as reference:
        got = trainer.collector.logprobs(reference, sampled)
        batch = (sampled.prompt_ids, sampled.prompt_mask, sampled.completion_ids, sampled.completion_mask)
        want = plain(reference, *batch, 1.0)
    assert len(calls) == 1
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (plain(policy, *batch, 1.0) - want).abs().max() > 1e-3  # the adapters were off for the reference


def test_the_kv_cache_goes_by_the_name_the_model_takes(make_model):
    """transformers 5.24 renamed forward's `past_key_values` to `cache` (the old name warns, and goes in 5.40):
    rloo's cache passes use whichever name the model's forward has, through DDP and PEFT wrappers."""
    import inspect

    from peft import LoraConfig, get_peft_model

    from rloo.passes.logprobs import cache_argument

    model = make_model()
    parameters = inspect.signature(type(model).forward).parameters
    expected = "cache" if "cache" in parameters and "past_key_values" not in parameters else "past_key_values"
    assert cache_argument(model) == expected
    assert cache_argument(get_peft_model(make_model(), LoraConfig(r=2, target_modules=["q_proj"]))) == expected

    class Wrapped(torch.nn.Module):  # what DDP and accelerate's wrapping look like from outside
        def __init__(self, module):
            super().__init__()
            self.module = module

    assert cache_argument(Wrapped(model)) == expected

    class OlderModel(torch.nn.Module):  # transformers before the rename, or remote code
        def forward(self, input_ids, past_key_values=None, use_cache=None):
            return input_ids

    assert cache_argument(OlderModel()) == "past_key_values"


def test_no_grad_passes_take_whole_rows_on_cuda_and_grouped_elsewhere():
    """Issue #46: on CUDA the whole rows keep SDPA's flash kernel (no mask); elsewhere the prompt runs once a group."""
    from rloo.passes.prefix_logprobs import grouped_pays

    assert grouped_pays(torch.device("cpu")) and grouped_pays("cpu")
    assert not grouped_pays(torch.device("cuda")) and not grouped_pays("cuda:0")


def test_reference_is_bf16_only_for_bf16_autocast_on_cuda(make_model):
    """The frozen reference's parameters go to bf16 (buffers such as inv_freq stay fp32) under bf16 on CUDA only."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from rloo.distributed.sharding import reference_in_compute_dtype

    def accelerator(device, precision, kind=DistributedType.NO):
        return SimpleNamespace(device=torch.device(device), mixed_precision=precision, distributed_type=kind)

    for kept in (accelerator("cpu", "bf16"), accelerator("cuda", "no"), accelerator("cuda", "bf16", DistributedType.FSDP)):
        model = make_model()
        assert all(p.dtype == torch.float32 for p in reference_in_compute_dtype(model, kept).parameters())
    model = reference_in_compute_dtype(make_model(), accelerator("cuda", "bf16"))
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    frequencies = [b for name, b in model.named_buffers() if "inv_freq" in name]
    assert frequencies and all(b.dtype == torch.float32 for b in frequencies)
    assert reference_in_compute_dtype(None, accelerator("cuda", "bf16")) is None

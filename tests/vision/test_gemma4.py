"""Gemma 4's final logit softcap, which it keeps on its text config (`final_logit_softcapping=30.0` in its
checkpoints and in the stand-in), not on the top-level `Gemma4Config`: rloo's tiled LM head must apply it, as the
model's own forward and the fast sampler (which reads the model's logits) do.

The stand-in's logits are small (|z| < 0.06), where the cap does nothing; the LM head (tied to the embeddings) is
scaled 1000x so that they reach the cap (|z| up to 28.5)."""

from __future__ import annotations

import pytest
import standin_vlms
import torch
from test_fast_sampler import _encoded, _sampled_and_training_logprobs, _sampler
from test_token_types import _reference_logprobs, _rows

from rloo.data.images import ImagePromptEncoder, image_token_id
from rloo.passes.logprobs import completion_logprobs, reachable_head

K = 3


def _capped_model():
    model = standin_vlms.model("gemma4").eval()
    assert model.config.get_text_config().final_logit_softcapping == 30.0
    assert getattr(model.config, "final_logit_softcapping", None) is None  # not on the top-level config
    with torch.no_grad():
        model.lm_head.weight.mul_(1000.0)
    return model


def test_the_tiled_head_applies_the_text_configs_softcap():
    model, processor = _capped_model(), standin_vlms.processor("gemma4")
    assert reachable_head(model) is not None  # the tiled path, which computes the logits itself
    row, completion = _rows()[0], [300, 301, 302, 303]
    encoder = ImagePromptEncoder(processor, "image", 4096, image_token_id(model.config, processor))
    prompt_ids, vision = encoder.encode([row])
    ids = torch.tensor([prompt_ids[0] + completion])
    with torch.no_grad():
        logits = model(input_ids=ids, **vision.model_kwargs(ids)).logits
        assert logits.abs().max() > 20  # the cap bends them
        logps, _ = completion_logprobs(model, ids, torch.ones_like(ids), len(completion),
                                       model_inputs=vision.model_kwargs(ids))
        expected = _reference_logprobs(model, processor, row, completion)
    torch.testing.assert_close(logps[0], expected, rtol=1e-4, atol=1e-4)  # 7.6e-6 measured; 20.0 without the cap


def test_the_fast_samplers_logprobs_equal_the_training_pass_with_the_softcap():
    sampled, recomputed = _sampled_and_training_logprobs(_capped_model(), "gemma4")
    torch.testing.assert_close(sampled, recomputed, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("text", [
    {"sliding_window": 16},
    {"num_hidden_layers": 4, "layer_types": ["sliding_attention", "full_attention"] * 2, "num_kv_shared_layers": 2},
], ids=["window_16", "kv_shared"])
def test_sliding_windows_and_shared_kv_layers_in_the_fast_sampler(text):
    """Gemma 4's sliding layers with a window of 16 tokens (the prompts are ~100, each image 63-70 soft tokens; the
    checkpoints' windows are 512 and 1024), and the last two of four layers reusing the KV of the layers before them
    (as the E2B and E4B checkpoints' last layers do): greedy fast decoding gives `generate`'s tokens and the sampled
    tokens' log-probs are the training pass's."""
    import transformers

    from rloo.generation.base import left_pad

    standin = standin_vlms._standin("gemma4")
    config = transformers.Gemma4Config(**{**standin.config, "text_config": {**standin.config["text_config"], **text}})
    model = transformers.Gemma4ForConditionalGeneration(config)
    standin_vlms.vlm_standins.init_small_weights(model, 0)
    model.eval()
    tokenizer, prompt_ids, vision = _encoded("gemma4", model)
    assert min(map(len, prompt_ids)) > 4 * 16
    fast = _sampler(tokenizer, do_sample=False, max_new_tokens=12).sample(model, prompt_ids, K, vision=vision)
    ids, mask = left_pad([p for p in prompt_ids for _ in range(K)], tokenizer.pad_token_id)
    generated = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12,
                               eos_token_id=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                               suppress_tokens=[vision.image_token_id], **vision.model_kwargs(ids))[:, ids.shape[1]:]
    width = fast.completion_ids.shape[1]
    assert torch.equal(fast.completion_ids, generated[:, :width].masked_fill(fast.completion_mask == 0,
                                                                             tokenizer.pad_token_id))
    torch.manual_seed(0)
    sampled = _sampler(tokenizer, max_new_tokens=12).sample(model, prompt_ids, K, vision=vision)
    input_ids = torch.cat([sampled.prompt_ids, sampled.completion_ids], dim=1)
    attention_mask = torch.cat([sampled.prompt_mask, sampled.completion_mask], dim=1)
    mask = sampled.completion_mask.bool()
    with torch.no_grad():
        logps, _ = completion_logprobs(model, input_ids, attention_mask, sampled.completion_ids.shape[1],
                                       model_inputs=vision.model_kwargs(input_ids))
        torch.testing.assert_close(sampled.logprobs[mask], logps[mask], atol=1e-5, rtol=1e-5)  # 2e-6 measured
        if "sliding_window" in text:  # the window matters: with a wide one the same rows score otherwise
            config.text_config.sliding_window = 512
            wide, _ = completion_logprobs(model, input_ids, attention_mask, sampled.completion_ids.shape[1],
                                          model_inputs=vision.model_kwargs(input_ids))
            assert (wide[mask] - logps[mask]).abs().max() > 1e-3

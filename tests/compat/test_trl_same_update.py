"""Given the same completions and rewards, rloo and TRL's RLOOTrainer make the same optimizer step.

Both trainers start from identical weights and are handed the same scripted completions (TRL's
generation is replaced on the instance, rloo gets a sampler), so any difference in the update comes
from the advantage, the loss normalisation, clipping or the optimizer. Settings are those of the
toy learning-gap comparison (`benchmarks/learning/learning_curves.py`): K=4, 32 completions a step, beta 0,
lr 3e-5, max_grad_norm 1, one pass per batch; then the gsm8k CPU recipe's shape (temperature 0.8,
two micro-batches a step), with and without rloo's shared-prefix forward.
"""

import pytest
import torch
import torch.optim.optimizer as torch_optimizer
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer
from rloo.generation import SampledBatch, completion_mask_from_eos, left_pad
from rloo.toy import build_char_tokenizer, build_tiny_model

trl = pytest.importorskip("trl")

K = 4
PROMPTS = [f"{a}+{b}=" for a, b in [(1, 2), (3, 4), (10, 5), (7, 7), (12, 30), (9, 1), (25, 25), (4, 40)]]
ANSWERS = [str(eval(p[:-1])) for p in PROMPTS]
# Per prompt, K completions of different lengths and correctness, so every group has reward spread.
SCRIPT = {p: [a, a + "1", "0", a[::-1] + "99"] for p, a in zip(PROMPTS, ANSWERS)}
# With a completion that is EOS alone and one cut at max_completion_length (8 tokens, no EOS): both in the loss.
SCRIPT_SHORT_AND_TRUNCATED = {p: [a, "", "12345678", a + "1"] for p, a in zip(PROMPTS, ANSWERS)}
SETTINGS = dict(per_device_train_batch_size=32, gradient_accumulation_steps=1, num_generations=K,
                max_completion_length=8, temperature=1.0, learning_rate=3e-5, lr_scheduler_type="linear",
                warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, beta=0.0, num_iterations=1, epsilon=0.2,
                max_steps=1, seed=0, bf16=False, logging_steps=1)


def reward(prompts, completions, answer, **kwargs):
    """1 for the right sum plus a length term, so rewards differ within every group."""
    return [float(c == a) + 0.1 * len(c) for c, a in zip(completions, answer)]


def scripted_ids(tokenizer, prompt_text: str, k: int, script: dict = SCRIPT) -> list[int]:
    """Completion k of the prompt: its text's tokens and EOS, cut at max_completion_length (8) as a sampler cuts."""
    ids = tokenizer(script[prompt_text][k], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return ids[: SETTINGS["max_completion_length"]]


class ScriptSampler:
    """rloo's side: each prompt's K scripted completions, in order."""

    def __init__(self, tokenizer, script: dict = SCRIPT):
        self.tokenizer, self.script = tokenizer, script

    def sample(self, model, prompts, num_generations):
        texts = [self.tokenizer.decode(p, skip_special_tokens=True) for p in prompts]
        ids = [scripted_ids(self.tokenizer, t, k, self.script) for t in texts for k in range(num_generations)]
        width = max(map(len, ids))
        completion_ids = torch.tensor([s + [self.tokenizer.pad_token_id] * (width - len(s)) for s in ids])
        completion_mask, has_eos = completion_mask_from_eos(completion_ids, [self.tokenizer.eos_token_id])
        prompt_ids, prompt_mask = left_pad([p for p in prompts for _ in range(num_generations)], self.tokenizer.pad_token_id)
        return SampledBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, has_eos)

    def on_optimizer_step(self, model):
        pass


def trl_scripted_generation(tokenizer, script: dict = SCRIPT):
    """TRL's side: replaces `_generate_single_turn`; rows arrive as each prompt's K copies in a row."""

    def generate(prompt_ids, images=None, multimodal_fields=None):
        seen: dict[str, int] = {}
        out = []
        for ids in prompt_ids:
            text = tokenizer.decode(ids, skip_special_tokens=True)
            out.append(scripted_ids(tokenizer, text, seen.get(text, 0), script))
            seen[text] = seen.get(text, 0) + 1
        return out

    return generate


def train(system: str, tmp_path, tokenizer, settings: dict, rloo_only: dict, script: dict = SCRIPT):
    """(pre-clip gradient norm of every step, the last step's clipped gradients by name, parameters at the end)
    of one trainer."""
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64)
    names = {id(p): n for n, p in model.named_parameters()}
    dataset = Dataset.from_dict({"prompt": PROMPTS, "answer": ANSWERS})
    output_dir = str(tmp_path / system)
    if system == "trl":
        config = trl.RLOOConfig(output_dir=output_dir, **settings, gradient_checkpointing=False, disable_dropout=True,
                                use_vllm=False, report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True,
                                top_k=0, top_p=1.0)
        trainer = trl.RLOOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                                  processing_class=tokenizer)
        trainer._generate_single_turn = trl_scripted_generation(tokenizer, script)
    else:
        config = RLOOConfig(output_dir=output_dir, **settings, **rloo_only, save_steps=0, top_k=0, top_p=1.0)
        trainer = RLOOTrainer(model, reward, args=config, train_dataset=dataset, processing_class=tokenizer,
                              sampler=ScriptSampler(tokenizer, script))
    grads = {}

    def capture(optimizer, args, kwargs):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None and id(p) in names:
                    grads[names[id(p)]] = p.grad.detach().clone()

    handle = torch_optimizer.register_optimizer_step_pre_hook(capture)
    try:
        trainer.train()
    finally:
        handle.remove()
    grad_norms = [float(e["grad_norm"]) for e in trainer.state.log_history if "grad_norm" in e]
    assert len(grad_norms) == settings["max_steps"]
    return grad_norms, grads, {n: p.detach().clone() for n, p in model.named_parameters()}


# The toy comparison's settings; then the gsm8k CPU recipe's shape (temperature 0.8, the step's completions in
# two micro-batches), with rloo's shared-prefix forward on and off (TRL has no counterpart).
RECIPE_SHAPE = dict(temperature=0.8, per_device_train_batch_size=16, gradient_accumulation_steps=2)


@pytest.mark.parametrize("overrides,rloo_only", [({}, {}), (RECIPE_SHAPE, {}),
                                                  (RECIPE_SHAPE, {"shared_prefix_forward": True})],
                         ids=["toy", "recipe-shape", "recipe-shape-shared-prefix"])
def test_same_completions_and_rewards_give_the_same_step(tmp_path, overrides, rloo_only):
    tokenizer = build_char_tokenizer(add_bos=True)
    settings = {**SETTINGS, **overrides}
    (trl_norm,), trl_grads, trl_params = train("trl", tmp_path, tokenizer, settings, {})
    (rloo_norm,), rloo_grads, rloo_params = train("rloo", tmp_path, tokenizer, settings, rloo_only)
    assert trl_norm > 1.0  # the gradient was clipped, as it is in the toy comparison
    assert rloo_norm == pytest.approx(trl_norm, rel=1e-4)  # same loss scale before clipping
    assert rloo_grads.keys() == trl_grads.keys() and trl_grads
    for name in trl_grads:
        torch.testing.assert_close(rloo_grads[name], trl_grads[name], rtol=1e-4, atol=1e-7, msg=name)
    moved = max(float((trl_params[n] - p).abs().max()) for n, p in build_tiny_model(
        tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64).named_parameters())
    assert moved > 1e-5  # the step did change the weights
    # Adam's first step is lr * g / (|g| + eps): where |g| is near eps (1e-8) it turns the gradients' rounding
    # differences (the two micro-batches and the shared prefix sum in another order) into up to ~4e-7 of a
    # 3e-5 step, so the recipe-shaped cases compare weights to 2e-6; their gradients are held to 1e-4 above.
    atol = 1e-7 if not overrides else 2e-6
    for name in trl_params:
        torch.testing.assert_close(rloo_params[name], trl_params[name], rtol=1e-5, atol=atol, msg=name)


def test_same_completions_over_several_steps_with_short_and_truncated_ones_give_the_same_weights(tmp_path):
    """Three steps at a constant learning rate (issue #52's settings): each group holds the right answer, a
    completion that is EOS alone, one cut at max_completion_length without EOS, and a wrong one. The same
    completions must give the same gradient norm at every step (the loss weights of short and truncated
    completions) and the same weights after three AdamW steps (the rate applied at each step, the optimizer's
    state across steps)."""
    tokenizer = build_char_tokenizer(add_bos=True)
    settings = {**SETTINGS, "max_steps": 3, "lr_scheduler_type": "constant"}
    trl_norms, _, trl_params = train("trl", tmp_path, tokenizer, settings, {}, SCRIPT_SHORT_AND_TRUNCATED)
    rloo_norms, _, rloo_params = train("rloo", tmp_path, tokenizer, settings, {}, SCRIPT_SHORT_AND_TRUNCATED)
    assert len(tokenizer("12345678", add_special_tokens=False)["input_ids"]) == SETTINGS["max_completion_length"]
    assert min(trl_norms) > 1.0  # every step clipped, as in the comparison
    assert rloo_norms == pytest.approx(trl_norms, rel=1e-4)
    for name in trl_params:
        torch.testing.assert_close(rloo_params[name], trl_params[name], rtol=1e-5, atol=1e-6, msg=name)

"""TRL's losses in rloo: the MoE router load-balancing loss (router_aux_loss_coef) and evaluate()'s
eval_loss, checked by hand."""

import pytest

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer


def _config(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=4, learning_rate=3e-3, beta=0.0, max_steps=2, logging_steps=1,
                  save_steps=0, seed=0, report_to="none")
    return RLOOConfig(**{**values, **overrides})


def _tiny_moe(tokenizer, seed=0):
    import torch
    import transformers

    config = transformers.Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=32, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, head_dim=8,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(seed)
    return transformers.Qwen3MoeForCausalLM(config)


def test_router_aux_loss_joins_the_gradient_by_hand(tmp_path, tokenizer, digit_dataset):
    """grad(step loss with coef c) == grad(step loss without) + c * grad(the model's own aux_loss), per micro-batch
    averaged over the step's micro-batches; the logged aux_loss is that mean."""
    import torch

    coef = 0.5
    grads, logged = {}, {}
    for c in (0.0, coef):
        extra = {"router_aux_loss_coef": c} if c else {}
        args = _config(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=1, **extra)
        trainer = RLOOTrainer(_tiny_moe(tokenizer), digit_fraction, args=args, train_dataset=digit_dataset,
                              processing_class=tokenizer)
        assert trainer.aux_loss_enabled is bool(c)
        torch.manual_seed(1)
        rollout, _ = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
        trainer.optimizer.zero_grad()
        stats = trainer.learner.accumulate_gradients(rollout)
        grads[c] = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        logged[c] = stats.get("aux_loss")
        if c:
            model, micro_aux = trainer.model, []
            model.zero_grad()
            for index in range(2):  # the model's own router loss on each micro-batch, by plain forward
                micro = rollout.micro_batch(index * 4, 4)
                out = model(input_ids=torch.cat([micro.prompt_ids, micro.completion_ids], 1),
                            attention_mask=torch.cat([micro.prompt_mask, torch.ones_like(micro.completion_mask)], 1),
                            output_router_logits=True)
                micro_aux.append(out.aux_loss)
            (coef * sum(micro_aux) / 2).backward()
            direct = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert logged[0.0] is None and logged[coef] == pytest.approx(float(sum(micro_aux) / 2), rel=1e-4)
    router = [n for n in direct if "mlp.gate" in n]
    assert router  # the router weights get the aux gradient
    for name in router:
        torch.testing.assert_close(grads[coef][name], grads[0.0].get(name, 0 * direct[name]) + direct[name],
                                   rtol=1e-4, atol=1e-6)


def test_router_aux_loss_is_logged_in_training(tmp_path, tokenizer, digit_dataset):
    trainer = RLOOTrainer(_tiny_moe(tokenizer), digit_fraction, args=_config(tmp_path, router_aux_loss_coef=0.01),
                          train_dataset=digit_dataset, processing_class=tokenizer)
    trainer.train()
    assert trainer.aux_loss_enabled and trainer.state.log_history[-1]["aux_loss"] > 0


def test_eval_loss_by_hand():
    import torch

    from rloo.evaluation import policy_loss_at_ratio_one

    scores = torch.tensor([[1.0, 0.0, 0.0], [2.0, 2.0, 5.0]])  # two prompts, three samples each
    lengths = torch.tensor([[2, 1, 3], [1, 1, 2]])
    valid = torch.ones(2, 3, dtype=torch.bool)
    # leave-one-out advantages: r_i - mean of the others
    a = [1.0, -0.5, -0.5, -1.5, -1.5, 3.0]
    length = [2, 1, 3, 1, 1, 2]
    # seq-mean-token-sum: mean over completions of -A_i * L_i
    expected = sum(-ai * li for ai, li in zip(a, length)) / 6
    assert policy_loss_at_ratio_one(scores, valid, lengths, "rloo", "seq-mean-token-sum", 8) == pytest.approx(expected)
    # token-mean: -sum A_i L_i / sum L_i
    expected = sum(-ai * li for ai, li in zip(a, length)) / sum(length)
    assert policy_loss_at_ratio_one(scores, valid, lengths, "rloo", "token-mean", 8) == pytest.approx(expected)


def test_evaluate_returns_trl_eval_loss(tmp_path, make_model, tokenizer, digit_dataset):
    trainer = RLOOTrainer(make_model(), digit_fraction, args=_config(tmp_path), train_dataset=digit_dataset,
                          processing_class=tokenizer)
    metrics = trainer.evaluate({"a": digit_dataset.select(range(4))})
    assert metrics["eval_a_loss"] == metrics["eval_a/loss"] and metrics["eval_a_loss"] == metrics["eval_a_loss"]

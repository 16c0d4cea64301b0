"""Reward models: a tiny local sequence classifier scores like a manual forward pass, in the trainer too."""

import json

import pytest
import torch
import transformers

from conftest import digit_fraction
from rloo import RLOOConfig, RLOOTrainer
from rloo.rewards.reward_model import RewardModel


def _classifier(tokenizer, num_labels=1, seed=0):
    config = transformers.Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, intermediate_size=32,
                                      num_labels=num_labels, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return transformers.Qwen2ForSequenceClassification(config).eval()


def _manual_score(model, tokenizer, text):
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        return model(input_ids=ids).logits[0, 0].item()  # one unpadded sequence: no masking to get wrong


def test_scores_equal_a_manual_forward_pass_in_padded_batches(tokenizer):
    model = _classifier(tokenizer)
    reward_model = RewardModel(model, tokenizer, batch_size=2)  # batches of 2 with very different lengths
    conversation = [{"role": "user", "content": "hi"}]
    prompts = ["1+1=", conversation, "a much longer prompt than the others", "7"]
    completions = ["2", [{"role": "assistant", "content": "yo"}], "x", "8 and then some more"]
    scores = reward_model(prompts=prompts, completions=completions)
    texts = ["1+1=2", "user: hi\nassistant: yo\n", "a much longer prompt than the othersx", "78 and then some more"]
    assert reward_model.texts(prompts, completions) == texts  # conversations go through the chat template
    for score, text in zip(scores, texts):
        assert score == pytest.approx(_manual_score(model, tokenizer, text), abs=1e-5)
    assert len(set(round(s, 6) for s in scores)) == 4
    assert not any(p.requires_grad for p in model.parameters())


def test_a_classifier_with_several_labels_is_rejected(tokenizer):
    with pytest.raises(ValueError, match="num_labels=2"):
        RewardModel(_classifier(tokenizer, num_labels=2), tokenizer)


def test_trainer_loads_a_reward_model_by_path_next_to_a_function(tmp_path, make_model, tokenizer, digit_dataset):
    classifier = _classifier(tokenizer)
    classifier.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=4, beta=0.0, max_steps=1, logging_steps=1, save_steps=0,
                      reward_weights=[1.0, 0.5])
    trainer = RLOOTrainer(make_model(), [str(tmp_path / "rm"), digit_fraction], args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer)
    reward_model = trainer.reward_functions[0].func
    assert isinstance(reward_model, RewardModel) and reward_model.__name__ == "rm"
    rollout, samples = trainer.collector.collect([digit_dataset[i] for i in range(2)], trainer.global_step, trainer.episode)
    expected = [_manual_score(classifier, reward_model.tokenizer, p + c)  # with the reward model's own tokenizer
                for p, c in zip(samples.prompts, samples.completions)]
    torch.testing.assert_close(rollout.reward_columns[:, 0], torch.tensor(expected), atol=1e-5, rtol=0)
    torch.testing.assert_close(rollout.scores, rollout.reward_columns[:, 0] + 0.5 * rollout.reward_columns[:, 1])
    trainer.train()
    logged = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"rewards/rm/mean", "rewards/rm/std", "rewards/digit_fraction/mean"} <= logged.keys()


def test_trainer_takes_a_loaded_model_with_its_processing_class(tmp_path, make_model, tokenizer, digit_dataset):
    args = RLOOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=4, beta=0.0, max_steps=1, save_steps=0)
    classifier = _classifier(tokenizer, seed=1)
    trainer = RLOOTrainer(make_model(), [digit_fraction, classifier], args=args, train_dataset=digit_dataset,
                          processing_class=tokenizer, reward_processing_classes=[None, tokenizer])
    assert trainer.reward_functions[1].func.model is classifier
    with pytest.raises(ValueError, match="reward_processing_classes has 1 entries for 2"):
        RLOOTrainer(make_model(), [digit_fraction, classifier], args=args, train_dataset=digit_dataset,
                    processing_class=tokenizer, reward_processing_classes=[tokenizer])


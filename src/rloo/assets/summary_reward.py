"""An offline TL;DR task: summarise a GSM8K problem in one sentence, scored by a reward model trained here.

There is no TL;DR data or summarisation reward model offline, so the CPU `tldr` recipe uses GSM8K's
problems as the posts and a reward model built from SmolLM2-135M-Instruct on a preference signal we
state, not learned from people:

    preferred:  the post's own question sentence (the sentence that asks what to find), and
    rejected:   (a) the whole post copied back, and (b) the question sentence of another post.

So the reward model learns "short, and about this post". It is SmolLM2 as an
`AutoModelForSequenceClassification` (num_labels=1) whose backbone is frozen and whose score head
is fitted to those pairs (a Bradley-Terry logistic loss on the difference of the scored positions'
hidden states): a linear probe, minutes on CPU, loadable by `--reward_funcs path/to/folder` like any
Hub reward model. Its pair accuracy on held-out posts is printed when it is built.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

INSTRUCTION = "Write a one-sentence TL;DR of this post.\n\n"


def summary_prompt(post: str) -> list[dict]:
    return [{"role": "user", "content": INSTRUCTION + post}]


def question_sentence(post: str) -> str:
    """The sentence of a GSM8K problem that asks what to find (its last sentence)."""
    sentences = [s.strip() for s in re.split(r"(?<=[.?!])\s+", post.strip()) if s.strip()]
    asking = [s for s in sentences if s.endswith("?")]
    return (asking or sentences)[-1]


def preference_pairs(posts: list[str]) -> list[tuple[list[dict], str, str]]:
    """(prompt, preferred, rejected) triples: two per post, as the module docstring states."""
    pairs = []
    for index, post in enumerate(posts):
        other = posts[(index + 1) % len(posts)]
        prompt, preferred = summary_prompt(post), question_sentence(post)
        pairs.append((prompt, preferred, post))                     # (a) copying the post
        pairs.append((prompt, preferred, question_sentence(other)))  # (b) another post's question
    return pairs


def _scored_states(model: Any, reward: Any, prompts: list, completions: list, batch_size: int = 16) -> Any:
    """The backbone's hidden state at the position the score head reads, for each prompt + completion. (N, H)"""
    import torch

    states = []
    texts = reward.texts(prompts, completions)
    for start in range(0, len(texts), batch_size):
        batch = reward.encode(texts[start:start + batch_size], prompts[start:start + batch_size])
        with torch.no_grad():
            hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        last = batch["attention_mask"].sum(dim=1) - 1  # right padding: the last real token
        states.append(hidden[torch.arange(hidden.shape[0]), last])
    return torch.cat(states)


def fit_score_head(preferred: Any, rejected: Any, l2: float = 1e-3, steps: int = 300) -> Any:
    """w minimising mean(-log sigmoid(w . (preferred - rejected))) + l2 |w|^2. preferred, rejected: (N, H) -> w: (H,)"""
    import torch

    difference = (preferred - rejected).double()
    weight = torch.zeros(difference.shape[1], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.softplus(-(difference @ weight)).mean() + l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return weight.detach().float()


def build_summary_reward_model(posts: list[str], held_out_posts: list[str], folder: str | Path,
                               policy_folder: str | Path) -> dict:
    """Fit the score head on `posts`' pairs, save the reward model to `folder`, and return the pair
    accuracy (preferred scored above rejected) on the training and the held-out pairs."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rloo.rewards.reward_model import RewardModel

    tokenizer = AutoTokenizer.from_pretrained(policy_folder)
    model = AutoModelForSequenceClassification.from_pretrained(policy_folder, num_labels=1, dtype=torch.float32)
    reward = RewardModel(model, tokenizer)

    def states(pairs):
        prompts = [p for p, _, _ in pairs]
        return (_scored_states(model, reward, prompts, [good for _, good, _ in pairs]),
                _scored_states(model, reward, prompts, [bad for _, _, bad in pairs]))

    train_good, train_bad = states(preference_pairs(posts))
    weight = fit_score_head(train_good, train_bad)
    with torch.no_grad():
        model.score.weight.copy_(weight[None, :])
    held_good, held_bad = states(preference_pairs(held_out_posts))
    accuracy = {"train_pairs": float(((train_good - train_bad) @ weight > 0).float().mean()),
                "held_out_pairs": float(((held_good - held_bad) @ weight > 0).float().mean())}
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return accuracy

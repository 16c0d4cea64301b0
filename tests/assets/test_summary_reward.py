"""The offline TL;DR task's pieces: the preference pairs as stated, and the score-head fit on hand-made states."""

import torch

from rloo.assets.summary_reward import INSTRUCTION, fit_score_head, preference_pairs, question_sentence

POSTS = ["Ann has 3 cats. Each cat eats 2 cans a day. How many cans do the cats eat in a week?",
         "A train leaves at 3 pm and travels for 2 hours. At what time does it arrive?"]


def test_question_sentence_is_the_last_asking_sentence():
    assert question_sentence(POSTS[0]) == "How many cans do the cats eat in a week?"
    assert question_sentence("Find x. It is 3.") == "It is 3."  # no question mark: the last sentence


def test_each_post_gives_two_pairs_that_prefer_its_own_question():
    pairs = preference_pairs(POSTS)
    assert len(pairs) == 4
    prompt, preferred, rejected = pairs[0]
    assert prompt == [{"role": "user", "content": INSTRUCTION + POSTS[0]}]
    assert preferred == "How many cans do the cats eat in a week?" and rejected == POSTS[0]  # (a) the post copied
    assert pairs[1][2] == "At what time does it arrive?"                                  # (b) another post's question
    assert pairs[3][2] == question_sentence(POSTS[0])                                     # wraps around


def test_the_fitted_head_ranks_preferred_states_higher():
    # Preferred states point along +x, rejected along -x; y is noise both share: w must weigh x positively.
    torch.manual_seed(0)
    noise = torch.randn(32, 1)
    preferred = torch.cat([torch.ones(32, 1) + 0.1 * torch.randn(32, 1), noise], dim=1)   # (N, H=2)
    rejected = torch.cat([-torch.ones(32, 1) + 0.1 * torch.randn(32, 1), noise], dim=1)
    weight = fit_score_head(preferred, rejected)
    assert weight.shape == (2,)
    assert weight[0] > 0 and abs(weight[1]) < 1e-6 < weight[0]  # y's difference is 0: no gradient reaches it
    assert ((preferred - rejected) @ weight > 0).all()

"""The synthetic counting task: deterministic per seed, answers that match the images, the reward, the model's inputs."""

import numpy as np
import pytest

from rloo.toy.vision_task import CELL, MAX_COUNT, build_counting_vlm, count_reward, counting_dataset, square_image


def _cells_with_a_square(image) -> int:
    pixels = np.asarray(image)
    return sum(bool((pixels[r: r + CELL, c: c + CELL] != 255).any()) for r in (0, CELL) for c in (0, CELL))


def test_same_seed_same_rows_other_seed_other_rows():
    first, again, other = counting_dataset(12, seed=3), counting_dataset(12, seed=3), counting_dataset(12, seed=4)
    assert first["answer"] == again["answer"]
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(first["image"], again["image"]))
    assert not all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(first["image"], other["image"]))


def test_every_answer_is_the_number_of_squares_in_its_image():
    data = counting_dataset(64, seed=0)
    assert [str(_cells_with_a_square(image)) for image in data["image"]] == data["answer"]
    assert set(data["answer"]) == {str(n) for n in range(1, MAX_COUNT + 1)}  # every count occurs


def test_square_image_refuses_counts_it_cannot_draw():
    with pytest.raises(ValueError, match="count must be between 1 and 4"):
        square_image(5, np.random.default_rng(0))


def test_reward_is_one_only_for_the_answer_digit():
    completions = [[{"role": "assistant", "content": " 3"}], [{"role": "assistant", "content": "4"}],
                   [{"role": "assistant", "content": "33"}]]
    assert count_reward(completions, answer=["3", "3", "3"]) == [1.0, 0.0, 0.0]


def test_processor_gives_the_model_four_image_tokens_per_image():
    model, processor = build_counting_vlm(seed=0)
    data = counting_dataset(2, seed=0)
    texts = [processor.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in data["prompt"]]
    batch = processor(images=list(data["image"]), text=texts, return_tensors="pt")
    image_id = model.config.image_token_index
    assert (batch["input_ids"] == image_id).sum(dim=1).tolist() == [4, 4]
    assert model(**batch).logits.shape[:2] == batch["input_ids"].shape

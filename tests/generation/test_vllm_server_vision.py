"""Prompts with images through `rloo vllm-serve` (vllm_mode="server"), against vLLM's real CPU engine: the tiny
Idefics3 of test_vllm_vision.py served on 127.0.0.1 with a token (test_vllm_server.py's `serving`), rloo's HTTP
client sending each distinct prompt's images as PNG with its template ids.

Run by scripts/test_vllm.sh (`-k server_vision`); skipped where vLLM is not installed, except with RLOO_REQUIRE_VLLM
set (CI). The HTTP layer's checks without vLLM: test_vllm_server_images.py.
"""

import json
import os

import pytest
import torch

if os.environ.get("RLOO_REQUIRE_VLLM", "").lower() in ("1", "true", "yes"):
    import vllm  # noqa: F401  (CI: a missing vLLM is a failure, not a skip)
else:
    pytest.importorskip("vllm", reason="vLLM is not installed; scripts/test_vllm.sh builds a venv with it")

from test_vllm_server import serving  # noqa: E402
from test_vllm_vision import (  # noqa: E402
    IMAGE_TOKEN,
    K,
    gap_to_engine,
    idefics3_model,
    idefics3_processor,
    pushed_tower_gaps,
    rows,
    two_images_a_prompt,
)

from rloo import RLOOConfig, RLOOTrainer  # noqa: E402
from rloo.data.images import ImagePromptEncoder  # noqa: E402
from rloo.generation.vllm import VLLMSampler  # noqa: E402
from rloo.generation.vllm_client import HTTPEngine, ServerError  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("idefics3_served")
    model, processor = idefics3_model(), idefics3_processor()
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    model.config._name_or_path = str(folder)
    with serving(folder) as url:
        args = RLOOConfig(output_dir=str(folder / "out"), sampler="vllm", vllm_mode="server", vllm_server_base_url=url,
                          vllm_server_timeout=300, max_completion_length=8, temperature=1.0)
        tokenizer = processor.tokenizer
        sampler = VLLMSampler(pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                              max_new_tokens=8, args=args)
        encoder = ImagePromptEncoder(processor, "image", 512, IMAGE_TOKEN)
        prompt_ids, vision = encoder.encode(rows(2))
        yield model, processor, sampler, prompt_ids, vision, url


def test_server_logprobs_match_the_training_pass_with_the_same_images_and_not_anothers(served):
    model, _, sampler, prompt_ids, vision, _ = served
    rows_vision = vision.repeat(K)
    batch = sampler.sample(model, prompt_ids, K, vision=rows_vision)
    assert batch.completion_ids.shape[0] == len(prompt_ids) * K
    assert batch.completion_mask.sum(1).min() >= 1
    assert not (batch.completion_ids == IMAGE_TOKEN).any()
    swapped = rows_vision.select(range(len(rows_vision.rows)))
    swapped.per_prompt = [vision.per_prompt[1], vision.per_prompt[0]]  # each row gets the other prompt's image tensors
    own, other = gap_to_engine(model, batch, rows_vision), gap_to_engine(model, batch, swapped)
    print(f"server, images: own image {own:.2e}, the other prompt's image {other:.2e}")
    assert own < 1e-4 and other > 1e-2


def test_several_images_per_prompt_through_the_server(served):
    """An `images` column of two images a row: the engine gets both, in order (scored with them swapped, the
    log-probs move)."""
    model, _, sampler, _, _, _ = served
    own, other = two_images_a_prompt(sampler, model)
    print(f"server, two images a prompt: own {own:.2e}, the images swapped {other:.2e}")
    assert own < 1e-4 and other > 1e-2


def test_a_vision_tower_push_through_the_server_reaches_its_engine(served):
    """The push resets the server engine's encoder cache: the same images after the push get the new tower's
    embeddings (without the reset: "Encoder cache miss", or the old embeddings)."""
    model, _, sampler, prompt_ids, vision, _ = served
    gap, stale = pushed_tower_gaps(model, sampler, prompt_ids, vision)
    print(f"server, vision tower x3 pushed: largest log-prob difference {gap:.2e}; against the old tower {stale:.2e}")
    assert gap < 1e-3 and stale > 1e-2  # 1e-3: as the colocate test (larger weights, larger fp32 differences)


def test_a_malformed_image_is_refused_by_name_and_the_server_serves_on(served):
    model, _, sampler, prompt_ids, vision, url = served
    client = HTTPEngine(url, timeout=60, token=os.environ["RLOO_VLLM_TOKEN"])
    body = {"prompts": [vision.template_ids[0]], "n": 1, "params": {"max_tokens": 2}, "images": [["iVBORw0KGgo="]]}
    with pytest.raises(ServerError, match="failed POST /generate: image 0 of prompt 0 is not a PNG image"):
        client.call("POST", "/generate", json.dumps(body).encode())
    body["images"] = [["this is not base64"]]
    with pytest.raises(ServerError, match="image 0 of prompt 0 is not base64"):
        client.call("POST", "/generate", json.dumps(body).encode())
    batch = sampler.sample(model, prompt_ids, 1, vision=vision.repeat(1))  # still serving
    assert gap_to_engine(model, batch, vision.repeat(1)) < 1e-4


def image_dataset(count):
    from datasets import Dataset, Features, Image, Value

    data = rows(count)
    message = [{"role": Value("string"), "content": Value("string")}]
    return Dataset.from_dict({"prompt": [r["prompt"] for r in data], "image": [r["image"] for r in data]},
                             features=Features(prompt=message, image=Image()))


def reward_varied(completions, image, **kwargs):  # differs within a group, so a step moves weights
    assert len(image) == len(completions)
    return [float(sum(map(ord, c[0]["content"])) % 7) for c in completions]


def train_two_steps(served, tmp_path, learning_rate=1e-2, **options):
    """Two RLOOTrainer steps against the server; (trainer, names of the tensors that moved, the engine-vs-policy
    log-prob gap of each step: `sampler/max_abs_log_ratio`)."""
    model, processor, _, _, _, url = served
    args = RLOOConfig(output_dir=str(tmp_path), sampler="vllm", vllm_mode="server", vllm_server_base_url=url,
                      vllm_server_timeout=300, num_generations=2, per_device_train_batch_size=4,
                      max_completion_length=6, max_steps=2, beta=0.0, learning_rate=learning_rate, logging_steps=1,
                      save_strategy="no", report_to="none")
    trainer = RLOOTrainer(model=model.config._name_or_path, reward_funcs=reward_varied, args=args,
                          train_dataset=image_dataset(4), processing_class=processor, **options)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    gaps = [line["sampler/max_abs_log_ratio"] for line in lines if "sampler/max_abs_log_ratio" in line]
    print(f"moved {len(moved)} of {len(before)} tensors ({sum('vision_model' in n for n in moved)} of the vision "
          f"tower's, {sum('lora_' in n for n in moved)} LoRA); engine vs sampling-weights gap per step {gaps}")
    assert trainer.state.global_step == 2 and len(gaps) == 2
    return trainer, before, moved, gaps


# The engine's log-probs differ from the sampling weights' by log(1 - p(image token)) (the engine suppresses it):
# 9.3e-03 at most on step 1 of the full fine-tuning test, where the weights are the saved ones. A step whose push
# missed (or left the adapters out) differs by the step's change as well.
PUSHED_GAP = 3e-2


def test_one_trainer_step_against_the_server_trains_the_vision_tower(served, tmp_path):
    _, _, moved, gaps = train_two_steps(served, tmp_path)
    assert any("vision_model" in n for n in moved)
    # step 2 samples from the weights step 1 pushed, vision tower included
    assert max(gaps) < PUSHED_GAP


def test_lora_on_an_image_dataset_against_the_server(served, tmp_path):
    """LoRA on the language model only (the default with images): only the adapters train, none is on the vision
    tower or the connector, and step 2 samples from the merged adapters that step 1 pushed."""
    from peft import LoraConfig

    trainer, before, _, gaps = train_two_steps(served, tmp_path, learning_rate=5e-2,
                                               peft_config=LoraConfig(r=8, target_modules="all-linear"))
    params = dict(trainer.model.named_parameters())
    trained = [n for n, p in params.items() if p.requires_grad and not torch.equal(before[n], p.detach())]
    assert trained and all("lora_" in n for n in trained)
    assert not [n for n in params if "lora_" in n and ("vision_model" in n or "connector" in n)]
    # the tower has no adapters, so the push's merge and unmerge leave it bit for bit (the merged layers' base
    # weights come back within rounding)
    assert all(torch.equal(before[n], p.detach()) for n, p in params.items() if "vision_model" in n)
    assert max(gaps) < PUSHED_GAP

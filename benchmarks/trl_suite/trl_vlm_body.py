"""TRL's `test_train_vlm` (tests/test_rloo_trainer.py, TestRLOOTrainerVLM) for a family whose TRL stand-in cannot be
built here, run the way the test runs it but with the processor passed in: rloo's image-only test stand-in
(tests/vision/standin_vlms.py: the family's real processor class without its video processor, which needs
torchvision), since `AutoProcessor.from_pretrained` on the model id would load the video processor.

The test's settings: the zen-image prompts (trl_suite/vlm_standins.py), learning_rate=0.1, 2 rows a batch,
num_generations=2, max_completion_length=8, one epoch; the model given as a folder (bfloat16 weights, as the Hub
stand-ins), bf16=False (CPU). Passes, as TRL's test does, when a train_loss is logged and every parameter changed.

    python benchmarks/trl_suite/trl_vlm_body.py --family gemma4 --trainer rloo   # or --trainer trl (TRL 1.16)
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "vision"), str(ROOT / "benchmarks" / "trl_suite")]
import standin_vlms  # noqa: E402
from standins import zen_prompts  # noqa: E402
from vlm_standins import zen_image_datasets  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="gemma4", choices=sorted(standin_vlms.FAMILIES))
    parser.add_argument("--trainer", default="rloo", choices=["rloo", "trl"])
    args = parser.parse_args()
    if args.trainer == "trl":
        from trl import RLOOConfig, RLOOTrainer
    else:
        from rloo import RLOOConfig, RLOOTrainer
    dataset = zen_image_datasets(zen_prompts())["zen-image"]["conversational_prompt_only"]["train"]

    def reward_func(completions, **kwargs):
        return [float(len(completion[0]["content"])) for completion in completions]

    with tempfile.TemporaryDirectory() as folder:
        standin_vlms.model(args.family).to(torch.bfloat16).save_pretrained(f"{folder}/model")
        config = RLOOConfig(output_dir=f"{folder}/run", learning_rate=0.1, per_device_train_batch_size=2,
                            num_generations=2, max_completion_length=8, report_to="none", bf16=False)
        trainer = RLOOTrainer(model=f"{folder}/model", reward_funcs=reward_func, args=config, train_dataset=dataset,
                              processing_class=standin_vlms.processor(args.family))
        before = {name: param.clone() for name, param in trainer.model.named_parameters()}
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        loss = trainer.state.log_history[-1].get("train_loss")
        unchanged = [name for name, param in before.items() if torch.equal(param, trainer.model.get_parameter(name))]
    print(f"{args.trainer} on {args.family}: train_loss {loss}, {len(before)} parameters, unchanged {unchanged}, "
          f"{trainer.state.global_step} steps in {seconds:.1f} s")
    ok = loss is not None and not unchanged
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

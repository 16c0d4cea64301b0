"""Run by test_eval_distributed.py, once as one plain process and once under torchrun with two: evaluate
two eval sets (5 prompts: uneven over 2 processes; 1 prompt: one process gets none) with greedy
sampling (top_k=1), record what every process scored, and log one eval step through training at
learning rate 1e-30 (no fp32 weight moves, so the logged eval is the same model's)."""

import json
import sys
from pathlib import Path

import torch
from datasets import Dataset

from rloo import RLOOConfig, RLOOTrainer
from rloo.toy import build_char_tokenizer, build_tiny_model

torch.set_num_threads(1)
out = Path(sys.argv[1])
NUM_GENERATIONS_EVAL = 4
tokenizer = build_char_tokenizer()
model = build_tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                         intermediate_size=64)
# Every prompt has 5 characters, so no batch pads a prompt and greedy decoding cannot depend on the split.
# This tiny random model repeats a prompt's last character greedily ("1+1=2" -> "222222"), so the stop
# strings below end some completions early: "1+1=2" after 2 tokens, "3+1=4" after 1; the rest run to 6.
train = Dataset.from_list([{"prompt": f"{a}+{b}={a + b}", "answer": str(a + b)} for a in range(5) for b in range(5)])
five = Dataset.from_list([{"prompt": f"{a}+1={a + 1}", "answer": str(a + 1)} for a in range(5)])  # answers 1..5
one = Dataset.from_list([{"prompt": "7+2=9", "answer": "9"}])
scored: list[dict] = []  # (prompt, completion ids) of every completion this process scored


def first_c_correct(prompts, completion_ids, answer, **kwargs):
    """1 for the first c = answer mod (n + 1) completions of each group of n, else 0: a correct/incorrect
    reward whose count c per prompt is known in advance (answers 1..5 give c = 1, 2, 3, 4, 0)."""
    n = NUM_GENERATIONS_EVAL
    scored.extend({"prompt": p, "ids": ids} for p, ids in zip(prompts, completion_ids))
    return [float(i % n < int(a) % (n + 1)) for i, a in enumerate(answer)]


def completion_tokens(completion_ids, **kwargs):
    """A graded reward: the completion's length in tokens."""
    return [float(len(ids)) for ids in completion_ids]


args = RLOOConfig(output_dir=str(out / "run"), per_device_train_batch_size=4, num_generations=2,
                  num_generations_eval=NUM_GENERATIONS_EVAL, max_completion_length=6, top_k=1, stop_strings=["22", "4"],
                  learning_rate=1e-30,
                  max_steps=1, eval_steps=1, logging_steps=1, save_steps=0, seed=0)
trainer = RLOOTrainer(model, [first_c_correct, completion_tokens], args=args, train_dataset=train,
                      eval_dataset={"five": five, "one": one}, processing_class=tokenizer)
metrics = trainer.evaluate()
evaluated, samples = list(scored), trainer.eval_samples
trainer.train()  # lr 1e-30 moves no fp32 weight: the eval logged at step 1 is of the same weights
rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
(out / f"rank{rank}.json").write_text(json.dumps({
    "num_processes": world, "metrics": metrics, "scored": evaluated, "samples": samples,
    "prompts_per_step": args.prompts_per_step, "eos_token_id": tokenizer.eos_token_id,
}))

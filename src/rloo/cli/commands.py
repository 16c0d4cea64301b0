"""`rloo eval` and `rloo report`: the commands that look at a model or a run after training."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Sequence

from rloo.config import ConfigError


def run_eval(argv: Sequence[str]) -> dict[str, float]:
    """`rloo eval --model PATH --config run.yaml [flags]`: the eval metrics of a saved model or
    checkpoint on the config's eval split (its train split when there is none)."""
    from transformers import AutoTokenizer

    from rloo.cli.parser import parse_train_args
    from rloo.cli.rewards import resolve_reward_func
    from rloo.data.loading import load_prompt_dataset
    from rloo.run.metrics import format_value
    from rloo.run.safe_text import visible
    from rloo.trainer import RLOOTrainer

    parser = argparse.ArgumentParser(
        prog="rloo eval", allow_abbrev=False,
        description="Evaluate a saved model or checkpoint: eval/ metrics (reward, per-function rewards, lengths, "
                    "truncation, pass@k) of num_generations_eval samples per prompt. Every other flag is "
                    "rloo train's (rloo train --help); --model replaces model_name_or_path.")
    parser.add_argument("--model", required=True, help="A directory written by save_model or a checkpoint-N.")
    options, rest = parser.parse_known_args(argv)
    script, config, _ = parse_train_args(rest)
    if not script.dataset_name or not script.reward_funcs:
        raise ConfigError("rloo eval needs --dataset_name and --reward_funcs (as flags or YAML keys).")
    # Nothing is trained: no tracker run is opened and the run length is irrelevant.
    config = dataclasses.replace(config, report_to="none", save_steps=0)
    split = script.eval_split or script.dataset_split
    dataset = load_prompt_dataset(script.dataset_name, split, script.dataset_config)
    from rloo import builders, model_loading

    builders.check_model_name(options.model)
    tokenizer = model_loading.from_pretrained(AutoTokenizer.from_pretrained, options.model, "model")
    trainer = RLOOTrainer(model=options.model, args=config, processing_class=tokenizer,
                          reward_funcs=[resolve_reward_func(spec, tokenizer) for spec in script.reward_funcs],
                          train_dataset=dataset, eval_dataset=dataset)
    metrics = trainer.evaluate()
    if trainer.accelerator.is_main_process:
        for name, value in metrics.items():
            print(visible(f"{name:<40} {format_value(value)}"))  # names hold reward functions' names
        out = Path(config.output_dir) / "eval_results.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"model": options.model, "split": split, **metrics}, indent=2))
        print(visible(f"eval metrics of {options.model} on {script.dataset_name} [{split}] written to {out}"))
    return metrics


def run_report(argv: Sequence[str]) -> Path:
    """`rloo report RUN_DIR`: write RUN_DIR/report.html (see `report`) and print its path."""
    from rloo.run.report import build_report

    parser = argparse.ArgumentParser(prog="rloo report", description="Write RUN_DIR/report.html: plots of the run "
                                     "against episodes, its config and sample completions, in one self-contained page.")
    parser.add_argument("run_dir", help="A run's output_dir (holding metrics.jsonl).")
    options = parser.parse_args(argv)
    try:
        path = build_report(options.run_dir)
    except (FileNotFoundError, ImportError) as error:
        raise ConfigError(str(error)) from None
    print(f"report written to {path.resolve()}")
    return path

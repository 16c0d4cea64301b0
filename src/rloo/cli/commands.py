"""`rloo eval` and `rloo report`: the commands that look at a model or a run after training."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from rloo.config import ConfigError


def run_eval(argv: Sequence[str]) -> dict[str, float]:
    """`rloo eval --model PATH --config run.yaml [flags]`: the eval metrics of a saved model or checkpoint on
    the config's eval_split, else the data's held-out split ("test", else "validation"), else (with a
    warning) its training split; max_eval_samples keeps the first N prompts. Says what it scores first."""

    from rloo.cli.parser import parse_train_args
    from rloo.cli.rewards import resolve_reward_func, tool_arguments
    from rloo.data.loading import first_rows, held_out_split, load_prompt_dataset
    from rloo.run.console import format_value
    from rloo.safe_text import visible
    from rloo.trainer import RLOOTrainer

    parser = argparse.ArgumentParser(
        prog="rloo eval", allow_abbrev=False,
        description="Evaluate a saved model or checkpoint: eval/ metrics (reward, per-function rewards, lengths, "
                    "truncation, pass@k) of num_generations_eval samples per prompt of the eval split: --eval_split, "
                    "else the data's 'test' or 'validation' split, else its training split (with a warning). "
                    "--max_eval_samples N scores the first N prompts. Every other flag is rloo train's "
                    "(rloo train --help); --model replaces model_name_or_path.")
    parser.add_argument("--model", required=True, help="A directory written by save_model or a checkpoint-N.")
    options, rest = parser.parse_known_args(argv)
    script, config, _ = parse_train_args(rest)
    if not script.dataset_name or not (script.reward_funcs or script.environment_factory):
        raise ConfigError("rloo eval needs --dataset_name and --reward_funcs (as flags or YAML keys; an "
                          "--environment_factory with get_reward may stand in for the last).")
    # Nothing is trained: no tracker run is opened and the run length is irrelevant.
    config = dataclasses.replace(config, report_to="none", save_steps=0, log_completions=False)  # samples: below
    split = script.eval_split or held_out_split(script.dataset_name, script.dataset_config, script.dataset_split) \
        or script.dataset_split
    dataset = load_prompt_dataset(script.dataset_name, split, script.dataset_config)
    rows = len(dataset)
    dataset = first_rows(dataset, script.max_eval_samples)
    num_generations = config.num_generations_eval or config.num_generations
    if _is_main_process():  # before the model loads: what is about to be scored, and how much of it
        _announce_eval(options.model, script, split, rows, len(dataset), num_generations)
    from rloo import builders, model_loading

    builders.check_model_name(options.model)
    tokenizer = model_loading.load_tokenizer(options.model, "model")
    trainer = RLOOTrainer(model=options.model, args=config, processing_class=tokenizer,
                          reward_funcs=[resolve_reward_func(spec, tokenizer) for spec in script.reward_funcs],
                          train_dataset=_one_rollout_of(dataset, config), eval_dataset=dataset,
                          **tool_arguments(script))  # the config's tools and environments, as training ran them
    metrics = trainer.evaluate()
    if trainer.accelerator.is_main_process:
        # evaluate() returns each figure as "eval/x" and as transformers' "eval_x": one is shown and kept.
        figures = {name: value for name, value in metrics.items() if name.startswith("eval/")}
        for name, value in figures.items():
            print(visible(f"{name:<40} {format_value(value)}"))  # names hold reward functions' names
        out = _write_eval(Path(config.output_dir), {"model": options.model, "dataset": script.dataset_name,
                                                    "split": split, "prompts": len(dataset),
                                                    "num_generations": num_generations, **figures}, trainer.eval_samples)
        print(visible(f"eval metrics of {options.model} on {script.dataset_name} [{split}] written to {out}, "
                      f"each sample with its rewards to eval_samples.jsonl"))
    return metrics


def _write_eval(folder: Path, results: dict[str, Any], samples: list[dict[str, Any]]) -> Path:
    """eval_results.json (the figures and what was scored) and eval_samples.jsonl (every sample) in `folder`, both
    replaced by the next `rloo eval` there. Not eval_completions.jsonl: a training run in the same folder appends its
    evaluations' samples to that file, which this must not overwrite."""
    from rloo.run.metrics import strict_json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "eval_results.json").write_text(json.dumps(results, indent=2))
    (folder / "eval_samples.jsonl").write_text("".join(strict_json(row, "eval_samples.jsonl") + "\n" for row in samples))
    return folder / "eval_results.json"


def _one_rollout_of(dataset: Any, config: Any) -> Any:
    """The eval rows, repeated until they fill one rollout: RLOOTrainer needs a train_dataset that large,
    though nothing trains (a few eval prompts would otherwise be refused as too small a training set)."""
    import datasets

    needed = config.prompts_per_rollout * int(os.environ.get("WORLD_SIZE", "1"))
    copies = -(-needed // max(len(dataset), 1))
    return dataset if copies <= 1 else datasets.concatenate_datasets([dataset] * copies)


def _is_main_process() -> bool:
    """Process 0 of a launch (or the only one), read before accelerate starts."""
    return int(os.environ.get("RANK", "0")) == 0


def _announce_eval(model: str, script: Any, split: str, rows: int, kept: int, num_generations: int) -> None:
    """One line saying what is scored (data, split, prompts, completions), and a warning when the split is
    the one the config trains on."""
    prompts = f"{kept:,} prompts" if kept == rows else f"the first {kept:,} of {rows:,} prompts (max_eval_samples)"
    print(f"rloo eval: {model} on {script.dataset_name} [{split}]: {prompts} x {num_generations} completions "
          f"(num_generations_eval) = {kept * num_generations:,} samples.", flush=True)
    if split != script.dataset_split:
        return
    why = "" if script.eval_split else f", as {script.dataset_name} has no 'test' or 'validation' split"
    print(f"rloo eval: WARNING: scoring '{split}', the split this config trains on (dataset_split){why}. If the "
          f"model trained on these prompts, the scores overstate how it does on new ones: pass --eval_split with "
          f"held-out prompts. --max_eval_samples N scores only the first N.", file=sys.stderr, flush=True)


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

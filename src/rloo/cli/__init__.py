"""The `rloo` command line.

    rloo train --config run.yaml --learning_rate 1e-6     # YAML keys and --flags, flags win
    rloo train --help                                     # every field with its docstring
    rloo demo                                             # offline: learns two-digit addition
    rloo vllm-serve --model PATH --port 8000              # a vLLM server for vllm_mode="server"

Every `RLOOConfig` field and every `TrainInputs` field is both a YAML key and a `--flag` (`cli.parser`);
unknown keys and flags are errors, not ignored. `cli.rewards` reads `--reward_funcs`.
"""

from __future__ import annotations

import errno
import signal
import sys
import traceback
from typing import Any, Sequence

from rloo.cli.parser import parse_train_args
from rloo.cli.rewards import resolve_reward_func, tool_arguments
from rloo.compat import config_fields, trl_flags
from rloo.config import ConfigError
from rloo.safe_text import visible

__all__ = ["main", "parse_train_args", "resolve_reward_func", "run_train"]

def run_train(argv: Sequence[str]) -> None:
    from rloo.run import run_dir, run_lock

    script, config, resume = parse_train_args(argv)
    if not script.model_name_or_path or not script.dataset_name or not (script.reward_funcs or script.environment_factory):
        raise ConfigError("rloo train needs --model_name_or_path, --dataset_name and --reward_funcs "
                          "(as flags or YAML keys; an --environment_factory with get_reward may stand in for the last).")
    run_dir.check_output_dir(config.output_dir)  # all before anything loads
    lock = run_lock.lock_output_dir(config.output_dir)  # one run per folder: a second one is refused here
    try:
        _train(script, config, resume)
    finally:
        if lock is not None:
            lock.close()


def _train(script: Any, config: Any, resume: str | None) -> None:
    from rloo import builders, model_loading
    from rloo.data.loading import first_rows, load_prompt_dataset
    from rloo.run import run_dir, trainer_api
    from rloo.run.verbosity import set_library_verbosity
    from rloo.trainer import RLOOTrainer

    if resume is None and not config.overwrite_output_dir:
        run_dir.refuse_used_output_dir(config.output_dir)
    builders.check_model_name(script.model_name_or_path)
    set_library_verbosity(config.log_level)  # before the dataset and the model load
    train_dataset = load_prompt_dataset(script.dataset_name, script.dataset_split, script.dataset_config)
    eval_dataset = (first_rows(load_prompt_dataset(script.dataset_name, script.eval_split, script.dataset_config),
                               script.max_eval_samples) if script.eval_split else None)
    peft_config = trl_flags.lora_config(script, script.trl_flags) if script.use_peft else None
    revision = (config.model_init_kwargs or {}).get("revision")
    tokenizer = model_loading.load_tokenizer(  # also for rewards that read token ids
        script.model_name_or_path, "model", **({"revision": revision} if revision else {}),
        **({"trust_remote_code": True} if config.trust_remote_code else {}))
    reward_funcs = [resolve_reward_func(spec, tokenizer, config.chat_template_kwargs) for spec in script.reward_funcs]
    _check_code_sandbox(reward_funcs, config)
    trainer = RLOOTrainer(
        model=script.model_name_or_path,
        reward_funcs=reward_funcs,
        args=config,
        processing_class=tokenizer,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=peft_config,
        **tool_arguments(script),
        **script.trainer_kwargs,
    )
    trainer.train(resume_from_checkpoint=resume)
    if trainer.stopped_by is not None:  # saved and resumable, but unfinished: say so to the shell, as it expects
        status = 128 + getattr(signal.Signals, trainer.stopped_by, signal.SIGTERM)
        print(f"rloo: exit status {status}: the run is saved but not finished.", file=sys.stderr)
        raise SystemExit(status)
    if not trainer_api.saves_final_model(config):  # as TRL's script: the CLI saves the model whatever save_strategy
        trainer.save_model(config.output_dir)
    if trainer.accelerator.is_main_process:  # once, not once per process
        print(f"Saved the trained model to {config.output_dir}")
    if config.push_to_hub and trainer.accelerator.is_main_process:  # TRL's `--push_to_hub true`: push once trained
        from rloo.run.trainer_api import push_to_hub

        url = push_to_hub(config.output_dir, trainer.hub_model_id, config.hub_token, config.hub_private_repo,
                          config.hub_revision)  # train() saved the model and its card there
        print(f"Pushed {config.output_dir} to the Hub: {url}")


def _check_code_sandbox(reward_funcs: list, config: Any) -> None:
    """With a code reward: refuse now if the sandbox cannot isolate it (fails closed), and say which layers it uses."""
    import os

    from rloo.rewards import isolation

    layers = isolation.check_for_run(reward_funcs, config.sandbox_allow_missing)
    if layers is not None and os.environ.get("RANK", "0") == "0":  # once, not once per process
        print(isolation.describe_layers(layers), flush=True)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by bad input, and a process of a distributed run that stopped (RankFailure, which names it):
    printed as one message, without a traceback (--debug shows it), exit status 2."""
    from rloo.distributed.heartbeat import RankFailure
    from rloo.distributed.launch import LaunchError
    from rloo.rewards.isolation import SandboxUnavailable
    from rloo.rewards.scoring import RewardError
    from rloo.run.checkpoint import CheckpointError

    return (ConfigError, CheckpointError, FileNotFoundError, RewardError, config_fields.TRLFieldError, LaunchError,
            SandboxUnavailable, RankFailure)


# What a signal outside the training loop interrupted, by command.
STOPPED = {"train": " before training began; nothing was saved.",
           "demo": " before training began; nothing was saved.",
           "eval": " during evaluation; no eval_results.json was written (--max_eval_samples N scores fewer prompts).",
           "report": "; no report was written.",
           "vllm-serve": "; the server has stopped."}


# Errors of the storage under output_dir, not of rloo: reported in one line, as a user error.
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)


class _Terminated(BaseException):
    """SIGTERM before training began (the loop then handles signals itself)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    from rloo.cli.commands import run_eval, run_report

    commands = {"train": run_train, "demo": _run_demo, "eval": run_eval, "report": run_report,
                "vllm-serve": _run_vllm_serve}
    if argv and argv[0] in ("-V", "--version"):
        from rloo._version import __version__

        print(f"rloo {__version__}")
        return
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print("usage: rloo {train,eval,report,demo,vllm-serve} [options] | rloo --version\n\n"
              "commands:\n"
              "  train   train a causal LM with RLOO from a YAML config and flags (rloo train --help)\n"
              "  eval    eval metrics (reward, pass@k, lengths) of a saved model or checkpoint (rloo eval --help)\n"
              "  report  write RUN_DIR/report.html: plots, config and sample completions of a run\n"
              "  demo    offline demo: a tiny model learns two-digit addition (rloo demo --help)\n"
              "  vllm-serve  a vLLM engine on 127.0.0.1 for sampler='vllm', vllm_mode='server' (rloo vllm-serve --help)\n\n"
              "TRL's `trl rloo` flags work with `rloo train`; docs/trl_migration.md maps each one.")
        raise SystemExit(0 if not argv or argv[0] in ("-h", "--help") else 2)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if argv[0] in ("eval", "demo"):  # `rloo train` applies its config's log_level itself
        from rloo.run.verbosity import set_library_verbosity

        set_library_verbosity("passive")
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        commands[argv[0]](argv[1:])
    except _user_errors() as error:
        if debug:
            traceback.print_exc()
        print(f"rloo: error: {visible(str(error), keep=chr(10))}", file=sys.stderr)  # may quote completions
        raise SystemExit(2) from None
    except OSError as error:  # a full disk or a folder made read-only mid-run (issue #48): the errno and the path
        if error.errno not in STORAGE_ERRNOS:
            raise
        if debug:
            traceback.print_exc()
        print(f"rloo: error: {error}. The run cannot write its files: free disk space or make the folder writable, "
              f"then resume with --resume_from_checkpoint latest (the last complete checkpoint is intact).",
              file=sys.stderr)
        raise SystemExit(2) from None
    except (KeyboardInterrupt, _Terminated) as error:  # a signal while loading (training handles its own)
        name = "SIGINT" if isinstance(error, KeyboardInterrupt) else "SIGTERM"
        print(f"rloo: stopped by {name}{STOPPED.get(argv[0], STOPPED['train'])}", file=sys.stderr)
        raise SystemExit(128 + signal.Signals[name]) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_vllm_serve(argv: Sequence[str]) -> None:
    from rloo.generation.vllm_server import main as serve_main

    serve_main(argv)


def _run_demo(argv: Sequence[str]) -> None:
    from rloo.toy.demo import main as demo_main

    demo_main(argv)

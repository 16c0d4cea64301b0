"""`rloo train`'s flags and YAML: every `RLOOConfig` field and every `TrainInputs` field (what to train)
is both a YAML key and a `--flag`, and TRL's `trl rloo` flags are read too. Flags win over the file;
unknown keys and flags are errors, answered with the nearest name.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from rloo.compat import config_fields, trl_flags
from rloo.compat.grpo_fields import GRPO_FIELDS
from rloo.compat.scripts import DatasetMixtureConfig, ModelConfig, RLOOScriptArguments
from rloo.compat.trl_config import RLOOConfig as TRLNamedConfig
from rloo.config import ALIASES, ConfigError, RLOOConfig, field_docs
from rloo.config_checks import check_field_types


@dataclass
class TrainInputs:
    """What to train: model, data and rewards. The how is RLOOConfig."""

    model_name_or_path: str | None = None
    """Model id or local path of the policy (AutoModelForCausalLM)."""
    dataset_name: str | None = None
    """A local file (json, jsonl, csv, parquet), a local dataset directory, or a Hub name."""
    dataset_split: str = "train"
    """Split to train on."""
    dataset_config: str | None = None
    """Dataset configuration name, for Hub datasets that have several."""
    eval_split: str | None = None
    """Split scored as eval_dataset (eval/reward); none by default. `rloo eval` without it scores the data's
    held-out split ("test", else "validation"), and its training split only when the data has neither."""
    max_eval_samples: int | None = None
    """Score only the first this many prompts of the eval split (transformers' examples' name); None: all."""
    reward_funcs: list[str] = field(default_factory=list)
    """Reward functions, weighted by --reward_weights: built-in names (exact_match, math_accuracy,
    think_format, code_execution), built-in factories with arguments (length_penalty:target_length=128,
    thinking_answer_reward), reward models (model:path/or/id, or a local directory with config.json),
    or `module:function` / `file.py:function` paths."""
    tools: list[str] = field(default_factory=list)
    """Functions the model may call during a rollout (multi-turn, docs/multi_turn.md): `file.py:function` or
    `module:function` paths, each with type hints and a docstring naming its arguments."""
    environment_factory: str | None = None
    """A class making one environment per trajectory (`file.py:Class` or `module:Class`): reset(**row), its
    public methods as tools, an optional get_reward() as a reward (then --reward_funcs may be left out)."""
    use_peft: bool = False
    """Train LoRA adapters instead of all weights; the reference is the model with adapters disabled."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA alpha (scale = alpha / r)."""
    lora_dropout: float = 0.05
    """Dropout on the LoRA branch."""
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Modules that get adapters; "all-linear" targets every linear layer but the output head."""


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _parse_bool(text: str) -> bool:
    lowered = str(text).lower()
    if lowered in ("1", "true", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_mapping(text: str) -> dict:
    """A flag holding a mapping, written in YAML or JSON: '{"enable_thinking": false}'."""
    value = yaml.safe_load(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a mapping such as '{{\"key\": value}}', got {text!r}")
    return value


def _add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, title: str) -> None:
    group = parser.add_argument_group(title)
    docs = getattr(cls, "flag_docs", None) or field_docs(cls)
    for f, hint in ((f, _field_types(cls)[f.name]) for f in dataclasses.fields(cls)):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kwargs: dict[str, Any] = {"default": argparse.SUPPRESS, "help": f"{docs.get(f.name, '')} (default: {default!r})"}
        args = typing.get_args(hint)
        base = next((a for a in args if a is not type(None)), hint) if args and type(None) in args else hint
        if typing.get_origin(base) is list:
            kwargs.update(nargs="+", type=typing.get_args(base)[0])
        elif list[str] in args:  # str | list[str], such as report_to: one or more words
            kwargs.update(nargs="+", type=str)
        elif typing.get_origin(base) is dict:
            kwargs.update(type=_parse_mapping, metavar="YAML")
        elif base is bool:
            kwargs.update(nargs="?", const=True, type=_parse_bool, metavar="BOOL")
        elif len([a for a in args if a is not type(None)]) > 1:  # int | str, such as pad_to_multiple_of: 8 or auto
            kwargs.update(type=lambda text: yaml.load(text, Loader=_YamlLoader), metavar="VALUE")
        else:
            kwargs["type"] = base
        group.add_argument(f"--{f.name}", **kwargs)
        if base is bool:
            _add_negative_flag(parser, group, f.name)


def _add_negative_flag(parser: argparse.ArgumentParser, group: Any, name: str) -> None:
    """`--no_<name>` sets a boolean False, as transformers' HfArgumentParser (and so `trl rloo`) allows."""
    if f"--no_{name}" not in parser._option_string_actions:
        group.add_argument(f"--no_{name}", dest=name, action="store_const", const=False, default=argparse.SUPPRESS,
                           help=f"Set {name} to False.")


class _OneLineErrors(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage dump): a misspelt flag gets "did you mean"."""

    def error(self, message: str) -> typing.NoReturn:
        if message.startswith("unrecognized arguments: "):
            unknown = [a for a in message.removeprefix("unrecognized arguments: ").split() if a.startswith("-")]
            flag = (unknown or [message.split()[-1]])[0].split("=")[0]
            close = difflib.get_close_matches(flag, list(self._option_string_actions), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            message = f"unknown flag {flag}{hint}"
        self.exit(2, f"rloo: error: {message} (`{self.prog} --help` lists every flag)\n")


def _trl_script_flags() -> type:
    """TRL's script flags that `rloo train` reads besides its own (TrainInputs), each None unless given: the
    fields of TRL's script dataclasses as compat/scripts.py declares them (once, there), with their docs."""
    own = {f.name for f in dataclasses.fields(TrainInputs)}
    fields: list[tuple[str, Any, Any]] = []
    docs: dict[str, str] = {}
    for cls in (RLOOScriptArguments, ModelConfig, DatasetMixtureConfig, trl_flags.RetiredTRLFlags):
        hints = typing.get_type_hints(cls)
        cls_docs = {k: v for base in reversed(cls.__mro__) if dataclasses.is_dataclass(base)
                    for k, v in field_docs(base).items()}
        for f in dataclasses.fields(cls):
            if f.name in own or f.name in docs:
                continue
            # A mixture's `datasets` are mappings in YAML; as a flag it is refused, so it is read as words.
            hint = list[str] if f.name == "datasets" else hints[f.name]
            fields.append((f.name, hint | None, dataclasses.field(default=None)))
            refused = trl_flags.REFUSED.get(f.name)
            docs[f.name] = cls_docs.get(f.name, "") + (f" Refused by rloo train: {refused}." if refused else "")
    flags = dataclasses.make_dataclass("TRLScriptFlags", fields)
    flags.flag_docs = docs
    return flags


TRLScriptFlags = _trl_script_flags()


def build_train_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(
        prog="rloo train",
        allow_abbrev=False,  # a typo must not silently match a longer flag
        description="Train a causal LM with RLOO. Values come from --config (YAML), then from flags.",
    )
    parser.add_argument("--config", help="YAML file whose keys are any of the flags below.")
    parser.add_argument("--debug", action="store_true", help="On an error, print the traceback too.")
    parser.add_argument("--resume_from_checkpoint", default=None,
                        help="A checkpoint directory to resume from, or 'latest' for the newest in output_dir.")
    _add_dataclass_flags(parser, TrainInputs, "what to train")
    add_config_flags(parser, RLOOConfig)
    _add_dataclass_flags(parser, TRLScriptFlags, "TRL script flags (trl rloo)")
    # TRL's `debug` (transformers' debug modes) is refused anyway; --debug is rloo's traceback switch.
    taken = {f.name for f in dataclasses.fields(TRLScriptFlags)} | {"resume_from_checkpoint", "debug"}
    add_trl_field_flags(parser, taken)
    return parser


def add_config_flags(parser: argparse.ArgumentParser, config_class: type) -> set[str]:
    """RLOOConfig's fields and their TRL v0 aliases as flags that default to "not given"; returns their names.
    Shared with `TrlParser` (scripts.py)."""
    _add_dataclass_flags(parser, config_class, "RLOOConfig")
    aliases = parser.add_argument_group("TRL v0 names (aliases)")
    for old, new in ALIASES.items():
        aliases.add_argument(f"--{old}", default=argparse.SUPPRESS, type=_field_types(RLOOConfig)[new],
                             help=f"Alias of --{new}.")
    return {f.name for f in dataclasses.fields(config_class)} | set(ALIASES)


def add_trl_field_flags(parser: argparse.ArgumentParser, taken: set[str]) -> set[str]:
    """TRL's other RLOOConfig names (config_fields.TRL_FIELDS) and GRPOConfig's own fields (grpo_fields.GRPO_FIELDS)
    as flags, except RLOOConfig's own fields and `taken`; they default to "not given", and are answered as
    `rloo.RLOOConfig(**fields)` answers them in Python. Returns the names added."""
    trl_fields = parser.add_argument_group("other TRL RLOOConfig and GRPOConfig names: mapped, accepted or refused "
                                           "(docs/trl_migration.md)")
    added = set()
    for name, answer in {**config_fields.TRL_FIELDS, **GRPO_FIELDS}.items():
        if name in taken or name in RLOOConfig.__dataclass_fields__:
            continue
        is_bool = isinstance(answer.default, bool)
        # TRL's type where its default shows it (YAML would read --save_strategy no as False).
        kind = _parse_bool if is_bool else type(answer.default) if isinstance(answer.default, (str, int, float)) \
            else yaml.safe_load
        trl_fields.add_argument(f"--{name}", default=argparse.SUPPRESS, metavar="BOOL" if is_bool else "VALUE",
                                type=kind, nargs="?" if is_bool else None,
                                const=True if is_bool else None, help=f"{answer.kind}: {answer.why}.")
        if is_bool:
            _add_negative_flag(parser, trl_fields, name)
        added.add(name)
    return added


def _check_keys(values: dict[str, Any], source: str) -> None:
    known = {f.name for f in dataclasses.fields(RLOOConfig)} | {f.name for f in dataclasses.fields(TrainInputs)}
    known |= set(ALIASES) | {"resume_from_checkpoint"} | set(config_fields.TRL_FIELDS) | set(GRPO_FIELDS)
    known |= {f.name for f in dataclasses.fields(TRLScriptFlags)}
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" Did you mean `{close[0]}`?" if close else ""
            raise ConfigError(f"unknown key `{key}` in {source}.{hint} `rloo train --help` lists every key.")


def parse_train_args(argv: Sequence[str]) -> tuple[TrainInputs, RLOOConfig, str | None]:
    """YAML file, then flags on top; returns the script arguments, the config and the checkpoint to resume."""
    parser = build_train_parser()
    flags = vars(parser.parse_args(argv))
    config_path = flags.pop("config", None)
    flags.pop("debug", None)  # read by main()
    values: dict[str, Any] = {}
    if config_path:
        loaded = load_yaml(config_path) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{config_path} must hold a mapping of keys to values, got {type(loaded).__name__}.")
        _check_keys(loaded, config_path)
        values.update(_parse_yaml_values(loaded))
    for old, new in ALIASES.items():  # a flag overrides the file whichever name either used
        if old in flags or new in flags:
            values.pop(old, None)
            values.pop(new, None)
    values.update({k: v for k, v in flags.items() if v is not None or k != "resume_from_checkpoint"})
    resume = values.pop("resume_from_checkpoint", None)
    script_names = {f.name for f in dataclasses.fields(TrainInputs)}
    trl_names = {f.name for f in dataclasses.fields(TRLScriptFlags)}
    script = TrainInputs(**{k: v for k, v in values.items() if k in script_names})
    script.trl_flags = TRLScriptFlags(**{k: v for k, v in values.items() if k in trl_names})
    config_values = {k: v for k, v in values.items() if k not in script_names | trl_names}
    script.trainer_kwargs = trl_flags.apply(script.trl_flags, script, config_values)  # may add model_init_kwargs
    check_field_types(script)
    if script.max_eval_samples is not None and script.max_eval_samples < 1:
        raise ConfigError(f"max_eval_samples must be at least 1 (the eval prompts kept), got {script.max_eval_samples}; "
                          f"leave it unset to evaluate every prompt.")
    config = TRLNamedConfig(**config_values)  # rloo.RLOOConfig: TRL's names too
    return script, config, resume


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader reading `1e-5` as a number (YAML 1.2), as a user means it, not as text."""


_YamlLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
                                  list("-+0123456789."))


def load_yaml(path: str | Path) -> Any:
    """A YAML file's content; a syntax error names the file, line and column."""
    try:
        return yaml.load(Path(path).read_text(), Loader=_YamlLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(f"{path}{where}: {problem} (YAML syntax; a value holding ': ' or '#' needs quotes).") from None


def _parse_yaml_values(values: dict[str, Any]) -> dict[str, Any]:
    """YAML values as written: quoted text such as `bf16: 'false'` stays text and is refused by the
    field's type check, as the Python API refuses it. One string where a list is due is a list of one
    (`reward_funcs: my_rewards.py:f`)."""
    hints = {**_field_types(RLOOConfig), **_field_types(TrainInputs)}
    parsed = {}
    for key, value in values.items():
        hint = hints.get(ALIASES.get(key, key))
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        options = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
        is_list = all(typing.get_origin(a) is list for a in options)
        parsed[key] = [value] if isinstance(value, str) and is_list else value
    return parsed

"""`TrlParser`: TRL's script parser, flags and a YAML `--config` filling a tuple of dataclasses.

    parser = TrlParser((ScriptArguments, RLOOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()

    python train.py --config run.yaml --learning_rate 1e-6   # YAML keys are defaults, flags win

The YAML's `env:` mapping is set in os.environ before anything is parsed. rloo's RLOOConfig gets the
flags of `rloo train` (cli.py): its own fields, the TRL v0 aliases and TRL's other field names, which
RLOOConfig maps, accepts or refuses by name (compat/config_fields.py). Only the flags that were given (or set
by the YAML) reach RLOOConfig, so its defaults and checks are the ones that apply. Other dataclasses
are read by transformers' HfArgumentParser as usual.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterable

import yaml
from transformers import HfArgumentParser

from rloo.config import ConfigError, RLOOConfig, field_docs

logger = logging.getLogger(__name__)


class TrlParser(HfArgumentParser):
    """An HfArgumentParser that also reads `--config file.yaml` (TRL's TrlParser) and takes rloo's
    RLOOConfig with TRL's field names."""

    def __init__(self, dataclass_types: Any = None, **kwargs: Any) -> None:
        if dataclass_types is None:
            dataclass_types = []
        elif dataclasses.is_dataclass(dataclass_types) or not isinstance(dataclass_types, Iterable):
            dataclass_types = [dataclass_types]
        for dataclass_type in dataclass_types:
            if "config" in dataclass_type.__dataclass_fields__:
                raise ValueError(f"{dataclass_type.__name__} has a field named `config`, which TrlParser keeps for "
                                 f"the YAML file (--config); rename the field.")
        self._names: dict[type, set[str]] = {}  # the parsed names that build each dataclass
        super().__init__(dataclass_types, **kwargs)
        from rloo.cli.parser import add_trl_field_flags

        for dataclass_type in self.dataclass_types:  # after every dataclass, so no TRL name shadows a field
            if issubclass(dataclass_type, RLOOConfig):
                taken = {action.dest for action in self._actions}
                self._names[dataclass_type] |= add_trl_field_flags(self, taken)

    # HfArgumentParser's per-dataclass hook is private; it is the one place that decides each dataclass's flags
    # (TRL's own TrlParser subclasses HfArgumentParser the same way). RLOOConfig takes `rloo train`'s flags here;
    # other dataclasses get transformers' flags plus the docstrings rloo writes under its fields. The only
    # private API this module touches.
    def _add_dataclass_arguments(self, dtype: Any) -> None:
        if issubclass(dtype, RLOOConfig):
            from rloo.cli.parser import add_config_flags

            self._names[dtype] = add_config_flags(self, dtype)
            return
        super()._add_dataclass_arguments(dtype)
        self._names[dtype] = {f.name for f in dataclasses.fields(dtype) if f.init}
        docs: dict[str, str] = {}
        for cls in reversed(dtype.__mro__):  # rloo's dataclasses document fields in docstrings, not metadata
            if dataclasses.is_dataclass(cls) and cls.__module__.startswith("rloo."):
                docs.update(field_docs(cls))
        for action in self._actions:
            if action.help is None and action.dest in docs:
                action.help = docs[action.dest]

    def parse_args_into_dataclasses(self, args: Iterable[str] | None = None, return_remaining_strings: bool = False,
                                    **unused: Any) -> tuple[Any, ...]:
        """Flags into one instance of each dataclass (then a Namespace of any other parsed values, and the
        unparsed strings when `return_remaining_strings`). Unlike HfArgumentParser, no `.args` files are read."""
        namespace, remaining = self.parse_known_args(args=args)
        values = vars(namespace)
        outputs: list[Any] = []
        for dataclass_type in self.dataclass_types:
            given = {name: values.pop(name) for name in self._names[dataclass_type] if name in values}
            outputs.append(dataclass_type(**given))
        if values:
            outputs.append(argparse.Namespace(**values))
        if return_remaining_strings:
            return (*outputs, remaining)
        if remaining:
            raise ValueError(f"unknown arguments: {remaining}. `--help` lists every flag.")
        return tuple(outputs)

    def parse_args_and_config(self, args: Iterable[str] | None = None, return_remaining_strings: bool = False,
                              fail_with_unknown_args: bool = True,
                              separate_remaining_strings: bool = False) -> tuple[Any, ...]:
        """Parse the YAML given by `--config` (its keys become defaults, its `env:` mapping is set in
        os.environ) and then the flags, which win. Keys of the YAML that no dataclass has are an error,
        or with fail_with_unknown_args=False a warning (TRL ignores them silently); with
        return_remaining_strings they are returned as `--key value` strings instead."""
        args = list(sys.argv[1:] if args is None else args)
        config_path = _pop_config_path(args)
        unknown: list[str] = []
        if config_path is not None:
            config = yaml.safe_load(Path(config_path).read_text())
            if not isinstance(config, dict):
                raise ConfigError(f"{config_path} must hold a mapping of keys to values, got {type(config).__name__}.")
            env = config.pop("env", None) or {}
            if not isinstance(env, dict):
                raise ConfigError(f"`env` in {config_path} must be a mapping of variable names to values.")
            for name, value in env.items():
                os.environ[str(name)] = str(value)
            unknown = self.set_defaults_with_config(**config)
        output = self.parse_args_into_dataclasses(args=args, return_remaining_strings=return_remaining_strings)
        if return_remaining_strings:
            if separate_remaining_strings:
                return (*output[:-1], unknown, output[-1])
            return (*output[:-1], unknown + output[-1])
        if unknown:
            keys = unknown[::2]
            known = sorted(action.dest for action in self._actions)
            hints = "".join(f" `{key[2:]}`: did you mean `{close[0]}`?" for key in keys
                            for close in [difflib.get_close_matches(key[2:], known, n=1)] if close)
            message = f"unknown keys in {config_path}: {[key[2:] for key in keys]}.{hints}"
            if fail_with_unknown_args:
                raise ConfigError(f"{message} Remove them, or pass fail_with_unknown_args=False to ignore them.")
            logger.warning("%s They are ignored.", message)
        return output

    def set_defaults_with_config(self, **values: Any) -> list[str]:
        """Make `values` the defaults of the flags of the same name (subcommands too); returns the others
        as `--key value` strings."""
        used = _set_defaults(self, values)
        return [text for key, value in values.items() if key not in used for text in (f"--{key}", str(value))]


def _set_defaults(parser: argparse.ArgumentParser, values: dict[str, Any]) -> set[str]:
    used = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                used |= _set_defaults(subparser, values)
        elif action.dest in values:
            action.default = values[action.dest]  # a string default goes through the flag's type, as typed text does
            action.required = False
            used.add(action.dest)
    return used


def _pop_config_path(args: list[str]) -> str | None:
    """Remove `--config PATH` (or `--config=PATH`) from args and return PATH."""
    for index, arg in enumerate(args):
        if arg == "--config":
            if index + 1 >= len(args):
                raise ConfigError("--config needs the path of a YAML file.")
            path = args[index + 1]
            del args[index:index + 2]
            return path
        if arg.startswith("--config="):
            del args[index]
            return arg.split("=", 1)[1]
    return None


__all__ = ["TrlParser"]

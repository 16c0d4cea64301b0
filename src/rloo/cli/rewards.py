"""`--reward_funcs` entries as reward functions: built-in names and factories with arguments,
reward models (`model:path`), and `module:function` / `file.py:function` paths.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

from rloo.config import ConfigError

REWARD_MODEL_PREFIX = "model:"


def resolve_reward_func(spec: str, tokenizer: Any = None,
                        chat_template_kwargs: dict[str, Any] | None = None) -> Callable | str:
    """One --reward_funcs entry as a reward function, or as a reward model's path for the trainer to load.

    Accepted forms:
      exact_match                          a built-in (rloo.rewards.BUILTIN_REWARDS)
      length_penalty:target_length=128     a built-in factory with arguments (values parsed as YAML);
                                           a factory's `tokenizer` argument gets `tokenizer`, its
                                           `chat_template_kwargs` the config's
      model:path/or/id                     a reward model (AutoModelForSequenceClassification, num_labels=1);
                                           a local directory holding config.json needs no prefix
      package.module:function              a function in an importable module
      package.module.function              the same, in TRL's dotted form
      path/to/file.py:function             a function in a file
      accuracy_reward, think_format_reward, reasoning_accuracy_reward, get_soft_overlong_punishment
                                           TRL's built-in names (rloo.rewards.TRL_REWARDS)
    """
    from rloo.rewards.builtins import BUILTIN_REWARD_FACTORIES, BUILTIN_REWARDS
    from rloo.rewards.trl_names import TRL_REWARDS

    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    if spec in TRL_REWARDS:
        return TRL_REWARDS[spec]
    name, _, arguments = spec.partition(":")
    if name in BUILTIN_REWARD_FACTORIES:
        return _build_factory_reward(name, arguments, tokenizer, chat_template_kwargs)
    if spec.startswith(REWARD_MODEL_PREFIX):
        return spec[len(REWARD_MODEL_PREFIX):]
    if (Path(spec) / "config.json").is_file():
        return spec
    if ":" not in spec and "." in spec and not spec.endswith(".py"):  # TRL's dotted module.function
        spec = ":".join(spec.rsplit(".", 1))
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))  # as TRL's script does, for a module next to the run
    if ":" not in spec:
        raise ConfigError(f"reward function {spec!r} is neither a built-in ({sorted(BUILTIN_REWARDS)}), a TRL "
                          f"built-in ({sorted(TRL_REWARDS)}), a built-in factory ({sorted(BUILTIN_REWARD_FACTORIES)}), "
                          f"a reward model (model:path) nor a `module:function` or `module.function` path.")
    return load_object(spec, "reward function")


def load_object(spec: str, what: str) -> Any:
    """`file.py:name`, `package.module:name` or `package.module.name` -> that object (a function, a class)."""
    if ":" not in spec and "." in spec and not spec.endswith(".py"):
        spec = ":".join(spec.rsplit(".", 1))
    if ":" not in spec:
        raise ConfigError(f"{what} {spec!r} is not a `file.py:name`, `module:name` or `module.name` path.")
    module_name, func_name = spec.rsplit(":", 1)
    if module_name.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
        if module_spec is None or not Path(module_name).exists():
            raise ConfigError(f"{what} file {module_name} does not exist.")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ConfigError(f"{what} {spec!r}: cannot import module {module_name!r} ({error}). Check the "
                              f"name, and run rloo from the folder that holds the module or put it on "
                              f"PYTHONPATH.") from error
    if not hasattr(module, func_name):
        raise ConfigError(f"{module_name} has no {'function' if what != 'environment_factory' else 'class'} `{func_name}`.")
    return getattr(module, func_name)


def _build_factory_reward(name: str, arguments: str, tokenizer: Any,
                          chat_template_kwargs: dict[str, Any] | None = None) -> Callable:
    """`length_penalty:target_length=128,scale=64` -> length_penalty(target_length=128, scale=64)."""
    import inspect

    from rloo.rewards.builtins import BUILTIN_REWARD_FACTORIES

    factory = BUILTIN_REWARD_FACTORIES[name]
    kwargs: dict[str, Any] = {}
    for item in filter(None, arguments.split(",")):
        key, equals, value = item.partition("=")
        if not equals:
            raise ConfigError(f"reward {name}: expected key=value arguments after ':', got {item!r}.")
        kwargs[key.strip()] = yaml.safe_load(value)
    if "tokenizer" in inspect.signature(factory).parameters:
        kwargs["tokenizer"] = tokenizer
    if "chat_template_kwargs" in inspect.signature(factory).parameters and chat_template_kwargs:
        kwargs.setdefault("chat_template_kwargs", chat_template_kwargs)  # render prompts as the policy sees them
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as error:
        raise ConfigError(f"reward {name}: {error}. Its arguments: {inspect.signature(factory)}.") from None
    return factory(**kwargs)


def tool_arguments(script: Any) -> dict[str, Any]:
    """RLOOTrainer's `tools` and `environment_factory` from the script's `tools: [file.py:fn]` and
    `environment_factory: file.py:Class` (rloo train and rloo eval take the same)."""
    return {"tools": [load_object(spec, "tool") for spec in script.tools] or None,
            "environment_factory": load_object(script.environment_factory, "environment_factory")
            if script.environment_factory else None}

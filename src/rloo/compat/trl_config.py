"""`rloo.RLOOConfig`: rloo's config (rloo/config.py) that also takes TRL's vocabulary, the class that
`from rloo import RLOOConfig` gives.

The core reads only the fields of `rloo.config.RLOOConfig` (tests/test_architecture.py holds it to that).
This subclass adds nothing the core reads: at construction it maps TRL's other names onto those fields or
refuses them (`config_fields.translate`, the table docs/trl_migration.md mirrors), takes TRL v0's names as
aliases (`kl_coef` -> `beta`), and keeps the TRL-only names a script may read back (`config.do_train`,
`config.steps_per_generation`) as plain attributes: the value given, else TRL's default.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rloo import config
from rloo.compat.config_fields import TRL_FIELDS, TRLFieldError, translate
from rloo.compat.grpo_fields import GRPO_FIELDS, announce_grpo_defaults
from rloo.config import ALIASES, ConfigError, resolve_aliases

OWN_FIELDS = frozenset(f.name for f in dataclasses.fields(config.RLOOConfig))


class RLOOConfig(config.RLOOConfig):
    """rloo's RLOOConfig, built from rloo's field names, TRL's and TRL v0's (docs/trl_migration.md)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # TRL's TrainingArguments reads an unset accelerator_config back as a default AcceleratorConfig.
        kwargs = {"accelerator_config": None, **kwargs}
        try:
            ours, trl_only = translate(resolve_aliases(kwargs), set(OWN_FIELDS), GRPO_FIELDS)
        except TRLFieldError as error:
            raise ConfigError(str(error)) from None
        vars(self).update(trl_only)  # read by scripts only (config.push_to_hub...); the core reads fields
        announce_grpo_defaults(kwargs)  # a ported GRPOConfig: the defaults that differ, said once
        try:
            super().__init__(*args, **ours)
        except ConfigError as error:
            # A value that came in under a TRL name is reported under that name too.
            if trl_only and not any(name in str(error) for name in trl_only):
                raise ConfigError(f"{error} (TRL fields given: {', '.join(trl_only)})") from None
            raise


# TRL's default of every TRL-only name, readable as `config.<name>` when it was not given; TRL v0's
# names read their field.
for _name, _answer in {**TRL_FIELDS, **GRPO_FIELDS}.items():
    if _name not in OWN_FIELDS:
        setattr(RLOOConfig, _name, _answer.default)
for _old, _new in ALIASES.items():
    setattr(RLOOConfig, _old, property(lambda self, new=_new: getattr(self, new), doc=f"Alias of `{_new}`."))

__all__ = ["RLOOConfig"]

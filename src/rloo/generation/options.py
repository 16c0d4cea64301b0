"""Sampling options beyond temperature / top_p / top_k: the config's min_p, repetition_penalty and
generation_kwargs (TRL's names) into the samplers' settings."""

from __future__ import annotations

from typing import Any

from rloo.config_checks import GENERATION_KWARGS  # generation_kwargs keys that are config fields (key -> field)

# Keys besides those that the fast sampler honours itself.
FAST_SAMPLER_KWARGS = {"do_sample", "min_p"}


def engine_kwargs(generation_kwargs: dict | None, repetition_penalty: Any) -> dict:
    """The generation_kwargs (and a repetition_penalty other than 1) that reach the engine as they
    are: every key without a config field of its own and that the fast sampler does not honour."""
    extra = {k: v for k, v in (generation_kwargs or {}).items()
             if k not in GENERATION_KWARGS and k not in FAST_SAMPLER_KWARGS}
    if repetition_penalty not in (None, 1.0):
        extra.setdefault("repetition_penalty", repetition_penalty)
    return extra


def sampler_options(args: Any) -> dict:
    """`min_p` and `generation_kwargs` for `SamplingSettings`, from the config's min_p,
    repetition_penalty and generation_kwargs (a min_p in generation_kwargs wins over the field)."""
    generation_kwargs = args.generation_kwargs or {}
    min_p = generation_kwargs.get("min_p", args.min_p)
    return {"min_p": float(min_p or 0.0), "generation_kwargs": engine_kwargs(generation_kwargs, args.repetition_penalty)}

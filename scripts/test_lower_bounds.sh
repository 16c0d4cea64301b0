#!/usr/bin/env bash
# Runs a chosen part of the suite against the oldest releases rloo declares (pyproject.toml's lower
# bounds: transformers 5.17, accelerate 1.15, datasets 4.7, peft 0.18; the GPU image's transformers and
# accelerate) in a venv of its own, cached at ~/.cache/rloo/lower-bounds-venv-<hash of
# scripts/lower-bounds-requirements.txt>. rloo itself comes from this checkout (PYTHONPATH), as
# `pip install --no-deps` puts it onto a machine's own torch and transformers. torch is the CPU 2.13
# wheel: PyPI's Linux torch 2.11 is a CUDA build of gigabytes, so torch 2.11 is exercised by
# benchmarks/gpu/gpu_check.py on the GPU machine instead (docs/benchmarks.md). Extra arguments go to pytest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
reqs="$here/scripts/lower-bounds-requirements.txt"
hash="$(sha256sum "$reqs" | cut -c1-12)"
venv="${RLOO_LOWER_BOUNDS_VENV:-$HOME/.cache/rloo/lower-bounds-venv-$hash}"
pin() { grep -E "^$1==" "$reqs" | head -1; }

if [ ! -f "$venv/.complete" ]; then
    echo "building the lower-bounds venv at $venv (cold build: a few minutes)"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q "$(pin torch)"
    # steps 2 and 3 together, with torch held where step 1 put it
    sed -n '/^# step 2/,$p' "$reqs" | grep -vE '^\s*(#|$)' | xargs "$venv/bin/pip" install -q "$(pin torch)"
    touch "$venv/.complete"
fi
export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}"
cd "$here"
"$venv/bin/python" - <<'PY'
import importlib.metadata as m
print("lower bounds:", ", ".join(f"{n} {m.version(n)}" for n in ("torch", "transformers", "accelerate", "datasets", "peft", "trl")))
PY
# The parts that lean on transformers' internals (the tiled head's hook, lean modules, KV caches, the
# samplers, the shared-prefix forward, model loading) and one trainer run each way (rloo's and TRL's).
"$venv/bin/python" -m pytest -q -p no:cacheprovider \
    tests/algo/test_lm_head.py tests/passes/test_lean_activations.py tests/passes/test_shared_prefix.py \
    tests/passes/test_prefix_logprobs.py tests/generation/test_decoding.py tests/generation/test_paged_sampler.py \
    tests/test_model_loading.py tests/compat/test_trl_same_update.py "$@"

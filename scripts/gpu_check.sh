#!/usr/bin/env bash
# The GPU check in one command (docs/benchmarks.md, "rloo on a GPU").
#
#   bash scripts/gpu_check.sh --fetch-wheels   # here, once: the wheels of scripts/gpu-wheels.txt into .gpu_wheels/
#   bash scripts/gpu_check.sh OUTDIR [ARGS]    # on the GPU machine, with .gpu_wheels/ carried along
#
# On the GPU machine it installs rloo with --no-deps onto the image's torch, transformers and accelerate,
# plus the carried wheels (TRL, datasets), into a folder of its own, then runs benchmarks/gpu/gpu_check.py
# (ARGS go to it) under a hard time limit. OUTDIR receives gpu_check.json, gpu_check.md, gpu_check.log
# and install.log.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheels="$here/.gpu_wheels"

if [ "${1:-}" = "--fetch-wheels" ]; then
    mkdir -p "$wheels"
    grep -vE '^\s*(#|$)' "$here/scripts/gpu-wheels.txt" | xargs python3 -m pip download -q --no-deps \
        --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$wheels"
    ls -l "$wheels"
    du -sh "$wheels"
    exit 0
fi

out="${1:?usage: bash scripts/gpu_check.sh OUTDIR [ARGS] (or --fetch-wheels, here)}"
shift
mkdir -p "$out"
if ! ls "$wheels"/*.whl > /dev/null 2>&1; then
    echo "no wheels in $wheels: run 'bash scripts/gpu_check.sh --fetch-wheels' where pip reaches PyPI, and carry .gpu_wheels" >&2
    exit 2
fi
site="${RLOO_GPU_SITE:-/tmp/rloo-gpu-site}"
rm -rf "$site"
# No index, no dependencies, no build isolation: nothing is fetched, and the image's torch and transformers stay.
python3 -m pip install --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --target "$site" \
    "$wheels"/*.whl "$here" > "$out/install.log" 2>&1
status=$?
tail -3 "$out/install.log"
if [ $status -ne 0 ]; then
    echo "install failed (exit $status): $out/install.log" >&2
    exit $status
fi
export PYTHONPATH="$site" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# The same allocator for every system: with the default one TRL's `generate` at 32 x 8 x 512 ran out of the H100's
# 80 GB with 33.6 GB reserved but unallocated (fragmentation from the growing KV cache; benchmarks/results/gpu/).
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
cd "$here"
# 7.5 minutes for the python part (its own budget is 420 s: it starts no section it cannot finish by then),
# then TERM, then KILL: with the install, under the 8 minutes the check is sized for. RLOO_GPU_CHECK_LIMIT_S
# raises the hard limit for a call given a larger --budget-s (a device command may run 600 s).
timeout -k 20 "${RLOO_GPU_CHECK_LIMIT_S:-450}" python3 benchmarks/gpu/gpu_check.py --out "$out" "$@" 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"

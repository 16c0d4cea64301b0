#!/usr/bin/env bash
# One prepared command for a GPU lease (issue #46). Prepare here, run there, one call at a time:
#
#   bash scripts/gpu_lease.sh --fetch-wheels        # here, once: scripts/gpu-wheels.txt into .gpu_wheels/ (about 4.5 MB:
#                                                   # trl 1.16.0, datasets, liger-kernel, pytest and their missing needs)
#   bash scripts/gpu_lease.sh --dry-run OUTDIR      # here: the same steps on CPU at tiny sizes (no install)
#   bash scripts/gpu_lease.sh OUTDIR                # on the GPU machine, .gpu_wheels carried: at most 480 s
#   bash scripts/gpu_lease.sh OUTDIR --long         # a second call if the lease has time left: 16,384 new tokens
#   bash scripts/gpu_lease.sh OUTDIR --trl          # or: the TRL sections the first call's budget skipped
#
# The first call installs the wheels and rloo (no index, no dependencies: the image's torch and transformers stay),
# then runs, each under its own time limit: benchmarks/gpu/gpu_micro.py (the attribution, <= 150 s), the tests marked
# `cuda` (<= 120 s), and benchmarks/gpu/gpu_check.py with the rest of the 480 s: the CUDA correctness checks, rloo at 512
# new tokens, then TRL 1.16 at rloo's settings, with continuous batching, with Liger, and at its defaults (one timed
# step after one warm-up each; a section the budget cannot hold is recorded as skipped). OUTDIR receives at most 8
# files: lease.log, install.log, cuda_tests.log, gpu_micro.json, gpu_micro.md, profile_training_micro_batch.txt,
# gpu_check.json, gpu_check.md. Commit them under benchmarks/results/gpu/<date>_<card>/.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheels="$here/.gpu_wheels"
start=$(date +%s)
LIMIT_S="${RLOO_LEASE_LIMIT_S:-480}"
left() { echo $(( LIMIT_S - ($(date +%s) - start) )); }

if [ "${1:-}" = "--fetch-wheels" ]; then
    exec bash "$here/scripts/gpu_check.sh" --fetch-wheels
fi
dry=0
if [ "${1:-}" = "--dry-run" ]; then
    dry=1
    shift
fi
out="${1:?usage: bash scripts/gpu_lease.sh [--dry-run] OUTDIR [--long] (or --fetch-wheels, here)}"
mode="${2:-main}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
exec > >(tee "$out/lease.log") 2>&1
echo "gpu_lease: mode=$mode dry=$dry limit=${LIMIT_S}s $(date -u +%FT%TZ)"

if [ $dry -eq 1 ]; then
    export PYTHONPATH="$here/src"
    tiny="--cpu-tiny"
    echo "dry run: no install; rloo from $here/src" > "$out/install.log"
else
    tiny=""
    if ! ls "$wheels"/*.whl > /dev/null 2>&1; then
        echo "no wheels in $wheels: run 'bash scripts/gpu_lease.sh --fetch-wheels' where pip reaches PyPI, and carry .gpu_wheels" >&2
        exit 2
    fi
    site="${RLOO_GPU_SITE:-/tmp/rloo-gpu-site}"
    rm -rf "$site"
    timeout 90 python3 -m pip install --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir \
        --target "$site" "$wheels"/*.whl "$here" > "$out/install.log" 2>&1 || { echo "install failed: install.log" >&2; exit 3; }
    export PYTHONPATH="$site"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
cd "$here"

if [ "$mode" = "--trl" ]; then
    # TRL's sections the first call's budget skipped, on their own (rloo's figures are in the first call's files).
    budget=$(( $(left) - 25 ))
    timeout -k 10 $(( budget + 15 )) python3 benchmarks/gpu/gpu_check.py $tiny --out "$out" --timed-steps 1 \
        --budget-s "$budget" --sections environment,matmul_peak,speed_trl_cb_512,speed_trl_liger_512,speed_trl_defaults_512
    echo "gpu_lease: done in $(( $(date +%s) - start )) s"
    exit 0
fi
if [ "$mode" = "--long" ]; then
    # 16,384 new tokens, 1 prompt x K = 8, one step, no warm-up; then 4,096 if time is left.
    budget=$(( $(left) - 25 ))
    timeout -k 10 $(( budget + 15 )) python3 benchmarks/gpu/gpu_check.py $tiny --out "$out" --timed-steps 1 \
        --budget-s "$budget" --sections environment,speed_rloo_16384,speed_rloo_4096
    echo "gpu_lease: done in $(( $(date +%s) - start )) s"
    exit 0
fi

echo "== gpu_micro ($(left) s left)"
timeout -k 10 150 python3 benchmarks/gpu/gpu_micro.py $tiny --out "$out" --budget-s 130

echo "== tests marked cuda ($(left) s left)"
timeout -k 5 120 python3 -m pytest -q -p no:cacheprovider -m cuda tests/algo/test_lm_head_precision.py \
    tests/generation/test_static_decode.py > "$out/cuda_tests.log" 2>&1
echo "pytest exit $? (cuda_tests.log):"; tail -5 "$out/cuda_tests.log"

budget=$(( $(left) - 25 ))
echo "== gpu_check (${budget} s budget)"
sections=environment,matmul_peak,tiled_head_fp32,tiled_head_bf16,lean_activations_fp32,lean_activations_bf16
sections=$sections,shared_prefix_fp32,shared_prefix_bf16,sampler_same_draws,rloo_step_cuda_vs_cpu,speed_rloo_512
sections=$sections,speed_trl_ours_512,speed_trl_cb_512,speed_trl_liger_512,speed_trl_defaults_512
timeout -k 10 $(( budget + 15 )) python3 benchmarks/gpu/gpu_check.py $tiny --out "$out" --timed-steps 1 \
    --budget-s "$budget" --sections "$sections"
echo "gpu_lease: done in $(( $(date +%s) - start )) s; files: $(ls "$out" | wc -l)"

#!/usr/bin/env bash
# GSM8K with and without the calculator tool, seed by seed (docs/recipes.md, "GSM8K with a calculator tool").
#   bash benchmarks/tools_gsm8k_runs.sh STEPS SEED...      e.g. bash benchmarks/tools_gsm8k_runs.sh 10 0 1 2
# Each run holds /work/wt/longrun.lock-style locking only if LOCK is set (LOCK=/path/to/lock); it writes
# runs/tools-gsm8k/{tools,plain}-s<seed>/metrics.jsonl, which benchmarks/tools_gsm8k.py reads and plots.
set -euo pipefail
steps=$1; shift
for seed in "$@"; do
  for arm in tools plain; do
    config=recipes/gsm8k_tools_cpu.yaml; [ "$arm" = plain ] && config=recipes/gsm8k_cpu.yaml
    out=runs/tools-gsm8k/$arm-s$seed
    [ -f "$out/metrics.jsonl" ] && grep -q '"eval/' "$out/metrics.jsonl" && [ "$(grep -c '"eval/' "$out/metrics.jsonl")" -ge 2 ] && continue
    rm -rf "$out"
    cmd=(rloo train --config "$config" --max_steps "$steps" --seed "$seed" --output_dir "$out"
         --eval_split test --eval_on_start true --num_generations_eval 1 --max_eval_samples 64 --per_device_eval_batch_size 16 --save_steps 0)
    echo "$(date -u +%T) ${cmd[*]}"
    start=$(date +%s)
    if [ -n "${LOCK:-}" ]; then flock "$LOCK" "${cmd[@]}" > "$out.log" 2>&1 || true; else "${cmd[@]}" > "$out.log" 2>&1 || true; fi
    echo "$(date -u +%T) $arm seed $seed: $(( $(date +%s) - start )) s, exit ${PIPESTATUS[0]}"
  done
done

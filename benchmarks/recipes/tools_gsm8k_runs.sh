#!/usr/bin/env bash
# GSM8K with and without the calculator tool, seed by seed (docs/recipes.md, "GSM8K with a calculator tool").
#   bash benchmarks/tools_gsm8k_runs.sh STEPS SEED...      e.g. bash benchmarks/tools_gsm8k_runs.sh 10 0 1 2
#   VARIANT=sft EVAL=32 bash benchmarks/tools_gsm8k_runs.sh 3 0   # from the SFT warm starts (recipes/prepare.py
#                                                                # smollm2-sft-tools smollm2-sft-plain), 384 tokens
#   DATA=short VARIANT=sft EVAL=192 EVAL_ON_START=false bash benchmarks/tools_gsm8k_runs.sh 6
#                                 # the problems of one or two calculations (recipes/data/gsm8k_short_1shot): with
#                                 # EVAL_ON_START=false each arm's starting model is evaluated once (rloo eval, into
#                                 # <arm>-before/, samples included), after the seeds' runs if any are given;
#                                 # benchmarks/tools_gsm8k_samples.py reads the samples (docs/recipes.md)
# Each run holds /work/wt/longrun.lock-style locking only if LOCK is set (LOCK=/path/to/lock); it writes
# runs/tools-gsm8k[-sft][-short]/{tools,plain}-s<seed>/metrics.jsonl, which benchmarks/tools_gsm8k.py reads and plots.
# TIMEOUT=seconds caps each run (default: none).
set -euo pipefail
steps=$1; shift
eval_samples=${EVAL:-64}
runs=runs/tools-gsm8k; extra=()
if [ "${VARIANT:-}" = sft ]; then
  # A tool transcript of the SFT data is 268 completion tokens at the median (384 at the 90th percentile): every
  # call and result counts against max_completion_length, so both arms get 384 here.
  runs=runs/tools-gsm8k-sft; extra=(--max_completion_length 384)
fi
if [ "${DATA:-}" = short ]; then
  runs=$runs-short; extra+=(--dataset_name recipes/data/gsm8k_short_1shot)
fi
evals_wanted=2; [ "${EVAL_ON_START:-true}" = false ] && evals_wanted=1
run() {  # the command, under the lock if LOCK is set, capped by TIMEOUT if set; output to $1
  local log=$1; shift
  [ -n "${TIMEOUT:-}" ] && set -- timeout "$TIMEOUT" "$@"
  echo "$(date -u +%T) $*"
  local start rc=0; start=$(date +%s)
  if [ -n "${LOCK:-}" ]; then flock "$LOCK" "$@" > "$log" 2>&1 || rc=$?; else "$@" > "$log" 2>&1 || rc=$?; fi
  echo "$(date -u +%T) $log: $(( $(date +%s) - start )) s (lock wait included), exit $rc"
}
for seed in "$@"; do
  for arm in tools plain; do
    config=recipes/gsm8k_tools_cpu.yaml; [ "$arm" = plain ] && config=recipes/gsm8k_cpu.yaml
    model=()
    [ "${VARIANT:-}" = sft ] && model=(--model_name_or_path "recipes/models/smollm2-135m-instruct-sft-$arm")
    out=$runs/$arm-s$seed
    [ -f "$out/metrics.jsonl" ] && grep -q '"eval/' "$out/metrics.jsonl" && [ "$(grep -c '"eval/' "$out/metrics.jsonl")" -ge "$evals_wanted" ] && continue
    rm -rf "$out"; mkdir -p "$runs"
    cmd=(rloo train --config "$config" "${model[@]}" "${extra[@]}" --max_steps "$steps" --seed "$seed" --output_dir "$out"
         --eval_split test --eval_on_start "${EVAL_ON_START:-true}" --num_generations_eval 1 --max_eval_samples "$eval_samples"
         --per_device_eval_batch_size 16 --save_steps 0)
    run "$out.log" "${cmd[@]}"
  done
done
# Without eval_on_start, the starting point: each arm's starting model evaluated once (rloo eval), the same
# problems and settings as the runs' final evaluations.
if [ "${EVAL_ON_START:-true}" = false ]; then
  for arm in tools plain; do
    config=recipes/gsm8k_tools_cpu.yaml; [ "$arm" = plain ] && config=recipes/gsm8k_cpu.yaml
    model=recipes/models/smollm2-135m-instruct-tools; [ "$arm" = plain ] && model=recipes/models/smollm2-135m-instruct
    [ "${VARIANT:-}" = sft ] && model=recipes/models/smollm2-135m-instruct-sft-$arm
    out=$runs/$arm-before
    [ -f "$out/eval_samples.jsonl" ] && continue
    rm -rf "$out"
    run "$out.log" rloo eval --model "$model" --config "$config" "${extra[@]}" --output_dir "$out" --eval_split test \
      --num_generations_eval 1 --max_eval_samples "$eval_samples" --per_device_eval_batch_size 16 --seed 0
  done
fi

#!/usr/bin/env bash
# Long arithmetic with a calculator (issue #50): rloo with the tool, rloo without it (the control), and TRL's
# GRPOTrainer with the same tool, seed by seed, each then evaluated on the first EVAL held-out problems.
#   bash benchmarks/recipes/arithmetic_runs.sh STEPS JOB...
#     JOB: tools-s<seed> | plain-s<seed> | trl-s<seed> | before (the two warm starts) | hard-<run> (hard set)
#          | eval-<run> (evaluate a run, or the last checkpoint of one stopped early)
#   e.g. bash benchmarks/recipes/arithmetic_runs.sh 30 tools-s0 trl-s0 plain-s0 before
# Each job (a run and its evaluation) takes /tmp/rloo-heavy.lock for itself (LOCK=... to change, LOCK= for none),
# so other heavy jobs get turns between jobs; with OMP_NUM_THREADS=1 and LOCK= two chains share 2 cores, a core each.
# Writes runs/arithmetic/<job>/ (the run, its final model) with <job>.log and <job>.time (/usr/bin/time -v: peak
# RSS), and <job>-eval/ (rloo eval: eval_results.json, eval_samples.jsonl); benchmarks/recipes/arithmetic.py reads
# them all.
set -euo pipefail
steps=$1; shift
runs=runs/arithmetic; mkdir -p "$runs"
eval_samples=${EVAL:-64}
lock=${LOCK-/tmp/rloo-heavy.lock}
if [ -n "$lock" ]; then  # one job at a time under the lock: this script again, for that job, without it
  for job in "$@"; do
    echo "$(date -u +%T) $job: waiting for $lock"
    flock "$lock" env LOCK= bash "$0" "$steps" "$job" || echo "$(date -u +%T) $job failed"
  done
  exit 0
fi
run() {  # run LOG COMMAND...: timed (peak RSS) into LOG's .time
  local log=$1; shift
  echo "$(date -u +%T) $*"
  local start rc=0; start=$(date +%s)
  /usr/bin/time -v -o "${log%.log}.time" "$@" > "$log" 2>&1 || rc=$?
  echo "$(date -u +%T) $log: $(( $(date +%s) - start )) s, exit $rc"
  return $rc
}
evaluate() {  # evaluate MODEL CONFIG OUT [flags]: the first $eval_samples held-out problems, one sample each
  local model=$1 config=$2 out=$3; shift 3
  [ -f "$out/eval_samples.jsonl" ] && return 0
  run "$out.log" rloo eval --model "$model" --config "$config" --output_dir "$out" --eval_split test \
    --max_eval_samples "$eval_samples" --num_generations_eval 1 --per_device_eval_batch_size 16 --seed 0 "$@"
}
config_of() { case $1 in plain) echo recipes/arithmetic_plain_cpu.yaml;; *) echo recipes/arithmetic_tools_cpu.yaml;; esac; }
for job in "$@"; do
  case $job in
    before)
      evaluate recipes/models/smollm2-135m-instruct-arith-sft-tools recipes/arithmetic_tools_cpu.yaml $runs/tools-before-eval
      evaluate recipes/models/smollm2-135m-instruct-arith-sft-plain recipes/arithmetic_plain_cpu.yaml $runs/plain-before-eval;;
    hard-*)
      name=${job#hard-}; arm=${name%-s*}
      model=$runs/$name; [ "$name" = tools-before ] && model=recipes/models/smollm2-135m-instruct-arith-sft-tools
      [ "$name" = plain-before ] && model=recipes/models/smollm2-135m-instruct-arith-sft-plain
      evaluate "$model" "$(config_of "$arm")" "$runs/$name-hard-eval" --dataset_name recipes/data/arithmetic_hard;;
    eval-*)  # a run stopped early (SIGTERM saves a checkpoint): its last checkpoint, evaluated as the run's
      name=${job#eval-}; arm=${name%-s*}; [ "$arm" = trl ] && arm=tools
      model=$runs/$name; [ -f "$model/model.safetensors" ] || model=$(ls -d "$runs/$name"/checkpoint-* | sort -V | tail -1)
      evaluate "$model" "$(config_of "$arm")" "$runs/$name-eval";;
    tools-s*|plain-s*)
      arm=${job%-s*}; seed=${job##*-s}; out=$runs/$job
      if [ ! -f "$out/model.safetensors" ]; then
        rm -rf "$out"
        run "$out.log" rloo train --config "$(config_of "$arm")" --max_steps "$steps" --seed "$seed" --output_dir "$out"
      fi
      evaluate "$out" "$(config_of "$arm")" "$out-eval";;
    trl-s*)
      seed=${job##*-s}; out=$runs/$job
      if [ ! -f "$out/model.safetensors" ]; then
        rm -rf "$out"
        run "$out.log" python benchmarks/recipes/tools_vs_trl.py --recipe recipes/arithmetic_tools_cpu.yaml \
          --steps "$steps" --seed "$seed" --threads "${OMP_NUM_THREADS:-2}" --systems trl --save-dir "$out" --out "arithmetic_trl_s$seed.json"
      fi
      evaluate "$out" recipes/arithmetic_tools_cpu.yaml "$out-eval";;
    *) echo "unknown job $job" >&2; exit 2;;
  esac
done

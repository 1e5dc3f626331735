#!/usr/bin/env bash
# Issue 40's side-by-side on one H200: the recipe's data (synth answers restored from .data), then
# for each run RUNS names (stages of experiments/recipes/methods_h200.yaml), one after another:
#   1. its training, alone on the GPU;
#   2. for TIMED runs, its MT-bench chain evals (K=7, 80 q, greedy, 256 tokens, the speed-up against
#      plain decoding timed in the same process) at batch 1, then batch 16, alone on the GPU;
#   3. its tau-only evals (batch 16, no speed: the recipe's held-out split, HumanEval, and MT-bench
#      for runs not in TIMED), beside the next run's training.
# While the data is made, the GPU tests of the new methods' eval engines (P-EAGLE, DFlash) run.
# Each run is finished before the next starts, so a lease that runs out cuts only the last one:
# the lease of 2026-12-03 20:54 trained all four first and had no time left for two of the
# timed evals (experiments/LOG.md). A timed eval costs ~3.6 min (69 s of compiling and capture).
#   setsid bash experiments/methods_h200.sh &   # RUNS="m_peagle m_dflash" for fewer; then: bash experiments/fetch_results.sh 530
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1
export DEADLINE=$(( $(date +%s) + ${LEASE_MIN:-24} * 60 )) && export HARD_DEADLINE=$(( DEADLINE + 60 ))
. experiments/steps.sh
mkdir -p "$R" && rm -f "$R/ALL_DONE"
step gpu_tests 300 python3 -m pytest -q -p no:cacheprovider --run-gpu tests/gpu/test_peagle_gpu.py tests/gpu/test_dflash_gpu.py &
driver_start 24 1   # the GGUF as an HF folder, once
ONLY_STEPS=data bash experiments/h200_recipe.sh > /root/data_driver.log 2>&1  # restores the answers, then prepare and vocab
rm -f "$R/ALL_DONE"  # h200_recipe.sh's, which fetch_results.sh would take for this driver's
wait  # the GPU tests: the GPU is the runs' alone from here
RECIPE=experiments/recipes/methods_h200.yaml
RUNS=${RUNS:-m_peagle m_peagle4 m_dflash m_ce m_lk}
TIMED=${TIMED:-m_peagle m_peagle4 m_dflash m_ce m_lk}
chain() {  # NAME_SUFFIX RUN_NAME ARGS...: one MT-bench-style chain eval of a run's drafter
  local suffix=$1 name=$2; shift 2
  [ -d "$RUN/$name/drafter" ] && step "${name}_$suffix" 300 python3 -m draftsmith eval --target $HF --drafter "$RUN/$name" \
    --mode chain --depth 7 --num-questions 80 --max-new-tokens 256 --out "$RUN/${name}_$suffix" "$@"
}
tau_only() {  # RUN_NAME: the tau-only evals, in the background
  local name=$1
  chain heldout "$name" --bench held-out --batch-size 16 --no-speed --no-compile-target --no-compile-drafter
  chain humaneval "$name" --bench experiments/data/humaneval.jsonl --batch-size 16 --no-speed --no-compile-target --no-compile-drafter
  [[ " $TIMED " == *" $name "* ]] || chain mtbench_tau "$name" --batch-size 16 --no-speed --no-compile-target --no-compile-drafter
}
for name in $RUNS; do
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step "$name" 330 python3 -m draftsmith pipeline "$RECIPE" --only "$name"
  wait  # the previous run's tau-only evals: the timed ones run alone
  if [[ " $TIMED " == *" $name "* ]]; then
    chain mtbench_b1 "$name"
    chain mtbench_b16 "$name" --batch-size 16
  fi
  tau_only "$name" &
done
wait
touch "$R/ALL_DONE"

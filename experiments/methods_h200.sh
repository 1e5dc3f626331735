#!/usr/bin/env bash
# Issue 40's side-by-side on one H200: the recipe's data (synth answers restored from .data), then
#   1. the trainings RUNS names (stages of experiments/recipes/methods_h200.yaml), one after
#      another, each alone on the GPU; each run's tau-only evals (batch 16, no speed: the recipe's
#      held-out split and HumanEval) beside the next run's training;
#   2. the timed MT-bench chain evals of the RUNS side by side (`eval --compare`: K=7, 80 q, greedy,
#      256 tokens, one compiled target and one plain pass for all drafters, their speed-ups against
#      it in the same process), at batch 1, then batch 16, alone on the GPU;
#   3. the EXTRA runs (trained and evaluated tau-only) while the lease lasts.
# While the data is made, the GPU tests of the new methods' eval engines (P-EAGLE, DFlash) and of
# `eval --compare` run. TAU_ONLY=0 skips the tau-only evals (a lease that measured them already;
# they slow the training beside them). SYNTH_SETS=5 makes only the recipe's first five synth sets
# (~10M tokens, half the data minutes: a lease without .data that must time all the methods).
# The lease of 2026-12-03 20:54 timed one drafter per eval process (~3.6 min each, 69 s of it
# compiling and capturing, plus its own plain pass) and had no time left for two of them
# (experiments/LOG.md); side by side, the run pays one compile and one plain pass.
#   setsid bash experiments/methods_h200.sh &   # RUNS="m_ce m_peagle" for fewer; then: bash experiments/fetch_results.sh 530
# TOGETHER=1 trains the RUNS and the EXTRA ones all at once, then times them all in one `eval
# --compare`; TAU_AFTER names runs whose tau-only evals come last. Side by side the GPU is busy
# (100 % with four runs), but the lease of 2026-12-04 15:05 trained m_ce, m_peagle and m_dflash
# together in 6.8 min against 12.6 alone in earlier leases, to their val tau within 0.011 (each
# run's tok/s is then not its own alone). Four at once (m_peagle4 too) would have left the evals
# no time: it was stopped and trained alone after them. That lease's command:
#   LEASE_MIN=26 TOGETHER=1 TAU_ONLY=0 EXTRA=m_peagle4 TAU_AFTER=m_peagle4 setsid bash experiments/methods_h200.sh &
# GPU_TESTS=0 skips the GPU tests; CAPTURE_BENCH=1 times the capture first (bench/capture_bench.py:
# dense, flex, flex compiled), then the recipe's training step with and without --compile-capture
# (bench/train_bench.py, on the data); TRAIN_LIMIT_S bounds each training run (330 s alone, 1200 together). The recipe's
# whole budget, P-EAGLE alone (the lease of 2026-12-04 17:08; RUNS=f_dflash for DFlash):
#   LEASE_MIN=26 GPU_TESTS=0 TRAIN_LIMIT_S=1260 RUNS=f_peagle EXTRA="" TAU_ONLY=0 TAU_AFTER=f_peagle setsid bash experiments/methods_h200.sh &
# The other two at that budget side by side, each one's tau-only evals as soon as it ends (the
# lease of 2026-12-04 20:08: 25.8 device-minutes):
#   LEASE_MIN=25 GPU_TESTS=0 TRAIN_LIMIT_S=1260 RUNS="f_ce f_dflash" TOGETHER=1 EXTRA="" setsid bash experiments/methods_h200.sh &
# Poll at once after each return: a lease idle for 30 s is given back with everything on it.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1
export DEADLINE=$(( $(date +%s) + ${LEASE_MIN:-24} * 60 )) && export HARD_DEADLINE=$(( DEADLINE + 60 ))
. experiments/steps.sh
mkdir -p "$R" && rm -f "$R/ALL_DONE"
[ "${CAPTURE_BENCH:-0}" = 1 ] && step capture_bench 300 python3 bench/capture_bench.py --out-json "$R/capture_bench.json"  # alone on the GPU
[ "${GPU_TESTS:-1}" = 1 ] && step gpu_tests 420 python3 -m pytest -q -p no:cacheprovider --run-gpu tests/gpu/test_peagle_gpu.py tests/gpu/test_dflash_gpu.py \
  tests/gpu/test_compare_gpu.py tests/gpu/test_train_gpu.py::test_flex_capture_gives_the_dense_capture_states &
driver_start 24 1   # the GGUF as an HF folder, once
ONLY_STEPS=data bash experiments/h200_recipe.sh > /root/data_driver.log 2>&1  # restores the answers, then prepare and vocab
rm -f "$R/ALL_DONE"  # h200_recipe.sh's, which fetch_results.sh would take for this driver's
wait  # the GPU tests: the GPU is the runs' alone from here
[ "${CAPTURE_BENCH:-0}" = 1 ] && step train_bench_capture 420 python3 bench/train_bench.py "$RUN/prepare" --target $HF \
  --variant defaults: --variant compiled_capture:compile_capture=true --steps 40 --out-json "$R/train_bench_capture.json"
RECIPE=experiments/recipes/methods_h200.yaml
RUNS=${RUNS:-m_ce m_peagle m_dflash}  # the first is --drafter, the reference the others are compared with
EXTRA=${EXTRA-m_peagle4 m_lk}  # EXTRA="" for none
chain() {  # NAME ARGS...: one MT-bench-style K=7 chain eval, its report in $RUN/NAME
  local name=$1; shift
  step "$name" 540 python3 -m draftsmith eval --target $HF --mode chain --depth 7 --num-questions 80 \
    --max-new-tokens 256 --out "$RUN/$name" "$@"
}
tau_only() {  # RUN_NAME: its tau-only evals, in the background
  local name=$1 fast=(--batch-size 16 --no-speed --no-compile-target --no-compile-drafter)
  chain "${name}_heldout" --drafter "$RUN/$name" --bench held-out "${fast[@]}"
  chain "${name}_humaneval" --drafter "$RUN/$name" --bench experiments/data/humaneval.jsonl "${fast[@]}"
}
train_one() {  # RUN_NAME LIMIT_S: one training stage of $RECIPE
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step "$1" "$2" python3 -m draftsmith pipeline "$RECIPE" --only "$1"
}
train_all() {  # RUN_NAME...: each training alone on the GPU, its tau-only evals beside the next one's
  for name in "$@"; do
    train_one "$name" "${TRAIN_LIMIT_S:-330}"
    wait  # the last run's tau-only evals
    [ "${TAU_ONLY:-1}" = 1 ] && [ -d "$RUN/$name/drafter" ] && tau_only "$name" &
  done
  wait
}
train_together() {  # RUN_NAME...: all at once on the GPU, each one's tau-only evals once it ends (TOGETHER=1: see the header)
  for name in "$@"; do
    { train_one "$name" "${TRAIN_LIMIT_S:-1200}"
      [ "${TAU_ONLY:-1}" = 1 ] && [ -d "$RUN/$name/drafter" ] && tau_only "$name"; } &
  done
  wait
}
if [ "${TOGETHER:-0}" = 1 ]; then train_together $RUNS $EXTRA && RUNS="$RUNS $EXTRA" EXTRA=""; else train_all $RUNS; fi
trained=() && for name in $RUNS; do [ -d "$RUN/$name/drafter" ] && trained+=("$RUN/$name"); done
if [ ${#trained[@]} -gt 0 ]; then
  others=$(IFS=,; echo "${trained[*]:1}")
  for b in 1 16; do chain "methods_mtbench_b$b" --drafter "${trained[0]}" ${others:+--compare "$others"} --batch-size $b; done
fi
train_all $EXTRA
for name in ${TAU_AFTER:-}; do [ -d "$RUN/$name/drafter" ] && tau_only "$name" & done
wait
touch "$R/ALL_DONE"

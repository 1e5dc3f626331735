#!/usr/bin/env bash
# Issue 40, a short side-by-side on one H200: the recipe's data (synth answers restored from .data),
# then the training stages RUNS names (RECIPE:STAGE, each 975 steps = 8.0M tokens of the recipe's
# data and split) at once on the GPU, then each drafter's MT-bench chain tau (K=7, 80 q, greedy,
# tau only: runs sharing a GPU time nothing), also at once.
#   RUNS="experiments/recipes/loss_h200.yaml:train_loss_ce ..." setsid bash experiments/methods_h200.sh &
#   then, call after call: bash experiments/fetch_results.sh 530
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1
export DEADLINE=$(( $(date +%s) + ${LEASE_MIN:-11} * 60 )) && export HARD_DEADLINE=$(( DEADLINE + 60 ))
. experiments/steps.sh
driver_start 11 1   # the GGUF as an HF folder, once
ONLY_STEPS=data bash experiments/h200_recipe.sh > /root/data_driver.log 2>&1  # restores the answers, then prepare and vocab
rm -f "$R/ALL_DONE"
RUNS=${RUNS:-experiments/recipes/loss_h200.yaml:train_loss_ce experiments/recipes/loss_h200.yaml:train_loss_tv experiments/recipes/loss_h200.yaml:train_loss_lk}
left=$(( DEADLINE - ${EVAL_S:-170} - $(date +%s) ))
for run in $RUNS; do
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step "${run##*:}" "$left" python3 -m draftsmith pipeline "${run%%:*}" --only "${run##*:}" &
done
wait
for run in $RUNS; do
  name=${run##*:}
  [ -d "$RUN/$name/drafter" ] && step "${name}_chain" 200 python3 -m draftsmith eval --target $HF --drafter "$RUN/$name" \
    --mode chain --k 7 --num-questions 80 --max-new-tokens 256 --no-speed --no-compile-target --out "$RUN/${name}_mtbench" &
done
wait
touch "$R/ALL_DONE"

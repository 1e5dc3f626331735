#!/usr/bin/env bash
# Issue 40, a short side-by-side on one H200: the recipe's data (synth answers restored from .data),
# then the training stages RUNS names (RECIPE:STAGE) one after another, then each drafter's
# MT-bench chain tau (K=7, 80 q, greedy, tau only). One after another: the lease of 2026-12-03
# 17:53 ran five at once on one H200, which trained at 38k tok/s in all against 48.7k alone, and
# five MT-bench evals at once did not finish in 200 s (experiments/LOG.md).
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
n=$(wc -w <<< "$RUNS") && evals_at=$(( DEADLINE - ${EVAL_S:-120} * n ))  # the evals' share: EVAL_S each
for run in $RUNS; do  # each run its share of the time left before the evals
  left=$(( (evals_at - $(date +%s)) / n )); n=$(( n - 1 ))
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step "${run##*:}" "$left" python3 -m draftsmith pipeline "${run%%:*}" --only "${run##*:}"
done
for run in $RUNS; do
  name=${run##*:}
  [ -d "$RUN/$name/drafter" ] && step "${name}_chain" 200 python3 -m draftsmith eval --target $HF --drafter "$RUN/$name" \
    --mode chain --depth 7 --num-questions 80 --max-new-tokens 256 --no-speed --no-compile-target --out "$RUN/${name}_mtbench"
done
touch "$R/ALL_DONE"

#!/usr/bin/env bash
# Lease of 2026-12-03 (issue 39 item 4): the recipe's data (val_gpu_test beside it), then
# train_sglang until the deadline, then its MT-bench chain tau (K=7, 80 q, greedy, tau only).
#   Ran 2026-12-03 13:07-13:36 UTC from .gpu/ at 75acc54 (then bench/ paths): data 11.1 min, then train_sglang
#   293 s (cut: val at 8.0M tokens), resumed for 260 s (val at 15.9M). Polled with experiments/fetch_results.sh.
set -uo pipefail
cd /root/ds
export PYTHONPATH=/tmp/site:/root/ds/src:/root/ds PYTHONUNBUFFERED=1
export DEADLINE=$(( $(date +%s) + ${LEASE_MIN:-22} * 60 )) && export HARD_DEADLINE=$(( DEADLINE + 60 ))
. experiments/steps.sh
driver_start 22 1   # the GGUF as an HF folder, once
(ONLY_STEPS=val_gpu_test bash experiments/h200_recipe.sh > /root/val_driver.log 2>&1) & V=$!
ONLY_STEPS=data bash experiments/h200_recipe.sh > /root/data_driver.log 2>&1  # makes the data, packs the answers
rm -f "$R/ALL_DONE"
EVAL_S=290
left=$(( DEADLINE - EVAL_S - $(date +%s) ))
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step train_sglang "$left" python3 -m draftsmith pipeline experiments/recipes/sglang_h200.yaml --only train_sglang
wait $V; rm -f "$R/ALL_DONE"
[ -d "$RUN/train_sglang/drafter" ] && step train_sglang_chain 280 python3 -m draftsmith eval --target $HF --drafter "$RUN/train_sglang" \
    --mode chain --k 7 --num-questions 80 --max-new-tokens 256 --no-speed --no-compile-target --out "$RUN/train_sglang_mtbench"
[ -d "$RUN/train_sglang/drafter" ] && step export_sglang 60 python3 -m draftsmith export "$RUN/train_sglang" --format eagle --engine sglang --out "$RUN/train_sglang_sglang_export"
touch "$R/ALL_DONE"

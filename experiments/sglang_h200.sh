#!/usr/bin/env bash
# Issue 39 item 4 at the full budget: the recipe's data (synth answers restored from .data), then
# train_sglang (train --for-engine sglang) to 3,900 steps (31.8M tokens), then its MT-bench chain
# tau (K=7, 80 q, greedy, tau only) and its SGLang export. The lease of 2026-12-03 13:07 (75acc54)
# ran this to 15.9M tokens only: `git log -p experiments/sglang_h200.sh`.
#   setsid bash experiments/sglang_h200.sh &     # then, call after call: bash experiments/fetch_results.sh 530
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1
export DEADLINE=$(( $(date +%s) + ${LEASE_MIN:-20} * 60 )) && export HARD_DEADLINE=$(( DEADLINE + 60 ))
. experiments/steps.sh
driver_start 20 1   # the GGUF as an HF folder, once
ONLY_STEPS=data bash experiments/h200_recipe.sh > /root/data_driver.log 2>&1  # restores the answers, then prepare and vocab
rm -f "$R/ALL_DONE"
EVAL_S=290
left=$(( DEADLINE - EVAL_S - $(date +%s) ))
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step train_sglang "$left" python3 -m draftsmith pipeline experiments/recipes/sglang_h200.yaml --only train_sglang
[ -d "$RUN/train_sglang/drafter" ] && step train_sglang_chain 280 python3 -m draftsmith eval --target $HF --drafter "$RUN/train_sglang" \
    --mode chain --depth 7 --num-questions 80 --max-new-tokens 256 --no-speed --no-compile-target --out "$RUN/train_sglang_mtbench"
[ -d "$RUN/train_sglang/drafter" ] && step export_sglang 60 python3 -m draftsmith export "$RUN/train_sglang" --format eagle --engine sglang --out "$RUN/train_sglang_sglang_export"
touch "$R/ALL_DONE"

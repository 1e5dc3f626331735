#!/usr/bin/env bash
# Issue 13's second ablation (experiments/recipes/ablation2_h200.yaml) on a 2-GPU host (nvidia-h200-x2), and
# the GPU measurements still owed by issues 15 and 18, in the device time of one session:
#   GPU 0  the recipe's data (synth x3, prepare, vocab), then two lanes side by side, each two
#          ablation runs with their MT-bench chain τ; then issue 15's cycle breakdown and batch
#          sizes 1/4/16 with abl2_defaults' drafter
#   GPU 1  while the data is made: issue 18's generic-path-against-fast-engine decode speed, then
#          the GPU tests still unseen on a GPU; then two lanes of two ablation runs each; then
#          `eval --kernel-check` and `eval --tree auto` with abl2_defaults' drafter
#   setsid bash experiments/ablation_h200.sh &   # then: tail /root/results/steps.log
# Two runs share each GPU, so the ablation's tok/s and minutes are not one run's alone (its τ
# figures do not depend on it). Needs the embedded default's GGUF at $GGUF (and `gguf`
# importable); reruns skip finished steps; no step starts after $DEADLINE and none runs past
# $HARD_DEADLINE (epoch seconds; default: 21 and 25 minutes after the start).
# experiments/summarise_ablation.py turns its run folder into the table of experiments/LOG.md.
set -uo pipefail
RUN=/root/runs/h200_3sets  # experiments/recipes/ablation2_h200.yaml's out (the recipe's data as it was then)
. "$(dirname "$0")/steps.sh"
Y=experiments/recipes/ablation2_h200.yaml
stage() { step "$1" 900 python3 -m draftsmith pipeline $Y --only "$1"; }
lane() { for s in "$@"; do stage "$s"; done; }  # one step per stage: the deadline falls between stages
driver_start 21 4

( export CUDA_VISIBLE_DEVICES=0
  step data 600 python3 -m draftsmith pipeline $Y --only synth,magpie,magpie2,prepare,vocab
  lane abl2_defaults abl2_defaults_chain abl2_noise1 abl2_noise1_chain & A1=$!
  lane abl2_fcnorm abl2_fcnorm_chain abl2_wd abl2_wd_chain & A2=$!
  wait $A1 $A2
  step bench_cycle 300 python3 bench/eval_bench.py --parts cycle --target $HF --drafter $RUN/abl2_defaults \
    --out-json "$R/bench_cycle.json"
  step bench_batch 420 python3 bench/eval_bench.py --parts batch --target $HF --drafter $RUN/abl2_defaults \
    --num-questions 32 --out-dir /root/batch --out-json "$R/bench_batch.json"
  cp /root/batch/*.png "$R/" 2>/dev/null ) & A=$!
( export CUDA_VISIBLE_DEVICES=1
  step bench_plain 300 python3 bench/eval_bench.py --parts plain --target $HF --out-json "$R/bench_plain.json"
  DRAFTSMITH_TEST_TARGET=$HF step gpu_tests 300 python3 -m pytest -q --run-gpu \
    tests/gpu/test_train_gpu.py::test_compiled_static_step_8k_memory_and_no_recompile \
    "tests/unit/test_spec_fused.py::test_compiled_drafter_step_drafts_the_same"
  while [ ! -f $RUN/.pipeline/vocab.done ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
  lane abl2_lr2e3 abl2_lr2e3_chain abl2_decay1 abl2_decay1_chain & B1=$!
  lane abl2_top abl2_top_chain abl2_alltok abl2_alltok_chain & B2=$!
  wait $B1 $B2
  step eval_kernel_check 300 python3 -m draftsmith eval --target $HF --drafter $RUN/abl2_defaults --mode chain \
    --depth 7 --kernel-check --out /root/eval_kernel_check
  step eval_tree_auto 300 python3 -m draftsmith eval --target $HF --drafter $RUN/abl2_defaults --tree auto \
    --out /root/eval_tree_auto ) & B=$!
wait $A $B
python3 experiments/summarise_ablation.py $RUN --out "$R/ablation.md" > "$R/summary.log" 2>&1
touch "$R/ALL_DONE"

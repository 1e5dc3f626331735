#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on one or two GPUs (nvidia-h200 or nvidia-h200-x2). What the
# runs of 2026-12-01 (BENCHMARKS.md) left owed, issue 13 first:
#   GPU 0  recipes/ablation4_h200.yaml: twice the recipe's distinct data (about 6 GPU-minutes of
#          synth), today's defaults on it for the same 31.8M tokens, its MT-bench chain τ; then
#          its chain τ on its own held-out prompts (bench/val_questions.py: issue 17's ratio split
#          into simulation and distribution shift) and `eval --k auto` (issue 15), as far as the
#          deadline allows
#   GPU 1  recipes/h200.yaml's data, then recipes/ablation3_h200.yaml's `abl3_wide` (the drafter's
#          MLP 4x wider) at the full budget and its MT-bench chain τ; then the compiled-step
#          training tests (minutes of compiling, alone on their GPU)
#   before (drafter-independent, so with a random drafter; GPU 1 on two GPUs): eval's GPU test of a
#          compiled target, then the cycle breakdown with the target's forward compiled in its
#          graphs beside the uncompiled one (eval --compile-target, issue 15's lever: the plain and
#          verification forwards are launch-bound)
#   one GPU: the compiled target's GPU test beside the fourth ablation's synth (a correctness test,
#          not a timing), then GPU 0's lane, with the cycle breakdown on the quiet GPU after its
#          MT-bench τ and before its held-out τ, as far as the deadline allows
# The GPUs share the host's CPUs (online training is host-bound), so tok/s beside another run is
# lower than on a quiet host.
#   setsid bash bench/h200_recipe.sh &     # then, call after call: bash bench/fetch_results.sh 540
# Needs the embedded default's GGUF at $GGUF and the wheels the image lacks importable
# (bench/h200_wheels.sh fetches them into .whl); reruns skip finished steps; no step starts
# after $DEADLINE and none runs past $HARD_DEADLINE (epoch seconds; default: 24 and 2 minutes
# after the start), so the lease's end cuts nothing unseen.
set -uo pipefail
. "$(dirname "$0")/steps.sh"
Y=recipes/h200.yaml
A3=recipes/ablation3_h200.yaml
A4=recipes/ablation4_h200.yaml
driver_start 24 2

ablation4() { step abl4_data2x 1500 python3 -m draftsmith pipeline $A4; }
held_out() {  # the fourth ablation's chain τ on its own held-out prompts, then --k auto
  local run=/root/runs/h200_2x
  [ -f "$R/abl4_data2x.ok" ] || return
  python3 bench/val_questions.py $run/prepare --target $HF --out "$R/val_questions.jsonl" > "$R/val_questions.log" 2>&1
  step eval_held_out 300 python3 -m draftsmith eval --target $HF --drafter $run/abl4_data2x --bench "$R/val_questions.jsonl" \
    --mode chain --k 7 --num-questions 80 --no-speed --out /root/eval_held_out
  step eval_k_auto 300 python3 -m draftsmith eval --target $HF --drafter $run/abl4_data2x \
    --k auto --num-questions 24 --out /root/eval_k_auto
}
lane_wide() {  # the recipe's data, the wider drafter, then the compiled-step training tests
  step data 600 python3 -m draftsmith pipeline $Y --only synth,magpie,magpie2,prepare,vocab || return
  step abl3_wide 1500 python3 -m draftsmith pipeline $A3 --only abl3_wide,abl3_wide_chain
  step gpu_tests_compiled 420 python3 -m pytest -q -rA --durations=0 --run-gpu tests/gpu/test_train_gpu.py -k compiled
}
test_compiled_target() {
  DRAFTSMITH_TEST_TARGET=$HF step gpu_test_compiled_target 240 python3 -m pytest -q -rA --run-gpu \
    tests/gpu/test_eval_gpu.py -k compiled_target
}
bench_compiled_target() {  # issue 15: the cycle with and without the target's forward compiled
  step bench_cycle_compiled 360 python3 bench/eval_bench.py --parts cycle --compile-target --target $HF \
    --out-json "$R/bench_cycle_compiled.json"
}
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=0; ablation4; held_out) & A=$!
  (export CUDA_VISIBLE_DEVICES=1; test_compiled_target; bench_compiled_target; lane_wide) & B=$!
  wait $A $B
else
  test_compiled_target & T=$!
  ablation4
  wait $T
  bench_compiled_target
  held_out
fi
for run in /root/runs/h200 /root/runs/h200_2x; do
  [ -d $run ] && python3 bench/summarise_ablation.py $run --out "$R/ablation_$(basename $run).md" >> "$R/summary.log" 2>&1
done
touch "$R/ALL_DONE"

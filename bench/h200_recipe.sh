#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on one or two GPUs (nvidia-h200 or nvidia-h200-x2). What the
# runs of 2026-12-01 (BENCHMARKS.md) left owed:
#   GPU 0  recipes/h200.yaml with its new data (twice the Magpie conversations, issue 13's fourth
#          ablation): data, train_online at the full 31.8M tokens, eval_chain with its speed run
#          (the recipe's figures for the README); then its chain τ on held-out prompts spread
#          over the validation split (issue 17's ratio, split into simulation and distribution
#          shift), eval_chain again with the target's forward compiled (`--compile-target`, issue
#          15: end to end, before it can be the default), then eval_tree, as the deadline allows
#   GPU 1  eval's compiled-target GPU test and the cycle breakdown (a random drafter: the chain's
#          draft masks are made once per cycle since 2026-12-01 17:10, unmeasured), then, once GPU 0's vocab is done, recipes/
#          ablation3_h200.yaml's `abl3_wide` (the drafter's MLP 4x wider) on the same data and its
#          MT-bench chain τ; then the compiled-step training tests (minutes of compiling) and
#          `eval --k auto` with GPU 0's drafter (issue 15, after the spread calibration)
#   one GPU: the compiled-target test beside GPU 0's synth (a correctness test, not a timing),
#          then GPU 0's lane
# The GPUs share the host's CPUs (online training is host-bound), so tok/s beside another run is
# lower than on a quiet host.
#   setsid bash bench/h200_recipe.sh &     # then, call after call: bash bench/fetch_results.sh 540
# Needs the embedded default's GGUF at $GGUF and the wheels the image lacks importable
# (bench/h200_wheels.sh fetches them into .whl); reruns skip finished steps; no step starts
# after $DEADLINE and none runs past $HARD_DEADLINE (epoch seconds; default: 25 and 2 minutes
# after the start), so the lease's end cuts nothing unseen. On one GPU the recipe step (data 5.4
# min, training 14-16, eval_chain with its speed run about 4, on 2026-12-01's figures) needs most
# of that: start it within a minute of the lease and poll back to back.
set -uo pipefail
. "$(dirname "$0")/steps.sh"
Y=recipes/h200.yaml
A3=recipes/ablation3_h200.yaml
driver_start 25 2

lane_recipe() {  # the recipe, then what its drafter still owes
  local full  # quickstart --budget full's stages of the recipe: its data stages, train_online, eval_chain
  full=$(python3 -c "from draftsmith.pipeline.quickstart import budget_stages; print(','.join(s[0] for s in budget_stages('full')))")
  step recipe 1560 python3 -m draftsmith pipeline $Y --only "$full" || return
  python3 bench/val_questions.py $RUN/prepare --target $HF --out "$R/val_questions.jsonl" > "$R/val_questions.log" 2>&1
  step eval_held_out 240 python3 -m draftsmith eval --target $HF --drafter $RUN/train_online --bench "$R/val_questions.jsonl" \
    --mode chain --k 7 --num-questions 80 --no-speed --out /root/eval_held_out
  step eval_chain_compiled 420 python3 -m draftsmith eval --target $HF --drafter $RUN/train_online --compile-target \
    --mode chain --k 7 --num-questions 80 --out /root/eval_chain_compiled
  step eval_tree 420 python3 -m draftsmith pipeline $Y --only eval_tree
}
test_compiled_target() {
  DRAFTSMITH_TEST_TARGET=$HF step gpu_test_compiled_target 240 python3 -m pytest -q -rA --run-gpu \
    tests/gpu/test_eval_gpu.py -k compiled_target
}
bench_cycle() {  # issue 15: the cycle breakdown with and without the target's forward compiled (a random drafter)
  step bench_cycle_compiled 360 python3 bench/eval_bench.py --parts cycle --compile-target --target $HF \
    --out-json "$R/bench_cycle_compiled.json"
}
lane_wide() {  # the wider drafter on GPU 0's data, then the compiled-step training tests
  while [ ! -f $RUN/.pipeline/vocab.done ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
  step abl3_wide 1500 python3 -m draftsmith pipeline $A3 --only abl3_wide,abl3_wide_chain
  step gpu_tests_compiled 420 python3 -m pytest -q -rA --durations=0 --run-gpu tests/gpu/test_train_gpu.py -k compiled
  [ -f $RUN/.pipeline/train_online.done ] && step eval_k_auto 300 python3 -m draftsmith eval --target $HF \
    --drafter $RUN/train_online --k auto --num-questions 24 --out /root/eval_k_auto
}
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=0; lane_recipe) & A=$!
  (export CUDA_VISIBLE_DEVICES=1; test_compiled_target; bench_cycle; lane_wide) & B=$!
  wait $A $B
else
  test_compiled_target & T=$!
  lane_recipe
  wait $T
fi
[ -d $RUN ] && python3 bench/summarise_ablation.py $RUN --out "$R/ablation_h200.md" >> "$R/summary.log" 2>&1
touch "$R/ALL_DONE"

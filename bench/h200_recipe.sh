#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on one or two GPUs (nvidia-h200 or nvidia-h200-x2):
#   GPU 0  the critical path: recipes/h200.yaml with today's defaults at its full budget (issue
#          13's targets): GSM8K and two-turn Magpie synth, prepare, vocab, train_online (31.8M
#          tokens), the vLLM export, MT-bench chain; then the chain at temperature 1
#   GPU 1  the GPU tests that compile nothing, while GPU 0 makes the data (the synth stages share
#          one output folder, so they cannot run side by side); then the offline reader at recipe scale (extract + train_offline, issue 13 item 5);
#          then issue 15's GPU figures (`bench15`: the cycle breakdown, `eval --tree auto` and
#          `--kernel-check`, batch sizes 1/4/16 at temperature 0 and 1) with a frozen copy of
#          train_online's drafter at its first validation (8M tokens); MT-bench tree with the
#          final drafter as soon as train_online is done, between bench15's steps
#   one GPU: the GPU tests beside the recipe's synth, then the recipe to eval_tree, then issue
#          15's figures with the recipe's drafter; no offline training
# recipes/ablation3_h200.yaml (the third ablation) is not in this run: it needs a lease of its own.
# The GPUs share the host's CPUs (online training is host-bound), so tok/s beside another run is
# lower than on a quiet host.
#   setsid bash bench/h200_recipe.sh &     # then, call after call: bash bench/fetch_results.sh 540
# Needs the embedded default's GGUF at $GGUF (and `gguf` importable); reruns skip finished steps;
# no step starts after $DEADLINE and none runs past $HARD_DEADLINE (epoch seconds; default: 21
# and 24 minutes after the start), so the lease's end cuts nothing unseen.
set -uo pipefail
. "$(dirname "$0")/steps.sh"
Y=recipes/h200.yaml
stage() { step "$1" "$2" python3 -m draftsmith pipeline $Y --only "$1"; }
driver_start 21 3

gpu_tests() {  # one step per compiled test: each compiles for minutes (alone on the GPU, the file
  # passed its first two tests and was still compiling the third at 230 s, 2026-12-01)
  local t=tests/gpu/test_train_gpu.py
  step gpu_tests 300 python3 -m pytest -q -rA --durations=0 --run-gpu $t -k "not compiled"
  step gpu_test_compiled_matches 480 python3 -m pytest -q -rA --durations=0 --run-gpu \
    "$t::test_compiled_static_step_matches_the_compacted_step"
  step gpu_test_compiled_once 480 python3 -m pytest -q -rA --durations=0 --run-gpu \
    "$t::test_compiled_static_step_8k_memory_and_no_recompile"
}
wait_for() {  # wait_for PATH: until PATH exists (false if the deadline comes first)
  while [ ! -e "$1" ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
  [ -e "$1" ]
}
recipe() {
  step recipe 1800 python3 -m draftsmith pipeline $Y --only \
    synth,magpie,magpie2,prepare,vocab,train_online,export_vllm,eval_chain || return
  step eval_tree 600 python3 -m draftsmith pipeline $Y --only eval_tree
}
tree_if_ready() {  # MT-bench tree with the final drafter, once train_online is done
  [ -f $RUN/.pipeline/train_online.done ] && stage eval_tree 600
  return 0
}
freeze_drafter() {  # freeze_drafter DEST: a copy of train_online's best drafter so far
  wait_for $RUN/train_online/drafter/model.safetensors || return
  for _ in 1 2 3; do  # a validation may replace the folder while it is copied: check the copy
    rm -rf "$1" && cp -r $RUN/train_online/drafter "$1" 2>/dev/null &&
      python3 -c "import sys; from draftsmith.draft.checkpoint import load_drafter; load_drafter(sys.argv[1])" "$1" && return
    sleep 3
  done
  return 1
}
bench15() {  # issue 15's GPU figures with the drafter $1 (questions: $BENCH_Q, batch runs: $BATCH_Q)
  local q=${BENCH_Q:-24}
  step bench_cycle 300 python3 bench/eval_bench.py --parts cycle --target $HF --drafter "$1" \
    --out-json "$R/bench_cycle.json"; tree_if_ready
  step eval_tree_auto 300 python3 -m draftsmith eval --target $HF --drafter "$1" --tree auto \
    --num-questions $q --out /root/eval_tree_auto; tree_if_ready
  step eval_kernel_check 300 python3 -m draftsmith eval --target $HF --drafter "$1" --mode chain \
    --k 7 --kernel-check --num-questions $q --out /root/eval_kernel_check; tree_if_ready
  step bench_batch 480 python3 bench/eval_bench.py --parts batch --target $HF --drafter "$1" \
    --num-questions "${BATCH_Q:-16}" --out-dir /root/batch --out-json "$R/bench_batch.json"
  cp /root/batch/*.png "$R/" 2>/dev/null
  tree_if_ready
}
lane_recipe() {
  export CUDA_VISIBLE_DEVICES=0
  step recipe 1800 python3 -m draftsmith pipeline $Y --only \
    synth,magpie,magpie2,prepare,vocab,train_online,export_vllm,eval_chain || return
  stage eval_chain_t1 600
}
lane_gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  step gpu_tests 300 python3 -m pytest -q -rA --durations=0 --run-gpu tests/gpu/test_train_gpu.py -k "not compiled"
  wait_for $RUN/.pipeline/vocab.done && step offline 330 python3 -m draftsmith pipeline $Y --only extract,train_offline
  freeze_drafter /root/drafter_8m && bench15 /root/drafter_8m
  wait_for $RUN/.pipeline/train_online.done && tree_if_ready
}
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  lane_recipe & A=$!
  lane_gpu1 & B=$!
  wait $A $B
else
  gpu_tests & T=$!
  recipe
  wait $T
  bench15 $RUN/train_online
fi
touch "$R/ALL_DONE"

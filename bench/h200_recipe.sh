#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on one or two GPUs (nvidia-h200 or nvidia-h200-x2):
#   GPU 0  recipes/h200.yaml with today's defaults at its full budget (issue 13's targets): the
#          data, train_online (31.8M tokens), the vLLM export, then MT-bench chain and tree, then
#          (two GPUs) the store and offline training (the offline reader's throughput at recipe scale)
#   GPU 1  the GPU tests while the data is made; then recipes/ablation3_h200.yaml's first two
#          runs side by side and their MT-bench τ; then, with abl3_defaults' drafter on a GPU that
#          runs nothing else, issue 15's GPU figures (`bench15`: the cycle breakdown, `eval --tree
#          auto` and `--kernel-check`, batch sizes 1/4/16); then the ablation's last two runs
#   one GPU: the GPU tests beside the recipe's synth, then the recipe to eval_tree, then issue
#          15's figures with the recipe's drafter; no ablation, no offline training
# The GPUs share the host's CPUs (online training is host-bound), so tok/s beside another run is
# lower than on a quiet host.
#   setsid bash bench/h200_recipe.sh &     # then, call after call: bash bench/fetch_results.sh 540
# Needs the embedded default's GGUF at $GGUF (and `gguf` importable); reruns skip finished steps;
# no step starts after $DEADLINE and none runs past $HARD_DEADLINE (epoch seconds; default: 22
# and 25 minutes after the start), so the lease's end cuts nothing unseen.
set -uo pipefail
. "$(dirname "$0")/steps.sh"
A3=recipes/ablation3_h200.yaml
stage3() { step "$1" 900 python3 -m draftsmith pipeline $A3 --only "$1"; }
driver_start 22 3

gpu_tests() {  # one step per compiled test: each compiles for minutes (alone on the GPU, the file
  # passed its first two tests and was still compiling the third at 230 s, 2026-12-01)
  local t=tests/gpu/test_train_gpu.py
  step gpu_tests 300 python3 -m pytest -q -rA --durations=0 --run-gpu $t -k "not compiled"
  step gpu_test_compiled_matches 480 python3 -m pytest -q -rA --durations=0 --run-gpu \
    "$t::test_compiled_static_step_matches_the_compacted_step"
  step gpu_test_compiled_once 480 python3 -m pytest -q -rA --durations=0 --run-gpu \
    "$t::test_compiled_static_step_8k_memory_and_no_recompile"
}
recipe() {
  step recipe 1800 python3 -m draftsmith pipeline recipes/h200.yaml --only \
    synth,magpie,magpie2,prepare,vocab,train_online,export_vllm,eval_chain || return
  step eval_tree 600 python3 -m draftsmith pipeline recipes/h200.yaml --only eval_tree
}
bench15() {  # issue 15's GPU figures with the drafter $1, on a GPU that runs nothing else
  step bench_cycle 300 python3 bench/eval_bench.py --parts cycle --target $HF --drafter "$1" \
    --out-json "$R/bench_cycle.json"
  step eval_tree_auto 300 python3 -m draftsmith eval --target $HF --drafter "$1" --tree auto \
    --num-questions 40 --out /root/eval_tree_auto
  step eval_kernel_check 300 python3 -m draftsmith eval --target $HF --drafter "$1" --mode chain \
    --k 7 --kernel-check --num-questions 40 --out /root/eval_kernel_check
  step bench_batch 420 python3 bench/eval_bench.py --parts batch --target $HF --drafter "$1" \
    --num-questions "${BATCH_Q:-32}" --out-dir /root/batch --out-json "$R/bench_batch.json"
  cp /root/batch/*.png "$R/" 2>/dev/null
}
lane_recipe() {
  export CUDA_VISIBLE_DEVICES=0
  recipe || return
  # issue 13 item 5: the offline reader at recipe scale (a 27 GB store), if the time is left
  step offline 600 python3 -m draftsmith pipeline recipes/h200.yaml --only extract,train_offline
}
lane_gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  gpu_tests
  while [ ! -f $RUN/.pipeline/vocab.done ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
  stage3 abl3_defaults & stage3 abl3_lr4e3 & wait
  stage3 abl3_defaults_chain & stage3 abl3_lr4e3_chain & wait
  bench15 $RUN/abl3_defaults
  (stage3 abl3_alltok && stage3 abl3_alltok_chain) & (stage3 abl3_decay1 && stage3 abl3_decay1_chain) & wait
}
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  lane_recipe & A=$!
  lane_gpu1 & B=$!
  wait $A $B
  python3 bench/summarise_ablation.py $RUN --out "$R/ablation.md" > "$R/summary.log" 2>&1
else
  gpu_tests & T=$!
  recipe
  wait $T
  BATCH_Q=16 bench15 $RUN/train_online
fi
touch "$R/ALL_DONE"

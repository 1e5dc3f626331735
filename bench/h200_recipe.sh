#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on one or two GPUs (nvidia-h200 or nvidia-h200-x2). What the
# run of 2026-12-01 (BENCHMARKS.md) left owed:
#   GPU 0  recipes/h200.yaml with today's defaults at its full budget (the data, train_online, the
#          vLLM export), then with that drafter: the chain at temperature 1 (one CUDA graph since
#          6e6bbb3; 40 questions), the cycle breakdown (also at temperature 1), `eval --k auto`,
#          MT-bench tree (its speed-up), as far as the deadline allows
#   GPU 1  the GPU tests that compile nothing (eval's, with the graphed sampled chain, and
#          train's) while GPU 0 makes the data; then the first full-budget run of
#          recipes/ablation3_h200.yaml beside train_online, and its MT-bench chain τ
#   one GPU (nvidia-h200; today's defaults at the full budget were measured on 2026-12-01): the GPU
#          tests beside the recipe's data, then the third ablation's first run at the full budget
#          (abl3_alltok_noise; abl3_lr4e3 if it fails), then with its drafter: MT-bench chain
#          (τ and speed-up) and GPU 0's evaluations, as far as the deadline allows
# The GPUs share the host's CPUs (online training is host-bound), so tok/s beside another run is
# lower than on a quiet host.
#   setsid bash bench/h200_recipe.sh &     # then, call after call: bash bench/fetch_results.sh 540
# Needs the embedded default's GGUF at $GGUF and the wheels the image lacks importable
# (bench/h200_wheels.sh fetches them into .whl); reruns skip finished steps; no step starts
# after $DEADLINE and none runs past $HARD_DEADLINE (epoch seconds; default: 22 and 25 minutes
# after the start), so the lease's end cuts nothing unseen.
set -uo pipefail
. "$(dirname "$0")/steps.sh"
Y=recipes/h200.yaml
A3=recipes/ablation3_h200.yaml
stage() { step "$1" "$2" python3 -m draftsmith pipeline $Y --only "$1"; }
driver_start 22 3

gpu_tests() {  # the GPU tests that compile nothing (the compiled-step tests, minutes of compiling
  # each: pytest --run-gpu tests/gpu/test_train_gpu.py -k compiled, alone on a GPU)
  # (the image cannot install the embedded default's package: eval's tests read the converted folder)
  DRAFTSMITH_TEST_TARGET=$HF step gpu_tests 420 python3 -m pytest -q -rA --durations=0 --run-gpu \
    tests/gpu/test_eval_gpu.py tests/gpu/test_train_gpu.py -k "not compiled"
}
wait_for() {  # wait_for PATH: until PATH exists (false if the deadline comes first)
  while [ ! -e "$1" ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
  [ -e "$1" ]
}
recipe() {  # the data, the 32M-token training and its export (and $1: more recipe stages)
  step recipe 1800 python3 -m draftsmith pipeline $Y --only \
    synth,magpie,magpie2,prepare,vocab,train_online,export_vllm${1:+,$1}
}
owed15() {  # issue 15's owed figures with the drafter $1 (train_online's unless given) on $2 questions
  local d=${1:-$RUN/train_online} n=${2:-40}
  step eval_chain_t1 300 python3 -m draftsmith eval --target $HF --drafter $d --mode chain --k 7 \
    --temperature 1 --num-questions $n --out /root/eval_chain_t1
  step bench_cycle 300 python3 bench/eval_bench.py --parts cycle --target $HF --drafter $d \
    --out-json "$R/bench_cycle.json"
  step eval_k_auto 300 python3 -m draftsmith eval --target $HF --drafter $d --k auto \
    --num-questions $n --out /root/eval_k_auto
  step eval_tree 600 python3 -m draftsmith eval --target $HF --drafter $d --mode tree --k 7 --top-k 10 \
    --total-tokens 60 --num-questions 80 --out /root/eval_tree
}
lane_gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  gpu_tests
  wait_for $RUN/.pipeline/vocab.done || return
  step abl3_alltok_noise 1800 python3 -m draftsmith pipeline $A3 --only abl3_alltok_noise,abl3_alltok_noise_chain
}
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=0; recipe && owed15) & A=$!
  lane_gpu1 & B=$!
  wait $A $B
  python3 bench/summarise_ablation.py $RUN --out "$R/ablation.md" > "$R/summary.log" 2>&1
else
  gpu_tests & T=$!
  step data 900 python3 -m draftsmith pipeline $Y --only synth,magpie,magpie2,prepare,vocab
  step abl3_alltok_noise 1200 python3 -m draftsmith pipeline $A3 --only abl3_alltok_noise &&
    d=$RUN/abl3_alltok_noise ||
    { step abl3_lr4e3 1200 python3 -m draftsmith pipeline $A3 --only abl3_lr4e3 && d=$RUN/abl3_lr4e3; }
  wait $T
  step eval_abl3_chain 300 python3 -m draftsmith eval --target $HF --drafter $d --mode chain --k 7 \
    --num-questions 80 --out /root/eval_abl3_chain
  owed15 $d 24
  python3 bench/summarise_ablation.py $RUN --out "$R/ablation.md" > "$R/summary.log" 2>&1
fi
touch "$R/ALL_DONE"

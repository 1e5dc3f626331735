#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on a 2-GPU host (nvidia-h200-x2):
#   both   first, the 2-GPU test: the embedded default split over both GPUs (issue 18 item 4)
#   GPU 0  recipes/h200.yaml at its full budget (issue 13), its chain and tree evaluation
#          (issue 15's targets), then the cycle breakdown and the temperature-1 chain
#   GPU 1  the GPU tests, then recipes/h200_mix.yaml (issue 17; its training budget is
#          $MIX_STEPS steps), then batch sizes 1/4/16 and the training-throughput variants
# Every single-GPU figure comes from one H200 that runs nothing else.
#   setsid bash bench/h200_recipe.sh &     # then: draftsmith status /root/runs/h200
# Needs the embedded default's GGUF at $GGUF (and `gguf` importable), the mix's frozen prompts in
# runs/h200_mix_prompts (bench/freeze_mix.py); reruns skip finished steps; no step starts after
# $DEADLINE (epoch seconds; default: 21 minutes after the start) so the lease's end cuts no run.
set -uo pipefail
R=${R:-/root/results}
GGUF=${GGUF:-/root/m/SmolLM2-135M-Instruct.Q4_1.gguf}
HF=/root/smollm2-hf
RUN=/root/runs/h200
MIX=/root/runs/h200_mix
MIX_STEPS=${MIX_STEPS:-2600}
export DEADLINE=${DEADLINE:-$(( $(date +%s) + 21 * 60 ))}
mkdir -p "$R"
export PYTHONUNBUFFERED=1
. "$(dirname "$0")/steps.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' >> "$R/gpu.txt"
[ -f $HF/config.json ] || step convert 300 python3 bench/gguf_to_hf.py "$GGUF" $HF
# the mix recipe at the training budget of this run (the shipped file says 3,900 steps)
sed "s/steps: 3900/steps: $MIX_STEPS/" recipes/h200_mix.yaml > recipes/h200_mix_run.yaml

DRAFTSMITH_TEST_SMOLLM2=$HF step gpu2_shard 300 python3 -m pytest -q --run-gpu tests/gpu/test_shard_gpu.py

lane_recipe() {
  export CUDA_VISIBLE_DEVICES=0
  step recipe 1800 python3 -m draftsmith pipeline recipes/h200.yaml --only \
    synth,magpie,magpie2,prepare,vocab,train_online,export_vllm,eval_chain || return
  step eval_tree 600 python3 -m draftsmith pipeline recipes/h200.yaml --only eval_tree
  step bench_cycle 300 python3 bench/eval_bench.py --parts cycle --target $HF --drafter $RUN/train_online \
    --out-json "$R/bench_cycle.json"
  step eval_chain_t1 600 python3 -m draftsmith pipeline recipes/h200.yaml --only eval_chain_t1
}
lane_mix() {
  export CUDA_VISIBLE_DEVICES=1
  DRAFTSMITH_TEST_SMOLLM2=$HF step gpu_tests 420 python3 -m pytest -q --run-gpu tests/gpu tests/unit/test_spec_fused.py
  step mix 1800 python3 -m draftsmith pipeline recipes/h200_mix_run.yaml || return
  step bench_batch 420 python3 bench/eval_bench.py --parts batch --target $HF --drafter $MIX/train_online \
    --num-questions 32 --batch-modes chain,tree --out-json "$R/bench_batch.json"
  step bench_train 420 python3 bench/train_bench.py $MIX/prepare --target $HF --variant default: \
    --variant padded:capture=padded --variant compiled:compile_step=true --out-json "$R/bench_train.json"
}
lane_recipe & A=$!
lane_mix & B=$!
wait $A $B
touch "$R/ALL_DONE"

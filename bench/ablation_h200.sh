#!/usr/bin/env bash
# Issue 13's ablation (recipes/ablation_h200.yaml) on a 2-GPU host (nvidia-h200-x2):
#   GPU 0  the recipe's data (synth x3, prepare, vocab), then two ablation lanes side by side
#   GPU 1  the GPU tests while the data is made, then best_full (32M tokens) and its MT-bench
#          evals, then the remaining ablations and the per-knob MT-bench evals
#   setsid bash bench/ablation_h200.sh &   # then: tail /root/results/steps.log
# Needs the embedded default's GGUF at $GGUF (and `gguf` importable); reruns skip finished steps.
# bench/summarise_ablation.py turns /root/runs/h200 into the table of docs/train.md.
set -uo pipefail
R=${R:-/root/results}
GGUF=${GGUF:-/root/m/SmolLM2-135M-Instruct.Q4_1.gguf}
HF=/root/smollm2-hf
RUN=/root/runs/h200
Y=recipes/ablation_h200.yaml
mkdir -p "$R"
export PYTHONUNBUFFERED=1
. "$(dirname "$0")/steps.sh"
stages() { step "$1" "$2" python3 -m draftsmith pipeline $Y --only "$3"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' >> "$R/gpu.txt"
[ -f $HF/config.json ] || step convert 300 python3 bench/gguf_to_hf.py "$GGUF" $HF

( export CUDA_VISIBLE_DEVICES=0
  stages data 900 synth,magpie,magpie2,prepare,vocab
  stages lane_a 1500 abl_base,abl_rows8k,abl_lr1e3,abl_nbf,abl_fcnorm &
  sleep 20  # let lane a take its compile first
  stages lane_b 1500 abl_normout,abl_headinit,abl_headfrozen,abl_muon,abl_lr3e3
  wait ) & A=$!
( export CUDA_VISIBLE_DEVICES=1
  DRAFTSMITH_TEST_SMOLLM2=$HF step gpu_tests 600 python3 -m pytest -q --run-gpu tests/gpu
  while [ ! -f $RUN/.pipeline/vocab.done ]; do sleep 5; done
  stages best 1500 best_full,best_chain,best_tree
  stages lane_c 1500 abl_linear,abl_decay1,abl_rows2k,base_chain,abl_chain ) & B=$!
wait $A $B
python3 bench/summarise_ablation.py $RUN --out "$R/ablation.md" > "$R/summary.log" 2>&1
touch "$R/ALL_DONE"

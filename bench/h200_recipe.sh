#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on a 2-GPU host (nvidia-h200-x2), in two lanes:
#   GPU 0  the recipe (recipes/h200.yaml) in one `draftsmith pipeline` process, up to eval_chain
#   GPU 1  each stage's benchmark and the GPU tests, one after the other; then, once
#          train_online is done, the recipe's eval_chain_t1 and eval_tree (`pipeline --only`)
#   both   2-GPU extraction (compared with the 1-GPU store) and DDP training against one GPU
# Every single-GPU figure comes from one H200 that runs nothing else.
#   setsid bash bench/h200_recipe.sh &     # then: draftsmith status /root/runs/h200
# Needs the embedded default's GGUF at $GGUF (and `gguf` importable); reruns skip finished steps.
set -uo pipefail
R=${R:-/root/results}
GGUF=${GGUF:-/root/m/SmolLM2-135M-Instruct.Q4_1.gguf}
HF=/root/smollm2-hf
RUN=/root/runs/h200
mkdir -p "$R"
export PYTHONUNBUFFERED=1
. "$(dirname "$0")/steps.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' >> "$R/gpu.txt"
git rev-parse HEAD >> "$R/gpu.txt" 2>/dev/null
[ -f $HF/config.json ] || step convert 300 python3 bench/gguf_to_hf.py "$GGUF" $HF

lane_recipe() {
  CUDA_VISIBLE_DEVICES=0 step recipe 3000 python3 -m draftsmith pipeline recipes/h200.yaml --only \
    synth,magpie,magpie2,prepare,vocab,train_online,extract,train_offline,export_vllm,export_sglang,export_speculators,eval_chain
}
lane_bench() {
  export CUDA_VISIBLE_DEVICES=1
  DRAFTSMITH_TEST_SMOLLM2=$HF step gpu_tests 600 python3 -m pytest -q --run-gpu tests/gpu tests/unit/test_spec_fused.py
  step bench_eval_engine 300 python3 bench/eval_bench.py --target $HF --parts plain,verify --out-json "$R/bench_eval_engine.json"
  step bench_extract 300 python3 bench/extract_bench.py --target $HF --samples 2000 --length 1024 --writers 8 --work-dir /root/bench_extract_work --out-json "$R/bench_extract.json"
  step prep_gsm8k 120 python3 -m draftsmith prepare gsm8k --target $HF --out /root/gsm8k_ds
  step bench_train 400 python3 bench/train_bench.py /root/gsm8k_ds --target $HF --variant defaults: \
    --variant rows32k:batch_tokens=32768 --out-json "$R/bench_train.json"
  step bench_synth 400 python3 bench/synth_bench.py --target $HF --num-prompts 1000 --max-new-tokens 256 --batch-size 1000 --out-json "$R/bench_synth.json"
  while [ ! -f $RUN/.pipeline/train_online.done ]; do sleep 5; done
  step eval_chain_t1 1200 python3 -m draftsmith pipeline recipes/h200.yaml --only eval_chain_t1
  step eval_tree 1200 python3 -m draftsmith pipeline recipes/h200.yaml --only eval_tree
}
lane_recipe & A=$!
lane_bench & B=$!
wait $A $B
unset CUDA_VISIBLE_DEVICES
step extract_2gpu 600 torchrun --nproc-per-node 2 -m draftsmith extract $RUN/prepare --target $HF --out /root/extract_2gpu
step compare_2gpu 300 python3 bench/extract_bench.py --compare $RUN/extract /root/extract_2gpu --out-json "$R/bench_extract_2gpu.json"
step bench_ddp 900 python3 bench/ddp_bench.py --dataset $RUN/prepare --hidden $RUN/extract --target $HF --steps 16 --log-every 4 --work-dir /root/bench_ddp_work --out-json "$R/bench_ddp.json"
touch "$R/ALL_DONE"

#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md: the recipe (recipes/h200.yaml) end to end, then each
# stage's benchmark, one after the other on an otherwise idle GPU. Logs and JSON go to $R.
#   setsid bash bench/h200_recipe.sh &     # then: draftsmith status /root/runs/h200
# Needs the embedded default's GGUF at $GGUF (and `gguf` importable); reruns resume.
set -uo pipefail
R=${R:-/root/results}
GGUF=${GGUF:-/root/m/SmolLM2-135M-Instruct.Q4_1.gguf}
HF=/root/smollm2-hf
mkdir -p "$R"
export PYTHONUNBUFFERED=1
step() {  # step NAME TIMEOUT_S COMMAND...: run, log to $R/NAME.log, record rc and duration
  local name=$1 limit=$2; shift 2
  [ -f "$R/$name.json" ] && { echo "=== $name skipped: $R/$name.json exists" >> "$R/steps.log"; return; }
  echo "=== $name start $(date -u +%FT%TZ)" >> "$R/steps.log"
  timeout "$limit" "$@" > "$R/$name.log" 2>&1
  echo "=== $name rc=$? end $(date -u +%FT%TZ)" >> "$R/steps.log"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' >> "$R/gpu.txt"
[ -f $HF/config.json ] || step convert 300 python3 bench/gguf_to_hf.py "$GGUF" $HF
step recipe 1800 python3 -m draftsmith pipeline recipes/h200.yaml
step bench_eval_engine 300 python3 bench/eval_bench.py --target $HF --parts plain,verify --out-json "$R/bench_eval_engine.json"
step bench_extract 300 python3 bench/extract_bench.py --target $HF --samples 2000 --length 1024 --writers 8 --work-dir /root/bench_extract_work --out-json "$R/bench_extract.json"
step bench_train 300 python3 bench/train_bench.py --target $HF --seq-lens 2048,8192 --out-json "$R/bench_train_2k8k.json"
step bench_train32k 300 python3 bench/train_bench.py --target $HF --seq-lens 32768 --out-json "$R/bench_train_32k.json"
step bench_synth 400 python3 bench/synth_bench.py --target $HF --num-prompts 1000 --max-new-tokens 256 --out-json "$R/bench_synth.json"
step gpu_tests 400 python3 -m pytest -q --run-gpu tests/gpu
touch "$R/ALL_DONE"

#!/usr/bin/env bash
# Issue 13's second ablation (recipes/ablation2_h200.yaml) on a 2-GPU host (nvidia-h200-x2), and
# the GPU measurements still owed by issues 13, 15 and 18, in the device time of one session:
#   GPU 0  the recipe's data (synth x3, prepare, vocab), then three ablation runs and their
#          MT-bench chain τ
#   GPU 1  the GPU tests still unseen on a GPU while the data is made, then the other three
#          ablation runs and their MT-bench τ
#   then   with abl2_defaults' drafter, one GPU each: issue 15's cycle breakdown and batch sizes
#          1/4/16 (GPU 0), issue 18's generic-path-against-fast-engine decode speed, then
#          `eval --kernel-check` and `eval --tree auto` (GPU 1)
#   setsid bash bench/ablation_h200.sh &   # then: tail /root/results/steps.log
# Needs the embedded default's GGUF at $GGUF (and `gguf` importable); reruns skip finished steps;
# no step starts after $DEADLINE (epoch seconds; default: 22 minutes after the start).
# bench/summarise_ablation.py turns /root/runs/h200 into the table of docs/train.md.
set -uo pipefail
R=${R:-/root/results}
GGUF=${GGUF:-/root/m/SmolLM2-135M-Instruct.Q4_1.gguf}
HF=/root/smollm2-hf
RUN=/root/runs/h200
Y=recipes/ablation2_h200.yaml
export DEADLINE=${DEADLINE:-$(( $(date +%s) + 22 * 60 ))}
mkdir -p "$R"
export PYTHONUNBUFFERED=1
. "$(dirname "$0")/steps.sh"
stages() { step "$1" "$2" python3 -m draftsmith pipeline $Y --only "$3"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' >> "$R/gpu.txt"
[ -f $HF/config.json ] || step convert 300 python3 bench/gguf_to_hf.py "$GGUF" $HF

( export CUDA_VISIBLE_DEVICES=0
  stages data 600 synth,magpie,magpie2,prepare,vocab
  stages lane_a 1200 abl2_defaults,abl2_noise1,abl2_fcnorm,abl2_defaults_chain,abl2_noise1_chain,abl2_fcnorm_chain
  step bench_cycle 300 python3 bench/eval_bench.py --parts cycle --target $HF --drafter $RUN/abl2_defaults \
    --out-json "$R/bench_cycle.json"
  step bench_batch 420 python3 bench/eval_bench.py --parts batch --target $HF --drafter $RUN/abl2_defaults \
    --num-questions 32 --out-json "$R/bench_batch.json" ) & A=$!
( export CUDA_VISIBLE_DEVICES=1
  DRAFTSMITH_TEST_SMOLLM2=$HF step gpu_tests 300 python3 -m pytest -q --run-gpu \
    tests/gpu/test_train_gpu.py::test_compiled_static_step_8k_memory_and_no_recompile \
    "tests/unit/test_spec_fused.py::test_compiled_drafter_step_drafts_the_same"
  while [ ! -f $RUN/.pipeline/vocab.done ]; do sleep 5; done
  stages lane_b 1200 abl2_wd,abl2_lr2e3,abl2_decay1,abl2_wd_chain,abl2_lr2e3_chain,abl2_decay1_chain
  step bench_plain 300 python3 bench/eval_bench.py --parts plain --target $HF --out-json "$R/bench_plain.json"
  step eval_kernel_check 420 python3 -m draftsmith eval --target $HF --drafter $RUN/abl2_defaults --mode chain \
    --k 7 --kernel-check --out /root/eval_kernel_check
  step eval_tree_auto 420 python3 -m draftsmith eval --target $HF --drafter $RUN/abl2_defaults --tree auto \
    --out /root/eval_tree_auto ) & B=$!
wait $A $B
python3 bench/summarise_ablation.py $RUN --out "$R/ablation.md" > "$R/summary.log" 2>&1
touch "$R/ALL_DONE"

#!/usr/bin/env bash
# Issue 52's and 53's GPU checks that need no trained drafter, for a lease too short to train
# (about 12 device-minutes after vLLM's five carrying calls; experiments/vllm_h200.sh's header
# says how to carry). Each a step of experiments/steps.sh:
#   *_vllm        vLLM 0.26 serving an EAGLE-3, a P-EAGLE and a DFlash drafter (random weights: tau ~ 1; that they
#                 run on the GPU is the check) through eval --engine vllm, K=7 / the DFlash block (each step by phase: --vllm-profile)
#   *_gsm8k600    600 GSM8K question/answer samples (not on-policy: the rate is the figure) captured
#                 by transformers and by vLLM's stock connector, timed and compared
#   train_ab      train_online's rate on those 600 samples, the capture eager / compiled / eager
#   cycle         the chain, adaptive-chain (chain_walk: a graph and host read per step, with and
#                 without the look-ahead: chain_walk_sync) and tree
#                 cycles by part, the tree's top-k by its parts (bench/eval_bench.py; random drafter)
#   synth_profile synth's decode step at batch 1024, kernel by kernel (bench/synth_bench.py --profile)
#   gpu_train     train's GPU tests (the compiled capture's among them)
#   bash /root/parts/unpack.sh /root/parts && (setsid bash experiments/vllm_mid_h200.sh > /root/driver.log 2>&1 &)
# then poll back to back: bash experiments/fetch_results.sh 240
set -uo pipefail
cd "$(dirname "$0")/.."
. experiments/steps.sh
vllm_driver_start "${LEASE_MIN:-10}" 2
random_methods_vllm
capture_pair gsm8k src/draftsmith/assets/gsm8k_train.jsonl 600
train_ab /root/runs/ds_gsm8k600
step cycle 240 python3 bench/eval_bench.py --parts cycle --cycle-shapes chain,chain_walk,chain_walk_sync,tree --target "$HF" \
  --plain-prompts 3 --plain-tokens 128 --out-json "$R/cycle.json"
# synth's decode step at the recipe's batch, kernel by kernel (quickstart's synthesis is 12 of its 26.6 minutes)
step synth_profile 300 python3 bench/synth_bench.py --target "$HF" --num-prompts 1024 --batch-size 1024 --baseline-prompts 1 \
  --profile "$R/synth_profile" --out-json "$R/synth_bench.json"
DRAFTSMITH_TEST_TARGET=$HF step gpu_train 150 python3 -m pytest tests/gpu/test_train_gpu.py --run-gpu -q -p no:cacheprovider
touch "$R/ALL_DONE"

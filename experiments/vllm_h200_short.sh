#!/usr/bin/env bash
# The lease of 2026-12-05 05:16, re-planned: synthesis through vLLM ran at about 30k tok/s, so the
# recipe's nine synth sets would not leave time to train; its first two sets, a shorter online
# training (1,300 steps), then vllm_h200.sh's measurements. setsid bash experiments/vllm_h200_short.sh
cd /root/ds || exit 1
export PYTHONPATH=/root/vllm26:/root/site:$PWD/src:$PWD PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
. experiments/steps.sh
export DEADLINE=$(( $(date +%s) + 16*60 )) && export HARD_DEADLINE=$(( DEADLINE + 90 ))
Q=/root/runs/qs; D=$Q/train_online
cat > /root/short.yaml <<'Y'
stages:
  - synth: {prompts: gsm8k, max_new_tokens: 256, batch_size: 1024, keep_unfinished: true, generator: vllm}
  - synth: {name: magpie, magpie: 12000, max_new_tokens: 256, batch_size: 1024, keep_unfinished: true, generator: vllm}
  - prepare: {max_len: 2048}
  - vocab: {draft_vocab_size: 32000}
  - train: {name: train_online, steps: 1300, intermediate_size: 4x, num_layers: 2, val_every: 650, log_every: 100, save_every: 650}
Y
E=(--target "$HF" --mode chain --num-questions 80 --max-new-tokens 256)
capture_pair() {
  while [ ! -f "$Q/.pipeline/prepare.done" ]; do sleep 10; done
  head -200 "$Q/synth/conversations.jsonl" > /root/c200.jsonl
  step ds200 200 python3 -m draftsmith prepare /root/c200.jsonl --target "$HF" --out /root/runs/ds200 --max-len 2048 &&
  step extract_hf 200 python3 -m draftsmith extract /root/runs/ds200 --target "$HF" --out /root/runs/x_hf &&
  step extract_vllm 300 python3 -m draftsmith extract /root/runs/ds200 --target "$HF" --out /root/runs/x_vllm --engine vllm &&
  step extract_compare 100 python3 experiments/compare_stores.py /root/runs/x_hf /root/runs/x_vllm --out-json "$R/extract_compare.json"
}
capture_pair & C=$!
step short 560 python3 -m draftsmith pipeline /root/short.yaml --out $Q --target smollm2-135m
wait $C
step vllm_k7 480 python3 -m draftsmith eval "${E[@]}" --engine vllm --drafter "$D" --depth 7 --batch-size 1 --sweep 7:16,7:64 --out /root/runs/vllm_k7
step ds_b1 240 python3 -m draftsmith eval "${E[@]}" --drafter "$D" --depth 7 --batch-size 1 --out /root/runs/ds_b1
step vllm_k5k3 300 python3 -m draftsmith eval "${E[@]}" --engine vllm --drafter "$D" --depth 5 --batch-size 1 --sweep 3:1 --no-speed --out /root/runs/vllm_k5k3
step ds_b16 200 python3 -m draftsmith eval "${E[@]}" --drafter "$D" --depth 7 --batch-size 16 --out /root/runs/ds_b16
touch "$R/ALL_DONE"

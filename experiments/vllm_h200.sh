#!/usr/bin/env bash
# Issue 52's lease on one H200: the recipe's drafter made, then measured inside vLLM (0.26.0,
# carried: experiments/h200_carry.sh). Each a step of experiments/steps.sh:
#   data+train    SHORT=0: `draftsmith quickstart` (budget full), timed as a whole; SHORT=1 (the lease
#                 of 2026-12-05 05:16, once quickstart's synthesis through vLLM proved too slow to
#                 leave time to train): the recipe's first two synth sets, prepare, vocab and a
#                 1,300-step train_online with --compile-capture (again without it if that fails)
#   vllm_k753     eval --engine vllm, K=7, 5 and 3 at batch 1 (and K=7 at 80 rows), one plain pass
#   ds_b1         draftsmith's engine at batch 1 on MT-bench
#   gpu_adaptive  the adaptive chain's GPU test (eval --stop-below, graphed)
#   ds_adaptive   eval --stop-below auto at batch 1: tau, drafts per cycle and speed-up against ds_b1
#   ds_b16        draftsmith's engine at batch 16
#   vllm_b16      eval --engine vllm, K=7 at batch 16 and 64
#   *1000         1,000 samples of the run's dataset captured by transformers and by vLLM's stock
#                 connector, timed and compared (experiments/compare_stores.py)
#   cycle_profile the chain, adaptive-chain and tree cycles of that drafter, by part and kernel by
#                 kernel (bench/eval_bench.py --profile: a torch.profiler table and trace per shape)
# MAGPIE (12000), STEPS (1300) and NQ (80 questions a pass) size the run for a shorter lease.
# SHORT=1 synthesises with the local engine (faster than vLLM's, LOG 2026-12-05 05:16) and keeps
# its answers for the next lease (pack_answers; restored from .data/short_synth.tgz.part* when
# carried back, so a later lease goes straight to training).
# After the five carrying calls (h200_carry.sh's header), in the last one:
#   bash /root/parts/unpack.sh /root/parts && (SHORT=1 setsid bash experiments/vllm_h200.sh > /root/driver.log 2>&1 &)
# then poll back to back: bash experiments/fetch_results.sh 240 (a lease taken back mid-run keeps
# only what the last poll brought: 2026-12-05 13:54 lost all of its first 540 s)
set -uo pipefail
cd "$(dirname "$0")/.."
. experiments/steps.sh
vllm_driver_start "${LEASE_MIN:-24}" 2
Q=/root/runs/qs
D=$Q/train_online
E=(--target "$HF" --mode chain --num-questions "${NQ:-80}" --max-new-tokens 256)
SYNTH="max_new_tokens: 256, batch_size: 1024, keep_unfinished: true"
cat > /root/short.yaml <<Y
stages:
  - synth: {prompts: gsm8k, $SYNTH}
  - synth: {name: magpie, magpie: ${MAGPIE:-12000}, $SYNTH}
  - prepare: {max_len: 2048}
  - vocab: {draft_vocab_size: 32000}
  - train: {name: train_online, steps: ${STEPS:-1300}, intermediate_size: 4x, num_layers: 2, val_every: $(( ${STEPS:-1300} / 2 )), log_every: 100, save_every: $(( ${STEPS:-1300} / 2 )), compile_capture: true}
Y

capture_pair() {  # N samples of the run's dataset, by transformers and by vLLM, compared and timed
  head -"$1" "$Q/synth/conversations.jsonl" > /root/c$1.jsonl
  step ds$1 200 python3 -m draftsmith prepare /root/c$1.jsonl --target "$HF" --out /root/runs/ds$1 --max-len 2048 &&
    step extract_hf$1 200 python3 -m draftsmith extract /root/runs/ds$1 --target "$HF" --out /root/runs/x_hf$1 &&
    step extract_vllm$1 300 python3 -m draftsmith extract /root/runs/ds$1 --target "$HF" --out /root/runs/x_vllm$1 --engine vllm &&
    step extract_compare$1 100 python3 experiments/compare_stores.py /root/runs/x_hf$1 /root/runs/x_vllm$1 --out-json "$R/extract_compare$1.json"
}

start=$(date +%s)
if [ "${SHORT:-1}" = 1 ]; then
  [ -f "$Q/.pipeline/synth.done" ] || restore_answers short
  # the lease of 2026-12-05 10:4x: training with --compile-capture (a whole run of it, issue 52),
  # and without it if the compiled capture fails
  step short 560 python3 -m draftsmith pipeline /root/short.yaml --out "$Q" --target smollm2-135m ||
    { sed -i 's/, compile_capture: true//' /root/short.yaml &&
      step short_eager 560 python3 -m draftsmith pipeline /root/short.yaml --out "$Q" --target smollm2-135m; }
  pack_answers short "$Q" synth magpie
else
  step quickstart 1500 python3 -m draftsmith quickstart --out "$Q"
fi
echo "data and training: $(( $(date +%s) - start )) s" >> "$R/steps.log"
# K=7, 5 and 3 at batch 1 in one vLLM process, with one plain pass (and K=7 at 80 rows at once)
step vllm_k753 540 python3 -m draftsmith eval "${E[@]}" --engine vllm --drafter "$D" --depth 7 --batch-size 1 \
  --sweep 5:1,3:1 --out /root/runs/vllm_k753
step ds_b1 330 python3 -m draftsmith eval "${E[@]}" --drafter "$D" --depth 7 --batch-size 1 --out /root/runs/ds_b1
# the adaptive chain (eval --stop-below) graphed: its GPU test, then --stop-below auto against ds_b1's K=7
DRAFTSMITH_TEST_TARGET=$HF step gpu_adaptive 150 python3 -m pytest tests/gpu/test_eval_gpu.py --run-gpu -q \
  -p no:cacheprovider -k adaptive
step ds_adaptive 330 python3 -m draftsmith eval "${E[@]}" --drafter "$D" --stop-below auto --batch-size 1 \
  --out /root/runs/ds_adaptive
step ds_b16 200 python3 -m draftsmith eval "${E[@]}" --drafter "$D" --depth 7 --batch-size 16 --out /root/runs/ds_b16
step vllm_b16 300 python3 -m draftsmith eval "${E[@]}" --engine vllm --drafter "$D" --depth 7 --batch-size 16 \
  --sweep 7:64 --out /root/runs/vllm_b16
capture_pair 1000
step cycle_profile 240 python3 bench/eval_bench.py --parts cycle --cycle-shapes chain,chain_walk,tree --profile "$R/profile" \
  --drafter "$D" --target "$HF" --plain-prompts 3 --plain-tokens 128 --out-json "$R/cycle.json"
touch "$R/ALL_DONE"

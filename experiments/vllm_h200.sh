#!/usr/bin/env bash
# Issue 52's lease on one H200: the recipe's drafter made, then measured inside vLLM (0.26.0,
# carried: experiments/h200_carry.sh). Each a step of experiments/steps.sh:
# In this order: data+train (and data2x_synth where the recipe's drafter came along), gpu_tests,
# synth_gpu_tests, synth_shrink, compile_scope, vllm_k753 (with ds_b1), ds_stop, ds_b16 (fused, with --kernel-check), vllm_b16, ds_b16_unfused, train_ab, ds_tree, synth_decode,
# magpie_256 and magpie_128, cycle_profile, larger_target, dflash_vllm, capture_pair (vLLM's figures
# before train_ab since 2026-12-06 16:10: the deadline cuts the last steps).
# The lease of 2026-12-06 23:26 (an H200, 856 device-seconds left after seven refused starts) synthesised
# 16 of the data curve's 2x point's 17 sets (data2x_synth; the step's limit cut magpie2_x13) and nothing
# else. The next lease carries those answers (.data/data2x_synth.tgz.part*: 3 parts, 15 + 15 + 9 MB; the
# 9 MB part beside .carry/part0, the two others in a call of their own) and runs with DATA2X=1
# (SKIP as below, without data2x_synth): data2x_synth resumes the last set (about 75 s), data2x_train
# (`pipeline experiments/recipes/data2x_h200.yaml --only prepare,vocab,train_online`, 7,800 steps: 11-15
# minutes by the host), pack_drafter (data2x_drafter), then data2x_chain and data2x_tree (MT-bench, K=7 and
# 60x7x10, each beside the recipe's drafter when its 7 parts came along too: 7 carrying calls in all, about
# 7 minutes). Val tau comes from train_online's metrics; the held-out split and HumanEval are measured on
# CPU for both drafters (fp32; the run's run.yaml comes back in res.tgz: experiments/cpu_quality.sh). The
# lease after it carries the recipe's drafter (.data/recipe_drafter.tgz.part*, 7 parts: as short_drafter's,
# below) and its answers (.data/full_synth.tgz.part*, 2 parts) to check and time
# what changed on CPU since 2026-12-06 18:59 (the greedy tree's acceptance as one graph, the target
# compiled layer by layer, synth's --compile-target), with
# SKIP="data2x_synth synth_gpu_tests synth_shrink synth_shrink_gsm8k vllm_k753 ds_stop ds_b16 vllm_b16
# ds_b16_unfused train_ab magpie_256 magpie_128 cycle_profile larger_make larger_vllm larger_ds dflash_vllm
# ds_qs600 extract_hf_qs600 extract_vllm_qs600 extract_compare_qs600" NQ=80 (the last four: capture_pair,
# which repeated to the digit), leaving gpu_tests (the graphed tree equal to plain decoding, the
# layer-compiled target equal to eager; 3.5 minutes, GPU_TESTS_K="tree" for the tree's alone),
# compile_scope (A-B-A: capture seconds and ms a token), ds_b1 and ds_tree (the tree's cycle against the
# chain's on one host: +1.13 ms at 18:59, goal +0.5) and synth_decode (its step compiled whole and layer by
# layer, whole passes with --compile-target), about 17 minutes. The
# quickstart's whole run, timed, is SHORT=0 (about 20 minutes alone on an H100, 2026-12-06 13:19;
# CC=0 without the recipe's --compile-capture).
#   data+train    none where recipe_drafter.tgz.part* came along (restore_drafter: the drafter a
#                 SHORT=0 lease trained); SHORT=0: quickstart's full budget (its stages through
#                 `pipeline`, train_online's --compile-capture as the recipe has it, off with CC=0), timed by stage, its answers
#                 and drafter packed for the next lease (pack_drafter: 7 parts of 10.25 MiB, and the
#                 answers in 15 MB parts; fetch_results.sh brings three a call); SHORT=1 (the lease of 2026-12-05 05:16, once quickstart's
#                 synthesis through vLLM proved too slow to leave time to train): the recipe's first
#                 two synth sets, prepare, vocab and a train_online of STEPS steps with
#                 --compile-capture (again without it if that fails)
#   gpu_tests     the eval engine's GPU tests (tests/gpu/test_eval_gpu.py: graphed and compiled forwards,
#                 graphed speculative decoding as plain) on a random target of the default's shape
#   vllm_k753     eval --engine vllm, K=7, 5 and 3 at batch 1 (and K=7 with every question at once),
#                 one plain pass (second: K=7's speed-up is known once two engines ran); no
#                 --vllm-profile (each engine's profile was taken on 2026-12-06 01:37, and with it
#                 the four engines ran past the step's 540 s); then ds_b1, draftsmith's engine at
#                 batch 1, K=7, beside it
#   dflash_vllm   a random DFlash drafter served by vLLM (steps.sh random_methods_vllm): it failed to
#                 start on 2026-12-05 22:56 and 2026-12-06 04:50 (the export shipped an identity d2t,
#                 which vLLM has no place for; fixed in 060ff5a)
#   cycle_profile a plain turn and the chain, adaptive-chain and tree cycles of that drafter, by part
#                 and kernel by kernel (bench/eval_bench.py --profile: a torch.profiler table and trace
#                 each): draftsmith's plain step was 2.04 ms on 2026-12-06 04:50, vLLM's 1.47; and
#                 plain decoding with the projections fused, A-B-A (--fuse-ab)
#   train_ab      train_online's rate on the run's prepared set, the capture eager / compiled / eager
#                 (with --compile-capture 12-13 steps/s once compiled, 2026-12-05 16:40 and 22:56;
#                 without it no rate but whole-run averages is on record)
#   ds_stop       the adaptive chain (K=7 stopping below 0.09) over the whole run: tau, drafts a
#                 cycle, speed-up against ds_b1's fixed K=7
#   vllm_b16, ds_b16  batch 16 in both engines on MT-bench's 80 questions (vLLM at K=7 and 3, and K=7
#                 with 64 and with all 80 at once); 30 questions at K=7 on 2026-12-05 22:56 (an H100)
#   synth_decode  synth's decode step at 1,024 rows, eager and with the forward compiled
#                 (bench/synth_bench.py --decode-compiled), each profiled
#   larger_target the plain step and cycle of each engine on SmolLM2-1.7B's shapes (random weights,
#                 steps.sh): what the 135M target's small step does to the speed-ups
#   *_qs600       where time is left: 600 samples
#                 captured by transformers and by vLLM's stock connector, timed and compared
#                 (steps.sh capture_pair; experiments/compare_stores.py)
# MAGPIE (12000), STEPS (1200) and NQ (80 questions a pass) size the run for a shorter lease. On an H200
# (2026-12-05 16:40) the local engine synthesised 6,000 Magpie answers in under a minute and
# train_online reached step 130 after about 160 s (compilation), then ran 12-13 steps/s (about
# 100k tok/s); the short step's limit follows STEPS.
# SHORT=1 synthesises with the local engine (faster than vLLM's, LOG 2026-12-05 05:16) and keeps
# its answers for the next lease (pack_answers: short_synth, one part of 3.5 MB).
# Send the first carrying call alone and wait for its answer: calls sent beside it are refused while
# no machine starts, at 15 device-seconds each (2026-12-05 20:05).
# After the five carrying calls (h200_carry.sh's header), in the last one:
#   bash /root/parts/unpack.sh /root/parts && (MAGPIE=6000 NQ=30 SHORT=1 LEASE_MIN=16 setsid bash experiments/vllm_h200.sh > /root/driver.log 2>&1 &)
# The short run's drafter comes back packed too (pack_drafter: bf16, without the target's
# embedding; on 2026-12-06 04:50, 82.3 MiB in 7 parts, six of 10.25 MiB; experiments/drafter_pack.py).
# Keep what comes back in .data/ (git-ignored) and carry it on the next lease to /root/parts, where
# the driver looks (steps.sh's CARRIED: not the working tree, whose next copy removes ignored paths
# that call does not carry). A call holds 64 MiB with the tree's 11.3: .carry/partN (41.9 MiB) and
# one 10.25 MiB part, or up to five parts alone. So: calls 0-3 each take one drafter part beside
# .carry/partN, e.g. carry [".carry/part1", ".data/short_drafter.tgz.partab"] with
# `cp .carry/part1 .data/short_drafter.tgz.part?? /root/parts/`; one more call takes the rest but
# the last small one; the last call takes .carry/part4, that small part and short_synth. The driver
# then restores the drafter (restore_drafter) and skips synthesis and training: about 6 minutes.
# (The recipe's drafter of a SHORT=0 lease travels the same way as recipe_drafter.)
# then poll back to back: bash experiments/fetch_results.sh 240 (a lease taken back mid-run keeps
# only what the last poll brought: 2026-12-05 13:54 lost all of its first 540 s). To stop a step by
# hand, kill by pid or by a pattern anchored at the start (pkill -f "^timeout 540"): an unanchored
# pattern also matches the polling call's own command line and kills it
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
  - train: {name: train_online, steps: ${STEPS:-1200}, intermediate_size: 4x, num_layers: 2, val_every: $(( ${STEPS:-1200} / 2 )), log_every: 100, save_every: $(( ${STEPS:-1200} / 2 )), compile_capture: true}
Y

start=$(date +%s)
D2X=experiments/recipes/data2x_h200.yaml
read -ra D2X_SYNTH <<< "$(python3 -c "import sys, yaml
names = [v.get('name', k) for s in yaml.safe_load(open(sys.argv[1]))['stages'] for k, v in s.items() if k == 'synth']
print(' '.join(names))" "$D2X")"
data2x_synth() {  # issue 53's data curve, point 2x: the 8 synth sets it adds to the recipe's 9 (full_synth, restored
  # into $Q, where they count as done), their answers packed with the 9 for the lease that trains on all 17.
  # About 8 minutes on an H100 by the recipe's set times; on the H200 of 2026-12-06 23:26 its sets took 62-104 s
  # each, and the 600 s limit then cut the last (magpie2_x13), which a later call resumes
  step data2x_synth 900 python3 -m draftsmith pipeline "$D2X" --out "$Q" --target smollm2-135m \
    --only "$(IFS=,; echo "${D2X_SYNTH[*]:9}")" && pack_answers data2x "$Q" "${D2X_SYNTH[@]}"
}
if [ "${DATA2X:-0}" = 1 ] || [ "${DATA2X:-0}" = all ]; then
  # the data curve's 2x point (issue 53): the recipe's stages on all 17 sets (7,800 steps). DATA2X=1: the
  # answers a lease's data2x_synth packed (2026-12-06 23:26: 16 of the 17 sets; the last resumed here, about
  # 75 s). DATA2X=all: one lease, the recipe's 9 sets carried (full_synth) and the 8 more synthesised here
  # (about 8 + 12 + 5 minutes on an H100). The answers are packed after synthesis and the drafter after
  # training, before eval, so that a lease cut short keeps them
  if [ "$DATA2X" = all ]; then restore_answers full; else restore_answers data2x; fi
  data2x_synth
  step data2x_train 1500 python3 -m draftsmith pipeline "$D2X" --out "$Q" --target smollm2-135m \
    --only prepare,vocab,train_online
  pack_drafter data2x_drafter "$D/drafter"
  # MT-bench's chain (K=7) and tree (60x7x10) beside the recipe's drafter where it came along
  # (recipe_drafter's parts): both drafters against one plain pass each, in one process on one host
  CMP=()
  restore_drafter recipe_drafter /root/runs/recipe/drafter && CMP=(--compare /root/runs/recipe/drafter)
  step data2x_chain 420 python3 -m draftsmith eval "${E[@]}" --drafter "$D" ${CMP[@]+"${CMP[@]}"} --depth 7 --out /root/runs/data2x_chain
  step data2x_tree 420 python3 -m draftsmith eval "${E[@]/chain/tree}" --drafter "$D" ${CMP[@]+"${CMP[@]}"} --depth 7 \
    --out /root/runs/data2x_tree
elif restore_drafter recipe_drafter "$D/drafter"; then  # the recipe's drafter a lease before trained (SHORT=0) and packed: no training
  restore_answers full  # its conversations, for capture_pair
  data2x_synth  # first: the next lease trains on them (it was last, and cut first, until 2026-12-06 22:40)
elif [ "${SHORT:-1}" = 1 ] && restore_drafter short_drafter "$D/drafter"; then  # a lease before trained it: no training
  restore_answers short  # its conversations, for capture_pair
elif [ "${SHORT:-1}" = 1 ]; then
  [ -f "$Q/.pipeline/synth.done" ] || restore_answers short
  # the lease of 2026-12-05 10:4x: training with --compile-capture (a whole run of it, issue 52),
  # and without it if the compiled capture fails
  step short $(( 420 + ${STEPS:-1200} / 5 )) python3 -m draftsmith pipeline /root/short.yaml --out "$Q" --target smollm2-135m ||
    { sed -i 's/, compile_capture: true//' /root/short.yaml &&
      step short_eager $(( 420 + ${STEPS:-1200} / 5 )) python3 -m draftsmith pipeline /root/short.yaml --out "$Q" --target smollm2-135m; }
  pack_answers short "$Q" synth magpie
  pack_drafter short_drafter "$D/drafter"  # 4 parts: the next lease carries them and skips the training
else
  # quickstart's full budget (README command 1's stages, read from the packaged recipe as quickstart
  # reads them; the recipe compiles train_online's capture, CC=0 turns that off); its answers and drafter packed for the
  # next lease, which then measures that drafter in vLLM without training (restore_dir above)
  python3 - "${CC:-1}" > /root/full.yaml <<'PY'
import sys
import yaml
from draftsmith.pipeline.quickstart import budget_stages
stages = [
    {command: {"name": name, **options, **({"compile_capture": False} if name == "train_online" and sys.argv[1] == "0" else {})}}
    for name, command, options in budget_stages("full")
]
print(yaml.safe_dump({"stages": stages}, sort_keys=False))
PY
  synths=$(python3 -c "from draftsmith.pipeline.quickstart import budget_stages as b; print(' '.join(n for n, c, _ in b('full') if c == 'synth'))")
  [ -f "$Q/.pipeline/synth.done" ] || restore_answers full
  step full 1500 python3 -m draftsmith pipeline /root/full.yaml --out "$Q" --target smollm2-135m
  pack_answers full "$Q" $synths
  pack_drafter recipe_drafter "$D/drafter"  # 7 parts of 10.25 MiB, carried as short_drafter is
fi
echo "data and training: $(( $(date +%s) - start )) s" >> "$R/steps.log"
# the eval engine's GPU tests first (graphed and compiled forwards as eager, graphed speculative decoding as
# plain), on a random target of the default's shape in fp32 (3.5 minutes on 2026-12-06 10:30; GPU_TESTS_K narrows them): the KV write became an in-place index_put
# after their last run (2026-12-06 08:31, H100: 7 passed)
[[ " ${SKIP:-} " == *" gpu_tests "* ]] || python3 experiments/random_target.py /root/rand135m >> "$R/steps.log" 2>&1
DRAFTSMITH_TEST_TARGET=/root/rand135m step gpu_tests 300 python3 -m pytest tests/gpu/test_eval_gpu.py --run-gpu -q \
  -p no:cacheprovider -k "${GPU_TESTS_K:-graphed_forward_equals_eager or graphed_spec_equals_plain or graphed_batch_equals or compiled_target}"
# synth's graphed generator on the embedded default in fp32, its batches shrinking to their running rows
# with graphs captured mid-generation (since 2026-12-06 13:19) and not
step synth_gpu_tests 240 python3 -m pytest tests/gpu/test_synth_gpu.py --run-gpu -q -p no:cacheprovider
# synth's batches shrinking to their running rows against keeping every row, A-B-A, now that a smaller
# graph is captured only when a batch first shrinks to it (2026-12-06 13:42, every size captured up
# front: GSM8K 0.90x, Magpie 1.05x; CPU 1.29x): whether shrinking stays
# (each pass's graph_capture_s counter: what the captures cost)
step synth_shrink 150 python3 bench/synth_bench.py --target "$HF" --magpie 2048 --batch-size 1024 --shrink-ab \
  --baseline-prompts 1 --out-json "$R/synth_shrink.json"
step synth_shrink_gsm8k 120 python3 bench/synth_bench.py --target "$HF" --num-prompts 2048 --batch-size 1024 --shrink-ab \
  --baseline-prompts 1 --out-json "$R/synth_shrink_gsm8k.json"
# the target compiled whole against layer by layer (TargetEngine compile_scope "layers", since 2026-12-06
# 19:50: one decoder layer's step compiled for all 30), A-B-A: each engine's capture seconds (its compile
# inside) and ms a token, plain decoding at batch 1 as eval runs it; eval's capture took 48-106 s with
# the whole forward compiled (2026-12-06 18:59)
step compile_scope 300 python3 bench/eval_bench.py --parts cycle --cycle-shapes chain --compile-scope-ab --drafter "$D" \
  --target "$HF" --plain-prompts 3 --plain-tokens 128 --out-json "$R/compile_scope.json"
# the owed figures first (with the recipe's drafter where a SHORT=0 lease packed it: NQ=80): vLLM at batch 1
# and K = 7, 5, 3, beside draftsmith's batch 1
step vllm_k753 540 python3 -m draftsmith eval "${E[@]}" --engine vllm --drafter "$D" --depth 7 --batch-size 1 \
  --sweep 5:1,3:1 --out /root/runs/vllm_k753
step ds_b1 330 python3 -m draftsmith eval "${E[@]}" --drafter "$D" --depth 7 --batch-size 1 --out /root/runs/ds_b1
# the adaptive chain over the whole run beside ds_b1's K=7, at about the threshold --stop-below auto
# computed on 2026-12-05 16:40 (0.0902; that calibration chose the fixed K=4 over it)
step ds_stop 330 python3 -m draftsmith eval "${E[@]}" --drafter "$D" --depth 7 --stop-below 0.09 --batch-size 1 \
  --out /root/runs/ds_stop
# batch 16 in both engines on MT-bench's 80 questions (vLLM also at K=3, and 64 and 80 at once): the
# owed figures of issue 52 (batch 16 was measured on 2026-12-05 22:56 on 30 questions, at K=7 alone)
E80=(--target "$HF" --mode chain --num-questions 80 --max-new-tokens 256 --drafter "$D" --depth 7 --batch-size 16)
step ds_b16 200 python3 -m draftsmith eval "${E80[@]}" --kernel-check --out /root/runs/ds_b16
step vllm_b16 300 python3 -m draftsmith eval "${E80[@]}" --engine vllm --sweep 3:16,7:64 --out /root/runs/vllm_b16
# the same unfused: how many greedy turns the fused products' rounding changes (40 of 160 equal to
# plain fused, 160 unfused, on 2026-12-06 10:30 and 07:55), and each engine's rate in one lease
step ds_b16_unfused 200 python3 -m draftsmith eval "${E80[@]}" --no-fuse-target --kernel-check --out /root/runs/ds_b16_unfused
# train_online's rate with the capture eager / compiled / eager (A-B-A), and each variant's warm-up, where the
# compile goes: the capture compiles one decoder layer for all since 2026-12-06 14:30 (the whole forward's
# compile made the recipe's first 100 steps 135 s on 2026-12-06 13:19); on the run's whole prepared set,
# prepared here from the carried answers where the drafter was carried (its prepare stage alone, about 10 s)
[ -d "$Q/prepare" ] || [ ! -f "$Q/.pipeline/magpie.done" ] ||
  step prepare_qs 120 python3 -m draftsmith pipeline /root/short.yaml --out "$Q" --target smollm2-135m --only prepare
[ -d "$Q/prepare" ] && train_ab "$Q/prepare"
# the recipe's drafter as a tree (60 tokens, 7 levels, top 10) at batch 1 beside ds_b1's chain: its tau against
# issue 53's goal (6.1) and its cycle against the chain's (+1.22 ms on 2026-12-05 10:39)
step ds_tree 300 python3 -m draftsmith eval "${E[@]/chain/tree}" --drafter "$D" --depth 7 --batch-size 1 --out /root/runs/ds_tree
# synth's decode step of 1,024 rows eager, compiled whole and compiled layer by layer (each graph's capture
# seconds with its compile), then whole synth passes of 4,096 GSM8K prompts (4 batches, each its own cache
# width) eager / --compile-target (layer by layer, its compiles in the pass's time) / eager: whether synth
# compiles by default (its step 13.4 ms compiled whole against 16.3 eager on 2026-12-06 18:59; SDPA's math
# path 0.30x and the fused projections 1.00x of a whole pass were measured then)
step synth_decode 420 python3 bench/synth_bench.py --target "$HF" --num-prompts 4096 --batch-size 1024 --baseline-prompts 1 \
  --profile "$R/synth_prof" --decode-compiled --compile-ab --out-json "$R/synth_decode.json"
# Magpie's user turns under their own cap (synth --magpie-max-tokens): 6,000 self-prompts as the recipe
# makes them, uncapped and capped at 128, each timed by its progress.json, with its kept/dropped counts
for cap in 256 128; do
  step magpie_$cap 180 python3 -m draftsmith synth --target "$HF" --magpie 6000 --max-new-tokens 256 --batch-size 1024 \
    --keep-unfinished --seed 11 --magpie-max-tokens $cap --out /root/runs/magpie_$cap/conversations.jsonl
done
# a plain token's kernels against vLLM's (0.97 ms of a 1.47 ms step on 2026-12-06), and the tree cycle
# by part and kernel, which the CPU work on issue 53 waits for; then plain decoding with the target's
# projections fused (q/k/v, gate/up: vLLM's 4 GEMMs a layer against the engine's 7) A-B-A, as eval
# runs it (compiled), each plain turn profiled
step cycle_profile 300 python3 bench/eval_bench.py --parts cycle --cycle-shapes chain,chain_walk,chain_walk_sync,tree --profile "$R/profile" \
  --fuse-ab --drafter "$D" --target "$HF" --plain-prompts 3 --plain-tokens 128 --out-json "$R/cycle.json"
# what a larger target changes: each engine's plain step and cycle on SmolLM2-1.7B's shapes
larger_target
# a random DFlash drafter in vLLM 0.26: its whole-vocabulary export ships no d2t since 060ff5a
random_methods_vllm dflash
CONV=$Q/synth/conversations.jsonl
[ -f "$CONV" ] || CONV=src/draftsmith/assets/gsm8k_train.jsonl
capture_pair qs "$CONV" 600
touch "$R/ALL_DONE"

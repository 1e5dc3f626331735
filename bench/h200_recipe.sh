#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on one or two GPUs (nvidia-h200 or nvidia-h200-x2). The run
# of 2026-12-02 07:25 trained the 4x-wide MLP to the full budget (val τ 4.566 against 4.501; the
# recipe now trains it); the run of 2026-12-02 09:55 (the sixth ablation) found no gain in smaller
# rows, an 8x MLP or a sharper teacher. Four leases of 2026-12-02 18:25 to 2026-12-03 03:21 trained
# abl7_layers2 to step 1,950 at best (its validations 4.043 and 4.399 against abl3_wide's 3.963 and
# 4.293; BENCHMARKS.md): each lost its machine, or its device time, first. Alone on the GPU it
# runs ~8.9 steps/s once compiled, and its first validation costs ~110 s once: the full budget
# takes ~11 minutes. The next lease, for issue 13 (val τ 4.8), the seventh ablation
# (recipes/ablation7_h200.yaml): the drafter's depth, on the recipe's data:
#   1. the recipe's data (restored from .data when a lease before packed it, else made: ~5.8
#      GPU-minutes)
#   2. abl7_layers2 alone (the recipe's drafter with two decoder layers), until $EVAL_S before the
#      deadline at the latest: the full budget, against abl3_wide's 4.566
#   3. side by side: the MT-bench chain τ (K=7, 80 q, τ only, eager target) of its best drafter,
#      the GPU tests of --num-layers (gpu_tests), and abl7_layers3 (three layers) until $EVAL_S
#      before the deadline: its first validations
#   4. in the minutes before the hard deadline, the GPU alone: the chain cycle of random drafters of
#      one, two and three layers (4x MLP) and of the target's MLP width (bench/eval_bench.py
#      --drafter-widths), what depth costs per draft
#   two GPUs: GPU 0 runs 1 and abl7_layers2, its chain τ and the GPU tests; GPU 1 runs
#             abl7_layers3 once the data is made, its chain τ, then 4
#   setsid bash bench/h200_recipe.sh &     # then, call after call: bash bench/fetch_results.sh 530
# A lease too short for the plan runs some of its steps alone: ONLY_STEPS="gpu_tests cycle_widths"
# (the functions below, in that order; each still skipped once done or past the deadline).
# The recipe's synth answers (5 of its ~5.5 data minutes) travel between leases: the driver packs
# them into /root/carry/h200_synth.tgz.part* (15 MB parts), fetch_results.sh brings those back;
# keep them in .data/ (git-ignored: .git/info/exclude; a new session's checkout lacks it) and carry
# .data next time, copied into the driver's folder, and the data step restores them instead of
# synthesising again. Carry fits 64 MiB per call, so the lease takes three calls within 30 s of
# each other: (1) .whl and the GGUF's part00, installing the wheels and copying part00 to
# /root/parts; (2) part01, copied there too; (3) part02, the .sha256, join.sh and .data, then:
#   .devmodel/join.sh /root/parts .devmodel /root/m && rm -rf /root/ds && mkdir -p /root/ds &&
#   cp -r bench recipes src tests pyproject.toml /root/ds/ && { [ ! -d .data ] || cp -r .data /root/ds/; } &&
#   cd /root/ds && export PYTHONPATH=/tmp/site:/root/ds/src:/root/ds && (setsid bash bench/h200_recipe.sh > /root/driver.log 2>&1 &)
# Needs the embedded default's GGUF at $GGUF and the wheels the image lacks importable
# (bench/h200_wheels.sh fetches them into .whl); reruns skip finished steps; no step starts
# after $DEADLINE and none runs past $HARD_DEADLINE (epoch seconds; default: 25 and 2 minutes
# after the start), so the lease's end cuts nothing unseen. Start it within a minute of the
# lease and poll back to back.
set -uo pipefail
. "$(dirname "$0")/steps.sh"
Y=recipes/h200.yaml
CARRY=${CARRY:-/root/carry}  # what the next lease should get back (fetch_results.sh)
A7=recipes/ablation7_h200.yaml  # its out is $RUN, the recipe's
driver_start 25 2

wait_for_data() {  # until run folder $1 has its draft vocab (its data stages done), or the deadline
  while [ ! -f "$1/.pipeline/vocab.done" ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
}
restore_answers() {  # restore_answers NAME: the synth answers a lease before packed into .data/NAME_synth.tgz.part*
  ls .data/"$1"_synth.tgz.part* > /dev/null 2>&1 || return 0
  cat .data/"$1"_synth.tgz.part* | tar -C / -xzf - && echo "=== $1 synth answers: restored from .data" >> "$R/steps.log"
}
pack_answers() {  # pack_answers NAME DIR STAGE...: DIR's synth answers and those stages' markers, for the next lease
  local name=$1 dir=${2#/} stage files; shift 2
  [ -f "$CARRY/${name}_synth.tgz.partaa" ] && return 0  # packed already (fetch_results.sh brings each part back once)
  ls .data/"${name}"_synth.tgz.part* > /dev/null 2>&1 && return 0  # carried here: the next lease has them already
  files=("$dir/synth/conversations.jsonl" "$dir/synth/conversations.run.yaml")
  for stage in "$@"; do files+=("$dir/.pipeline/$stage.started" "$dir/.pipeline/$stage.done"); done
  mkdir -p "$CARRY" && tar -C / -czf - "${files[@]}" | split -b 15m - "$CARRY/${name}_synth.tgz.part"
}
cycle_widths() {  # issue 13: the chain cycle of a random drafter at the target's MLP width, and at 4x with 1, 2 and 3 layers, in one process (~3 min)
  step cycle_widths 240 python3 bench/eval_bench.py --parts cycle --cycle-shapes chain --drafter-widths 1536,6144,6144:2,6144:3 \
    --plain-prompts 3 --plain-tokens 128 --target $HF --out-json "$R/cycle_widths.json"
}
gpu_tests() {  # --num-layers on the GPU: the compiled static training step, and the compiled, CUDA-graphed draft (chain and tree) against plain decoding, with one and two layers
  DRAFTSMITH_TEST_TARGET=$HF step gpu_tests 600 python3 -m pytest -q -p no:cacheprovider --run-gpu \
    tests/gpu/test_train_gpu.py::test_compiled_static_step_matches_the_compacted_step tests/gpu/test_eval_gpu.py::test_graphed_spec_equals_plain
}
data() {  # the recipe's data stages: those quickstart --budget full runs before training
  local stages synths
  {  # line 1: the data stages, comma-separated; line 2: the synth ones among them
    read -r stages; read -r synths
  } < <(python3 -c "from draftsmith.pipeline.quickstart import DATA_COMMANDS, budget_stages as b
data = [s for s in b('full') if s[1] in DATA_COMMANDS]
print(','.join(s[0] for s in data)); print(' '.join(s[0] for s in data if s[1] == 'synth'))")
  # a lease before made these answers (synth is deterministic: the same recipe gives the same file,
  # BENCHMARKS 2026-12-01 18:28); pipeline then skips the synth stages as done earlier
  [ -f "$RUN/.pipeline/synth.done" ] || restore_answers h200
  step data 600 python3 -m draftsmith pipeline $Y --only "$stages" || return
  pack_answers h200 "$RUN" $synths
}
train_to_deadline() {  # training stage $2 of recipe $1, stopped $EVAL_S before the deadline at the latest
  wait_for_data "$RUN"
  local left=$(( DEADLINE - EVAL_S - $(date +%s) ))
  [ "$left" -ge 60 ] || { echo "=== $2 skipped: less than a minute before the deadline" >> "$R/steps.log"; return 1; }
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step "$2" "$left" python3 -m draftsmith pipeline "$1" --only "$2"
}
chain_tau() {  # MT-bench chain τ of training stage $2 (of recipe $1) at temperature $3 (default 0: greedy): its best drafter so far; τ only, the target eager
  local run=$RUN/$2 temp=${3:-0} tag=""
  [ "$temp" = 0 ] || tag=_t$temp
  [ -d "$run/drafter" ] && step "$2_chain$tag" 270 python3 -m draftsmith eval --target $HF --drafter "$run" \
    --mode chain --k 7 --temperature "$temp" --num-questions 80 --max-new-tokens 256 --no-speed --no-compile-target --out "${run}_mtbench$tag"
}
EVAL_S=${EVAL_S:-180}  # the chain τ after the last training (one per GPU, ~2 minutes) and a margin
if [ -n "${ONLY_STEPS:-}" ]; then  # a short lease: only these steps, in order (ONLY_STEPS="gpu_tests cycle_widths")
  for s in $ONLY_STEPS; do  # every name checked before any step runs
    declare -F "$s" > /dev/null || { echo "=== ONLY_STEPS: no step $s (it names functions of bench/h200_recipe.sh)" | tee -a "$R/steps.log" >&2; exit 2; }
  done
  for s in $ONLY_STEPS; do "$s"; done
elif [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=0; data; train_to_deadline $A7 abl7_layers2; chain_tau $A7 abl7_layers2; gpu_tests) & A=$!
  (export CUDA_VISIBLE_DEVICES=1; train_to_deadline $A7 abl7_layers3; chain_tau $A7 abl7_layers3; cycle_widths) & B=$!
  wait $A $B
else
  data
  train_to_deadline $A7 abl7_layers2
  chain_tau $A7 abl7_layers2 & gpu_tests & train_to_deadline $A7 abl7_layers3; wait
  cycle_widths  # before the deadline, so it starts; the hard deadline cuts it at the latest
fi
[ -d "$RUN" ] && python3 bench/summarise_ablation.py "$RUN" --out "$R/ablation_h200.md" >> "$R/summary.log" 2>&1
touch "$R/ALL_DONE"

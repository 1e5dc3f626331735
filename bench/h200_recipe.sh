#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on one or two GPUs (nvidia-h200 or nvidia-h200-x2). The run
# of 2026-12-02 07:25 trained the 4x-wide MLP to the full budget (val τ 4.566 against 4.501; the
# recipe now trains it); the run of 2026-12-02 09:55 (the sixth ablation) found no gain in smaller
# rows, an 8x MLP or a sharper teacher. The lease of 2026-12-03 06:28 trained abl7_layers2 (two
# decoder layers) to the full budget: val τ 4.726 against 4.566, MT-bench chain τ 3.92 against 3.75,
# and measured the chain cycle per depth and the GPU tests of --num-layers (BENCHMARKS.md); its
# train τ ends 0.45 above its val τ. The next lease, for issue 13 (val τ 4.8): two decoder layers on
# four times the distinct data (recipes/ablation5_h200.yaml, abl5_data4_layers2):
#   1. the recipe's data (restored from .data when a lease before packed it, else made: ~5.8
#      GPU-minutes), then the fifth ablation's (data4: four more Magpie sets, ~75 s each; the
#      lease of 2026-12-03 06:58 made two and packed them, so with .data it makes the two
#      two-turn sets; its answers are packed for the lease after)
#   2. abl5_data4_layers2 alone until $EVAL_S before the deadline at the latest: the full budget
#      (~11.6 minutes), step for step against abl5_data4_wide (one layer, its validations at 8.0,
#      15.9 and 23.9M tokens of 2026-12-02 07:25)
#   3. its MT-bench chain τ (K=7, 80 q, τ only, eager target), beside the GPU test of validation
#      replaying the compiled training graph (val_gpu_test; since 184f680 the first validation
#      should take seconds, not the ~110 s it took before: abl5_data4_layers2.log times it)
#   4. its MT-bench tree τ (K=7, top-k 10, 60 tokens: the recipe's tree), in the minutes left
#   two GPUs: GPU 0 runs 1 to 3; GPU 1 trains abl5_data4_wide to the full budget once data4 is
#             made (the same split's one-layer figure at 31.8M tokens), then its chain τ
#   setsid bash bench/h200_recipe.sh &     # then, call after call: bash bench/fetch_results.sh 530
# A lease too short for the plan runs some of its steps alone, e.g. ONLY_STEPS="gpu_tests cycle_widths"
# (the functions below, in that order; each still skipped once done or past the deadline); the
# seventh ablation's runs: ONLY_STEPS=abl7 (its plan of 2026-12-03 06:28).
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
A5=recipes/ablation5_h200.yaml
RUN4=${RUN4:-/root/runs/h200x4}  # recipes/ablation5_h200.yaml's out
out_of() { if [ "$1" = "$A5" ]; then echo "$RUN4"; else echo "$RUN"; fi; }  # a recipe's run folder
driver_start 25 2

wait_for_data() {  # until run folder $1 has its draft vocab (its data stages done), or the deadline
  while [ ! -f "$1/.pipeline/vocab.done" ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
}
restore_answers() {  # restore_answers NAME: the synth answers a lease before packed into .data/NAME_synth.tgz.part*
  ls .data/"$1"_synth.tgz.part* > /dev/null 2>&1 || return 0
  cat .data/"$1"_synth.tgz.part* | tar -C / -xzf - && echo "=== $1 synth answers: restored from .data" >> "$R/steps.log"
}
pack_answers() {  # pack_answers NAME DIR STAGE...: DIR's synth answers and the markers those stages have, for the next lease
  local name=$1 dir=${2#/} stage m marks=() have fresh
  shift 2
  [ -f "$CARRY/${name}_synth.tgz.partaa" ] && return 0  # packed already (fetch_results.sh brings each part back once)
  for stage in "$@"; do  # a stage cut short travels with its .started marker only: synth resumes it by its answers' ids
    for m in started done; do [ -f "/$dir/.pipeline/$stage.$m" ] && marks+=("$dir/.pipeline/$stage.$m"); done
  done
  [ ${#marks[@]} -gt 0 ] || return 0  # none of them ran here
  if ls .data/"$name"_synth.tgz.part* > /dev/null 2>&1; then  # carried here: packed again only if a stage they lack is done now
    have=$(cat .data/"$name"_synth.tgz.part* | tar -tzf -) fresh=0
    for m in "${marks[@]}"; do [[ $m == *.done ]] && ! grep -qxF "$m" <<< "$have" && fresh=1; done
    [ "$fresh" = 1 ] || return 0
  fi
  mkdir -p "$CARRY" && tar -C / -czf - "$dir/synth/conversations.jsonl" "$dir/synth/conversations.run.yaml" "${marks[@]}" \
    | split -b 15m - "$CARRY/${name}_synth.tgz.part"
}
cycle_widths() {  # issue 13: the chain cycle of a random drafter at the target's MLP width, and at 4x with 1, 2 and 3 layers, in one process (~3 min)
  step cycle_widths 240 python3 bench/eval_bench.py --parts cycle --cycle-shapes chain --drafter-widths 1536,6144,6144:2,6144:3 \
    --plain-prompts 3 --plain-tokens 128 --target $HF --out-json "$R/cycle_widths.json"
}
gpu_tests() {  # --num-layers on the GPU: the compiled static training step, and the compiled, CUDA-graphed draft (chain and tree) against plain decoding, with one and two layers
  DRAFTSMITH_TEST_TARGET=$HF step gpu_tests 600 python3 -m pytest -q -p no:cacheprovider --run-gpu \
    tests/gpu/test_train_gpu.py::test_compiled_static_step_matches_the_compacted_step tests/gpu/test_eval_gpu.py::test_graphed_spec_equals_plain
}
val_gpu_test() {  # the compiled static step at 8k-token rows: one graph for training rows and a validation row (eval mode, gradients on), on CUDA
  DRAFTSMITH_TEST_TARGET=$HF step val_gpu_test 300 python3 -m pytest -q -p no:cacheprovider --run-gpu \
    tests/gpu/test_train_gpu.py::test_compiled_static_step_8k_memory_and_no_recompile
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
data4() {  # the fifth ablation's data in $RUN4: the recipe's synth answers and markers, then four more Magpie sets
  local name m new=magpie_c,magpie_d,magpie2_c,magpie2_d
  [ -f "$RUN/.pipeline/vocab.done" ] || return 1
  if [ ! -d "$RUN4/synth" ]; then  # the recipe's five synth stages, done: their markers name $RUN4's file
    mkdir -p "$RUN4/.pipeline" && cp -r "$RUN/synth" "$RUN4/" || return 1
    for name in synth magpie magpie_b magpie2 magpie2_b; do
      for m in started done; do sed "s#$RUN/#$RUN4/#g" "$RUN/.pipeline/$name.$m" > "$RUN4/.pipeline/$name.$m"; done
    done
    restore_answers h200x4  # a lease before made the four added sets: the whole answer file and their markers
  fi
  step data4 900 python3 -m draftsmith pipeline $A5 --only "$new,prepare,vocab"; local rc=$?
  pack_answers h200x4 "$RUN4" ${new//,/ }  # cut short too: the next lease synthesises only what is missing
  return $rc
}
train_to_deadline() {  # training stage $2 of recipe $1, stopped $EVAL_S before the deadline at the latest
  wait_for_data "$(out_of "$1")"
  local left=$(( DEADLINE - EVAL_S - $(date +%s) ))
  [ "$left" -ge 60 ] || { echo "=== $2 skipped: less than a minute before the deadline" >> "$R/steps.log"; return 1; }
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step "$2" "$left" python3 -m draftsmith pipeline "$1" --only "$2"
}
mtbench_tau() {  # MT-bench τ of training stage $2 (of recipe $1), greedy, drafting a $3 (chain, the default: K=7; tree: K=7, top-k 10, 60 tokens, as the recipe's eval_tree): its best drafter so far; τ only, the target eager
  local run mode=${3:-chain} shape=() tag=""
  run=$(out_of "$1")/$2
  [ "$mode" = tree ] && shape=(--top-k 10 --total-tokens 60) tag=_tree
  [ -d "$run/drafter" ] && step "$2_$mode" 270 python3 -m draftsmith eval --target $HF --drafter "$run" \
    --mode "$mode" --k 7 "${shape[@]}" --num-questions 80 --max-new-tokens 256 --no-speed --no-compile-target --out "${run}_mtbench$tag"
}
abl7() {  # the seventh ablation's plan on one GPU (the lease of 2026-12-03 06:28): two decoder layers at the full budget, then its chain τ beside the GPU tests and abl7_layers3, then the chain cycle per depth
  data
  train_to_deadline $A7 abl7_layers2
  mtbench_tau $A7 abl7_layers2 & gpu_tests & train_to_deadline $A7 abl7_layers3; wait
  cycle_widths  # before the deadline, so it starts; the hard deadline cuts it at the latest
}
EVAL_S=${EVAL_S:-180}  # the chain τ after the last training (one per GPU, ~2 minutes) and a margin
if [ -n "${ONLY_STEPS:-}" ]; then  # a short lease: only these steps, in order (ONLY_STEPS="gpu_tests cycle_widths")
  for s in $ONLY_STEPS; do  # every name checked before any step runs
    declare -F "$s" > /dev/null || { echo "=== ONLY_STEPS: no step $s (it names functions of bench/h200_recipe.sh)" | tee -a "$R/steps.log" >&2; exit 2; }
  done
  for s in $ONLY_STEPS; do "$s"; done
elif [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=0; data; data4 && train_to_deadline $A5 abl5_data4_layers2; mtbench_tau $A5 abl5_data4_layers2 & val_gpu_test; wait
   mtbench_tau $A5 abl5_data4_layers2 tree) & A=$!
  (export CUDA_VISIBLE_DEVICES=1; train_to_deadline $A5 abl5_data4_wide; mtbench_tau $A5 abl5_data4_wide) & B=$!
  wait $A $B
else
  data
  data4 && train_to_deadline $A5 abl5_data4_layers2
  mtbench_tau $A5 abl5_data4_layers2 & val_gpu_test; wait
  mtbench_tau $A5 abl5_data4_layers2 tree  # before the deadline, so it starts; the hard deadline cuts it at the latest
fi
for run in $RUN $RUN4; do  # the ablation tables
  [ -d "$run" ] && python3 bench/summarise_ablation.py "$run" --out "$R/ablation_$(basename "$run").md" >> "$R/summary.log" 2>&1
done
touch "$R/ALL_DONE"

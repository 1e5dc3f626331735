#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on one or two GPUs (nvidia-h200 or nvidia-h200-x2). The run
# of 2026-12-02 07:25 trained the 4x-wide MLP to the full budget (val τ 4.566 against 4.501; the
# recipe now trains it) and, on four times the distinct data, found train and val τ within 0.04:
# fit, not data, now limits. This lease, for issue 13 (val τ 4.8):
#   1. the recipe's data and the fifth ablation's (recipes/ablation5_h200.yaml, in $RUN4), both
#      restored from .data (see below; made again if .data lacks them, ~7 GPU-minutes)
#   2. on the 4x data at the full budget (3,900 steps x 8,192 tokens), side by side, each until
#      $EVAL_S before the deadline at the latest: abl5_data4_wide (4x MLP), abl5_data4_wide8 (8x)
#      and abl5_data4_wide_t05 (4x MLP, --teacher-temperature 0.5)
#   3. the MT-bench chain τ (K=7, 80 q, τ only, eager target) of each run's best drafter, greedy,
#      and at temperature 1 for abl5_data4_wide and abl5_data4_wide_t05, all side by side
#   4. in the minutes between the chain τ and the hard deadline, the GPU alone: the chain cycle of
#      random drafters at the target's MLP width, 4x and 8x (bench/eval_bench.py --drafter-widths),
#      what the wider drafters cost per cycle
#   two GPUs: GPU 0 runs 1, abl5_data4_wide and abl5_data4_wide_t05 and their chain τ; GPU 1 runs
#             abl5_data4_wide8 beside abl5_data4 (the narrow run at the full budget), their
#             chain τ, then 4
#   setsid bash bench/h200_recipe.sh &     # then, call after call: bash bench/fetch_results.sh 530
# The recipe's synth answers (5 of its ~5.4 data minutes) travel between leases: the driver packs
# them into /root/carry/h200_synth.tgz.part* (15 MB parts; the fifth ablation's added answers into
# h200x4_synth.tgz.part*), fetch_results.sh brings those back;
# keep them in .data/ (git-ignored) and carry .data next time, copied into the driver's folder, and
# the data step restores them instead of synthesising again. Carry fits 64 MiB per call, so the
# lease takes three calls within 30 s of each other: (1) .whl and the GGUF's part00, installing
# the wheels and copying part00 to /root/parts; (2) part01, copied there too; (3) part02, the
# .sha256, join.sh and .data, then:
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
pack_answers() {  # pack_answers NAME DIR STAGE...: DIR's synth answers and those stages' markers, for the next lease
  local name=$1 dir=${2#/} stage files; shift 2
  [ -f "$CARRY/${name}_synth.tgz.partaa" ] && return 0  # packed already (fetch_results.sh brings each part back once)
  ls .data/"${name}"_synth.tgz.part* > /dev/null 2>&1 && return 0  # carried here: the next lease has them already
  files=("$dir/synth/conversations.jsonl" "$dir/synth/conversations.run.yaml")
  for stage in "$@"; do files+=("$dir/.pipeline/$stage.started" "$dir/.pipeline/$stage.done"); done
  mkdir -p "$CARRY" && tar -C / -czf - "${files[@]}" | split -b 15m - "$CARRY/${name}_synth.tgz.part"
}
cycle_widths() {  # issue 13: the chain cycle of a random drafter at the target's MLP width, 4x and 8x, in one process (~3 min)
  step cycle_widths 240 python3 bench/eval_bench.py --parts cycle --cycle-shapes chain --drafter-widths 1536,6144,12288 \
    --plain-prompts 3 --plain-tokens 128 --target $HF --out-json "$R/cycle_widths.json"
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
  step data4 900 python3 -m draftsmith pipeline $A5 --only "$new,prepare,vocab" || return
  pack_answers h200x4 "$RUN4" ${new//,/ }
  return 0  # the data is made; packing it for the next lease is not this lease's business
}
train_to_deadline() {  # training stage $2 of recipe $1, stopped $EVAL_S before the deadline at the latest
  wait_for_data "$(out_of "$1")"
  local left=$(( DEADLINE - EVAL_S - $(date +%s) ))
  [ "$left" -ge 60 ] || { echo "=== $2 skipped: less than a minute before the deadline" >> "$R/steps.log"; return 1; }
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step "$2" "$left" python3 -m draftsmith pipeline "$1" --only "$2"
}
chain_tau() {  # MT-bench chain τ of training stage $2 (of recipe $1) at temperature $3 (default 0: greedy): its best drafter so far; τ only, the target eager
  local run temp=${3:-0} tag=""; run=$(out_of "$1")/$2
  [ "$temp" = 0 ] || tag=_t$temp
  [ -d "$run/drafter" ] && step "$2_chain$tag" 270 python3 -m draftsmith eval --target $HF --drafter "$run" \
    --mode chain --k 7 --temperature "$temp" --num-questions 80 --max-new-tokens 256 --no-speed --no-compile-target --out "${run}_mtbench$tag"
}
chain_tau_t1() { chain_tau "$1" "$2" 1.0; }  # for each()
each() {  # each() FUNCTION recipe:stage...: FUNCTION recipe stage for all of them side by side on this lane's GPU
  local fn=$1 run pids=(); shift
  for run in "$@"; do "$fn" "${run%%:*}" "${run#*:}" & pids+=($!); done
  wait "${pids[@]}"
}
EVAL_S=${EVAL_S:-300}  # the chain τ runs after the training (five side by side, ~3.5 minutes) and a margin
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=0; data; data4 && each train_to_deadline $A5:abl5_data4_wide $A5:abl5_data4_wide_t05
   each chain_tau $A5:abl5_data4_wide $A5:abl5_data4_wide_t05 & each chain_tau_t1 $A5:abl5_data4_wide $A5:abl5_data4_wide_t05
   wait) & A=$!
  (export CUDA_VISIBLE_DEVICES=1; each train_to_deadline $A5:abl5_data4_wide8 $A5:abl5_data4
   each chain_tau $A5:abl5_data4_wide8 $A5:abl5_data4; cycle_widths) & B=$!
  wait $A $B
else
  data
  data4 && each train_to_deadline $A5:abl5_data4_wide $A5:abl5_data4_wide8 $A5:abl5_data4_wide_t05
  each chain_tau $A5:abl5_data4_wide $A5:abl5_data4_wide8 $A5:abl5_data4_wide_t05 &
  each chain_tau_t1 $A5:abl5_data4_wide $A5:abl5_data4_wide_t05
  wait
  cycle_widths  # before the deadline, so it starts; the hard deadline cuts it at the latest
fi
for run in $RUN $RUN4; do  # the ablation tables
  [ -d "$run" ] && python3 bench/summarise_ablation.py "$run" --out "$R/ablation_$(basename "$run").md" >> "$R/summary.log" 2>&1
done
touch "$R/ALL_DONE"

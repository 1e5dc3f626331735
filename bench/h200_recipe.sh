#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on one or two GPUs (nvidia-h200 or nvidia-h200-x2). The run
# of 2026-12-01 21:38 timed the cycle (draft 0.57 ms) and ran abl3_wide and abl3_lr4e3 to step
# ~1,780 (BENCHMARKS.md). What it left owed, in this order:
#   0. issue 15: the tree's draft, compiled as one region since 22:11 (1.48 ms before): the tree
#      shape's cycle breakdown (a random drafter), first and alone on the GPU
#   1. the recipe's data (its synth answers restored from .data: see below)
#   2. issue 13, recipes/ablation3_h200.yaml: `abl3_seed2` (the recipe at --seed 2, the same
#      validation split: the seed-to-seed spread) beside `abl3_wide_seed2` (the wide drafter,
#      3.96 against 3.93 at step 975, at seed 2 too): whether the wide drafter's lead is more
#      than a seed's worth. Side by side on one GPU (20.6k tok/s each
#      against 34.4k alone), until $EVAL_S before the deadline; a run stopped there keeps the
#      drafter of its best validation so far. Their validations (steps 975, 1950, ...) and train
#      τ (every 100 steps) compare step for step with the recipe's and abl3_wide's
#   3. issue 15: `eval --compile-target` end to end, never run: MT-bench chain K=7, 80 questions,
#      with its speed run (plain decoding compiled the same way), on abl3_seed2's drafter
#   4. abl3_wide_seed2's MT-bench chain τ (τ only), if time is left
#   before 2, alone on the GPU once the data is made: the trainer's step with and without
#   --compile-step (never timed on a GPU) and a profile of where online training's time goes
#   (bench/train_bench.py: 20 timed steps each)
#   two GPUs: 1 and 2 on GPU 0; on GPU 1, 0 and the trainer's step, then `abl3_decay1` (every
#             TTT step's loss weighted alike), then 3 on its drafter, then its chain τ
#   setsid bash bench/h200_recipe.sh &     # then, call after call: bash bench/fetch_results.sh 530
# The recipe's synth answers (5 of its ~5.4 data minutes) travel between leases: the driver packs
# them into /root/carry/h200_synth.tgz.part* (15 MB parts), fetch_results.sh brings those back;
# keep them in .data/ (git-ignored) and carry .data next time, copied into the driver's folder, and
# the data step restores them instead of synthesising again. The lease's second call, after the
# first has installed .whl and put the GGUF's first part in /root/parts:
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
A3=recipes/ablation3_h200.yaml
driver_start 25 2

bench_tree_cycle() {  # issue 15: the tree's cycle breakdown, its draft compiled as one region (a random drafter)
  step bench_tree_cycle 300 python3 bench/eval_bench.py --parts cycle --cycle-shapes tree --target $HF \
    --out-json "$R/bench_tree_cycle.json"
}
train_bench() {  # issue 13: the default and the compiled (--compile-step) training step, online, same rows, profiled
  while [ ! -f $RUN/.pipeline/vocab.done ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
  step train_bench 360 python3 bench/train_bench.py $RUN/prepare --target $HF --variant default: \
    --variant compiled:compile_step=true --steps 20 --out-json "$R/train_bench.json"
}
data() {  # the recipe's data stages: those quickstart --budget full runs before training
  local stages synths files=() name
  {  # line 1: the data stages, comma-separated; line 2: the synth ones among them
    read -r stages; read -r synths
  } < <(python3 -c "from draftsmith.pipeline.quickstart import DATA_COMMANDS, budget_stages as b
data = [s for s in b('full') if s[1] in DATA_COMMANDS]
print(','.join(s[0] for s in data)); print(' '.join(s[0] for s in data if s[1] == 'synth'))")
  if ls .data/h200_synth.tgz.part* > /dev/null 2>&1 && [ ! -f "$RUN/.pipeline/synth.done" ]; then
    # a lease before made these answers (synth is deterministic: the same recipe gives the same
    # file, BENCHMARKS 2026-12-01 18:28); pipeline then skips the synth stages as done earlier
    cat .data/h200_synth.tgz.part* | tar -C / -xzf - && echo "=== synth: restored from .data" >> "$R/steps.log"
  fi
  step data 600 python3 -m draftsmith pipeline $Y --only "$stages" || return
  if [ ! -d "$CARRY" ]; then  # the synth answers for the next lease (fetch_results.sh brings them back)
    files=("${RUN#/}/synth/conversations.jsonl" "${RUN#/}/synth/conversations.run.yaml")
    for name in $synths; do files+=("${RUN#/}/.pipeline/$name.started" "${RUN#/}/.pipeline/$name.done"); done
    mkdir -p "$CARRY" && tar -C / -czf - "${files[@]}" | split -b 15m - "$CARRY/h200_synth.tgz.part"
  fi
}
train_to_deadline() {  # one of ablation3's training stages, stopped $EVAL_S before the deadline at the latest
  while [ ! -f $RUN/.pipeline/vocab.done ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
  local left=$(( DEADLINE - EVAL_S - $(date +%s) ))
  [ "$left" -ge 60 ] || { echo "=== $1 skipped: less than a minute before the deadline" >> "$R/steps.log"; return 1; }
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step "$1" "$left" python3 -m draftsmith pipeline $A3 --only "$1"
}
chain_tau() {  # MT-bench chain τ of a training run's best drafter so far (stopped or not)
  [ -d "$RUN/$1/drafter" ] && step "$1_chain" 150 python3 -m draftsmith eval --target $HF --drafter "$RUN/$1" \
    --mode chain --k 7 --num-questions 80 --max-new-tokens 256 --no-speed --out "$RUN/$1_mtbench"
}
chain_speed() {  # issue 15: MT-bench chain with its speed run on $1's drafter, the target's forward compiled
  [ -d "$RUN/$1/drafter" ] && step "$1_compiled" 360 python3 -m draftsmith eval --target $HF --drafter "$RUN/$1" \
    --mode chain --k 7 --num-questions 80 --max-new-tokens 256 --compile-target --out "$RUN/$1_mtbench_compiled"
}
side_by_side() {  # training runs side by side on this lane's GPU
  local name pids=()
  for name in "$@"; do train_to_deadline "$name" & pids+=($!); done
  wait "${pids[@]}"
}
EVAL_S=${EVAL_S:-450}  # chain_speed after the training (360 s) and a margin; chain_tau runs if time is left
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=0; data; side_by_side abl3_seed2 abl3_wide_seed2; chain_tau abl3_seed2 & chain_tau abl3_wide_seed2; wait) & A=$!
  (export CUDA_VISIBLE_DEVICES=1; bench_tree_cycle; train_bench; side_by_side abl3_decay1; chain_speed abl3_decay1; chain_tau abl3_decay1) & B=$!
  wait $A $B
else
  bench_tree_cycle
  data
  train_bench
  side_by_side abl3_seed2 abl3_wide_seed2
  chain_speed abl3_seed2
  chain_tau abl3_wide_seed2
fi
[ -d $RUN ] && python3 bench/summarise_ablation.py $RUN --out "$R/ablation_h200.md" >> "$R/summary.log" 2>&1
touch "$R/ALL_DONE"

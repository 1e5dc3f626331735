#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on one or two GPUs (nvidia-h200 or nvidia-h200-x2). The run
# of 2026-12-01 18:28 measured the recipe (recipes/h200.yaml) on its new data: val τ 4.50, MT-bench
# chain τ 3.69, 2.66x. What it left owed, in this order:
#   1. the cycle breakdown with and without the target's forward compiled (issue 15, a random
#      drafter; untimed since 17:10 and 19:16: the chain's draft masks made once per cycle, its
#      draft steps and the glue between them compiled as one region): first,
#      alone on the GPU, so that nothing else shares it while it times
#   2. the recipe's data (its synth, prepare and vocab stages)
#   3. issue 13, recipes/ablation3_h200.yaml: `abl3_wide` (the drafter's MLP 4x wider) and
#      `abl3_lr4e3` (lr 4e-3: the second ablation's largest gain was lr 1e-3 -> 2e-3), both at
#      the recipe's seed, split and row order, so that their validations (steps 975, 1950,
#      2925, 3900) and their training τ (every 100 steps; unseen rows in the first epoch,
#      ~1,200 steps) compare with the recipe's (val 3.93 / 4.25 / 4.45 / 4.50). One GPU: the
#      two side by side on it (the step is host-bound, `data_wait` ~0.45: each runs slower than
#      alone), until 90 s before the deadline; a run stopped there keeps the drafter of its best
#      validation so far
#   4. each one's MT-bench chain τ (K=7, 80 questions, τ only)
#   two GPUs: 1 on GPU 1 while GPU 0 makes the data; then abl3_wide beside `abl3_seed2` (the
#             recipe at --seed 2, the same validation split: the seed-to-seed spread) on GPU 0,
#             abl3_lr4e3 alone on GPU 1
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

bench_cycle() {  # issue 15: the cycle breakdown with and without the target's forward compiled (a random drafter)
  step bench_cycle_compiled 300 python3 bench/eval_bench.py --parts cycle --compile-target --target $HF \
    --out-json "$R/bench_cycle_compiled.json"
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
train_to_deadline() {  # one of ablation3's training stages, stopped 90 s before the deadline at the latest
  while [ ! -f $RUN/.pipeline/vocab.done ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
  local left=$(( DEADLINE - 90 - $(date +%s) ))
  [ "$left" -ge 60 ] || { echo "=== $1 skipped: less than a minute before the deadline" >> "$R/steps.log"; return 1; }
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step "$1" "$left" python3 -m draftsmith pipeline $A3 --only "$1"
}
chain_tau() {  # MT-bench chain τ of a training run's best drafter so far (stopped or not)
  [ -d "$RUN/$1/drafter" ] && step "$1_chain" 150 python3 -m draftsmith eval --target $HF --drafter "$RUN/$1" \
    --mode chain --k 7 --num-questions 80 --max-new-tokens 256 --no-speed --out "$RUN/$1_mtbench"
}
side_by_side() {  # training runs side by side on this lane's GPU, then each one's MT-bench chain τ
  local name pids=()
  for name in "$@"; do train_to_deadline "$name" & pids+=($!); done
  wait "${pids[@]}"
  pids=()
  for name in "$@"; do chain_tau "$name" & pids+=($!); done
  wait "${pids[@]}"
}
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=0; data; side_by_side abl3_wide abl3_seed2) & A=$!
  (export CUDA_VISIBLE_DEVICES=1; bench_cycle; side_by_side abl3_lr4e3) & B=$!
  wait $A $B
else
  bench_cycle
  data
  side_by_side abl3_wide abl3_lr4e3
fi
[ -d $RUN ] && python3 bench/summarise_ablation.py $RUN --out "$R/ablation_h200.md" >> "$R/summary.log" 2>&1
touch "$R/ALL_DONE"

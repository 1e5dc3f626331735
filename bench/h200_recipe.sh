#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on one or two GPUs (nvidia-h200 or nvidia-h200-x2). The run
# of 2026-12-02 00:59 measured eval with the compiled target end to end (2.27x), the compiled
# training step (1.53x) and the seed spread; flex capture was timed alone after it (1.37x). Since
# then train's GPU defaults are --compile-step and --capture-attention flex, and eval's is
# --compile-target. What that leaves owed, in this order:
#   1. the recipe's data (its synth answers restored from .data: see below)
#   2. issue 13: the recipe's own training (recipes/h200.yaml's train_online, 3,900 steps x 8,192
#      tokens) at the new defaults: the same τ as the 18:28 run (4.50) in less GPU time? (τ per
#      GPU-minute), until $EVAL_S before the deadline; a run stopped there keeps the drafter of
#      its best validation so far
#   3. issue 15: its MT-bench chain (K=7) and tree (60x7x10) with their speed runs, both with the
#      compiled target (eval's GPU default now): the chain's 2.0x and the tree's 2.5x goals
#   4. issue 13, if time is left: the trainer's step at the new defaults against the old ones
#      (--no-compile-step --capture-attention dense), same rows, profiled (bench/train_bench.py)
#   5. the training GPU tests (tests/gpu/test_train_gpu.py: flex capture, the compiled step), if time is left
#   two GPUs: 1, 2 and 3 on GPU 0; on GPU 1, 4 and 5, then `abl3_decay1` (every TTT step's loss
#             weighted alike) until the deadline, then its chain τ
#   setsid bash bench/h200_recipe.sh &     # then, call after call: bash bench/fetch_results.sh 530
# The recipe's synth answers (5 of its ~5.4 data minutes) travel between leases: the driver packs
# them into /root/carry/h200_synth.tgz.part* (15 MB parts), fetch_results.sh brings those back;
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
A3=recipes/ablation3_h200.yaml
driver_start 25 2

train_bench() {  # issue 13: the training step at today's GPU defaults against the old ones, online, same rows, profiled
  while [ ! -f $RUN/.pipeline/vocab.done ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
  step train_bench 360 python3 bench/train_bench.py $RUN/prepare --target $HF --variant defaults: \
    --variant before:compile_step=false,capture_attention=dense --steps 20 --out-json "$R/train_bench.json"
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
train_to_deadline() {  # training stage $2 of recipe $1, stopped $EVAL_S before the deadline at the latest
  while [ ! -f $RUN/.pipeline/vocab.done ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
  local left=$(( DEADLINE - EVAL_S - $(date +%s) ))
  [ "$left" -ge 60 ] || { echo "=== $2 skipped: less than a minute before the deadline" >> "$R/steps.log"; return 1; }
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step "$2" "$left" python3 -m draftsmith pipeline "$1" --only "$2"
}
chain_tau() {  # MT-bench chain τ of a training run's best drafter so far (stopped or not)
  [ -d "$RUN/$1/drafter" ] && step "$1_chain" 150 python3 -m draftsmith eval --target $HF --drafter "$RUN/$1" \
    --mode chain --k 7 --num-questions 80 --max-new-tokens 256 --no-speed --out "$RUN/$1_mtbench"
}
gpu_tests() {  # training's GPU tests: flex capture against dense, the compiled step's no-recompile and memory
  step gpu_tests 300 python3 -m pytest -q --run-gpu tests/gpu/test_train_gpu.py
}
speed() {  # issue 15: MT-bench with its speed run ($2: chain or tree) on $1's drafter, the target compiled (the default)
  local shape=(--k 7)
  [ "$2" = tree ] && shape=(--k 7 --top-k 10 --total-tokens 60)
  [ -d "$RUN/$1/drafter" ] && step "$1_$2" 420 python3 -m draftsmith eval --target $HF --drafter "$RUN/$1" \
    --mode "$2" "${shape[@]}" --num-questions 80 --max-new-tokens 256 --out "$RUN/$1_$2"
}
EVAL_S=${EVAL_S:-660}  # both speed runs after the training (about 4 and 5 minutes) and a margin
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=0; data; train_to_deadline $Y train_online; speed train_online chain; speed train_online tree) & A=$!
  (export CUDA_VISIBLE_DEVICES=1; train_bench; gpu_tests; EVAL_S=180 train_to_deadline $A3 abl3_decay1; chain_tau abl3_decay1) & B=$!
  wait $A $B
else  # the step bench last: the recipe's own run gives the new defaults' tok/s too
  data
  train_to_deadline $Y train_online
  speed train_online chain
  speed train_online tree
  train_bench
  gpu_tests
fi
[ -d $RUN ] && python3 bench/summarise_ablation.py $RUN --out "$R/ablation_h200.md" >> "$R/summary.log" 2>&1
touch "$R/ALL_DONE"

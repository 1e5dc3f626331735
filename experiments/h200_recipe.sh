#!/usr/bin/env bash
# The H200 run behind BENCHMARKS.md, on one or two GPUs (nvidia-h200 or nvidia-h200-x2). The lease
# of 2026-12-03 08:45 trained two decoder layers on four times the distinct data to the full
# budget (val τ 4.831, MT-bench chain τ 4.00, tree τ 5.63); the recipe has trained that drafter on
# that data since. The next lease runs the recipe as committed, end to end:
#   1. the recipe's data (its nine synth sets restored from .data, where the lease of 2026-12-03
#      08:45 packed them, else made: ~11 GPU-minutes), beside the GPU test of validation replaying
#      the compiled training graph (val_gpu_test, ~3.5 minutes, mostly compile)
#   2. train_online alone until $EVAL_S before the deadline at the latest: the full budget (~11.4
#      minutes); it should give val τ 4.048 / 4.472 / 4.731 / 4.831 again (the same data, seed,
#      split and rows as abl5_data4_layers2 of 2026-12-03 08:52)
#   3. eval_chain: MT-bench chain τ and the speed-up against plain decoding (the recipe's stage:
#      80 questions, greedy, the compiled target), alone
#   4. eval_tree (K=7, top-k 10, 60 tokens, with its speed-up), in the minutes left
#   two GPUs: GPU 0 runs 1 to 4; GPU 1 runs val_gpu_test, then trains abl5_data4_wide (one layer,
#             experiments/recipes/ablation5_h200.yaml) to the full budget once the data is made: the same
#             split's one-layer figure at 31.8M tokens, then its MT-bench chain τ
#   setsid bash experiments/h200_recipe.sh &     # then, call after call: bash experiments/fetch_results.sh 530
# A lease too short for the plan runs some of its steps alone, e.g. ONLY_STEPS="gpu_tests cycle_widths"
# (the functions below, in that order; each still skipped once done or past the deadline). The
# ablations' plans up to 2026-12-03 are in this file's history (`git log --follow -p experiments/h200_recipe.sh`).
# The recipe's synth answers (~10 of its ~11 data minutes) travel between leases: the driver packs
# them into /root/carry/h200_synth.tgz.part* (15 MB parts), fetch_results.sh brings those back;
# keep them in .data/ (in .gitignore; a new session's checkout lacks it) and carry
# .data next time, copied into the driver's folder, and the data step restores them instead of
# synthesising again. Carry fits 64 MiB per call, so the lease takes three calls within 30 s of
# each other: (1) .whl and the GGUF's part00, installing the wheels and copying part00 to
# /root/parts; (2) part01, copied there too; (3) part02, the .sha256, join.sh and .data, then:
#   .devmodel/join.sh /root/parts .devmodel /root/m && rm -rf /root/ds && mkdir -p /root/ds &&
#   cp -r bench experiments recipes src tests pyproject.toml /root/ds/ && { [ ! -d .data ] || cp -r .data /root/ds/; } &&
#   cd /root/ds && export PYTHONPATH=/tmp/site:/root/ds/src:/root/ds && (setsid bash experiments/h200_recipe.sh > /root/driver.log 2>&1 &)
# Needs the embedded default's GGUF at $GGUF and the wheels the image lacks importable
# (experiments/h200_wheels.sh fetches them into .whl); reruns skip finished steps; no step starts
# after $DEADLINE and none runs past $HARD_DEADLINE (epoch seconds; default: 25 and 2 minutes
# after the start), so the lease's end cuts nothing unseen. Start it within a minute of the
# lease and poll back to back.
set -uo pipefail
. "$(dirname "$0")/steps.sh"
Y="recipes/h200.yaml --out $RUN --target $HF"  # the shipped template, in this host's folders
A5=experiments/recipes/ablation5_h200.yaml  # the same data and folder as $Y: one-layer runs on the recipe's split
driver_start 25 2

wait_for_data() {  # until the recipe's draft vocab is made (its data stages done), or the deadline
  while [ ! -f "$RUN/.pipeline/vocab.done" ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 5; done
}
cycle_widths() {  # the chain cycle of a random drafter at the target's MLP width, and at 4x with 1, 2 and 3 layers, in one process (~3 min)
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
data() {  # the recipe's data stages: those quickstart --budget full runs before training (SYNTH_SETS=N: its first N synth sets)
  local stages synths
  {  # line 1: the data stages, comma-separated; line 2: the synth ones among them
    read -r stages; read -r synths
  } < <(python3 -c "import os; from draftsmith.pipeline.quickstart import DATA_COMMANDS, budget_stages as b
data = [s for s in b('full') if s[1] in DATA_COMMANDS]
synth = [s[0] for s in data if s[1] == 'synth'][: int(os.environ.get('SYNTH_SETS') or 99)]
data = [s for s in data if s[1] != 'synth' or s[0] in synth]
print(','.join(s[0] for s in data)); print(' '.join(synth))")
  # a lease before made these answers (synth is deterministic: the same recipe gives the same file,
  # experiments/LOG.md, 2026-12-01 18:28); pipeline then skips the synth stages as done earlier
  [ -f "$RUN/.pipeline/synth.done" ] || restore_answers h200
  step data 900 python3 -m draftsmith pipeline $Y --only "$stages"; local rc=$?
  pack_answers h200 "$RUN" $synths  # cut short too: the next lease synthesises only what is missing
  return $rc
}
train_to_deadline() {  # training stage $1 of the recipe given by the rest (file and flags), stopped $EVAL_S before the deadline at the latest
  local name=$1; shift
  wait_for_data
  local left=$(( DEADLINE - EVAL_S - $(date +%s) ))
  [ "$left" -ge 60 ] || { echo "=== $name skipped: less than a minute before the deadline" >> "$R/steps.log"; return 1; }
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step "$name" "$left" python3 -m draftsmith pipeline "$@" --only "$name"
}
recipe_eval() {  # the recipe's eval stage $1 (MT-bench τ and the speed-up, as the recipe runs it), if train_online saved a drafter
  [ -d "$RUN/train_online/drafter" ] && step "$1" 480 python3 -m draftsmith pipeline $Y --only "$1"
}
mtbench_tau() {  # MT-bench chain τ of training stage $1 (K=7, 80 q, greedy): its best drafter so far; τ only, the target eager
  [ -d "$RUN/$1/drafter" ] && step "$1_chain" 270 python3 -m draftsmith eval --target $HF --drafter "$RUN/$1" \
    --mode chain --depth 7 --num-questions 80 --max-new-tokens 256 --no-speed --no-compile-target --out "$RUN/$1_mtbench"
}
EVAL_S=${EVAL_S:-300}  # eval_chain after the training (its plain decoding timed too, the target compiled) and a margin
if [ -n "${ONLY_STEPS:-}" ]; then  # a short lease: only these steps, in order (ONLY_STEPS="gpu_tests cycle_widths")
  for s in $ONLY_STEPS; do  # every name checked before any step runs
    declare -F "$s" > /dev/null || { echo "=== ONLY_STEPS: no step $s (it names functions of experiments/h200_recipe.sh)" | tee -a "$R/steps.log" >&2; exit 2; }
  done
  for s in $ONLY_STEPS; do "$s"; done
elif [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=0; data && train_to_deadline train_online $Y; recipe_eval eval_chain; recipe_eval eval_tree) & A=$!
  (export CUDA_VISIBLE_DEVICES=1; val_gpu_test; train_to_deadline abl5_data4_wide $A5; mtbench_tau abl5_data4_wide) & B=$!
  wait $A $B
else
  val_gpu_test & V=$!  # mostly compile: beside the data, and the first minutes of training if it lasts
  data && train_to_deadline train_online $Y
  wait $V
  recipe_eval eval_chain
  recipe_eval eval_tree  # before the deadline, so it starts; the hard deadline cuts it at the latest
fi
python3 experiments/summarise_ablation.py "$RUN" --out "$R/ablation_h200.md" >> "$R/summary.log" 2>&1
touch "$R/ALL_DONE"

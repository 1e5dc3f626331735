#!/usr/bin/env bash
# A drafter that a GPU lease trained, measured here on CPU (float32, greedy, batch 16, 256 new
# tokens a turn, 80 questions, no speed run): its run's held-out split, HumanEval's first 80
# problems (experiments/data/humaneval.jsonl) and MT-bench. For issue 53's data curve, whose points
# are compared in one place and dtype (the GPU lease measures MT-bench's speed-up; its held-out
# split needs the run's prepared set, which does not come back).
#   bash experiments/cpu_quality.sh NAME PACKED RUN_YAML OUT ANSWERS.tgz.part...
# PACKED: the drafter as experiments/drafter_pack.py packed it (.data/NAME.tgz.part* unpacked);
# RUN_YAML: its train_online/run.yaml (a lease's res.tgz brings it); the answers: the synth parts
# it trained on (pack_answers), prepared again here into the same samples (`prepare` is
# deterministic: the recipe's 56,129 conversations gave the lease's 18,048,784 tokens again).
# Writes OUT/{heldout,humaneval,mtbench}/report.json. About 30 minutes on the 2-core VM (NQ=2 TOKENS=16: a
# smoke run of the same steps).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 5 ] || { echo "usage: $0 NAME PACKED RUN_YAML OUT ANSWERS.tgz.part..." >&2; exit 2; }
name=$1 packed=$2 run_yaml=$3 out=$4
shift 4
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cat "$@" | tar -C "$W" -xzf -
python -m draftsmith prepare "$W"/root/runs/*/synth/conversations.jsonl --target smollm2-135m --out "$W/prepare" \
  --max-len 2048 > "$W/prepare.log"
run="$out/run_$name"
rm -rf "$run" && mkdir -p "$run"
dataset=$(python -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['config']['dataset_dir'])" "$run_yaml")
sed "s#$dataset#$W/prepare#" "$run_yaml" > "$run/run.yaml"  # the split of the run's own samples, prepared here
hf=$(python -c "from draftsmith.target import hf_folder; print(hf_folder('smollm2-135m', 'cpu_quality'))")
python experiments/drafter_pack.py unpack "$packed" "$run/drafter" --target "$hf"
common=(--max-new-tokens "${TOKENS:-256}" --num-questions "${NQ:-80}" --batch-size 16 --no-speed --device cpu --overwrite)
python -m draftsmith eval --drafter "$run" --bench held-out "${common[@]}" --out "$out/heldout"
python -m draftsmith eval --drafter "$run" --bench experiments/data/humaneval.jsonl "${common[@]}" --out "$out/humaneval"
python -m draftsmith eval --drafter "$run" "${common[@]}" --out "$out/mtbench"

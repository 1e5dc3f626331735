#!/usr/bin/env bash
# One polling call of a device lease while an H200 driver (h200_recipe.sh, ablation_h200.sh) runs
# in its own session: wait up to SECONDS for $R/ALL_DONE, print the steps so far and each run's
# progress, and pack every small result file (logs, metrics, reports, plots; no weights, stores
# or datasets) into $OUT/res.tgz, which the device tool brings back.
#   bash experiments/fetch_results.sh 240
# Call it again at once after each return: a lease left idle for 30 s is given back, and what the
# driver wrote after the last call is lost with it.
set -uo pipefail
R=${R:-/root/results}
wait_s=${1:-540}
for _ in $(seq $(( wait_s / 5 ))); do [ -f "$R/ALL_DONE" ] && break; sleep 5; done
cat "$R/steps.log" 2>/dev/null
# every run's progress: pipeline stages (runs/X/stage/), single runs (runs/X/) and a run still in
# its temporary folder (runs/.X.*.tmp/: eval, extract)
for f in /root/runs/*/*/progress.json /root/runs/*/progress.json /root/runs/.*.tmp/progress.json; do
  [ -f "$f" ] && python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(sys.argv[1], d.get('status'), d.get('done'), '/', d.get('total'), d.get('tok_per_s_now'), 'tok/s now', d.get('tok_per_s'), 'average')" "$f"
done
last=$(grep -o '^=== [^ ]* start' "$R/steps.log" 2>/dev/null | tail -1 | cut -d' ' -f2)
[ -n "$last" ] && [ -f "$R/$last.log" ] && { echo "--- $last.log, last lines:"; tr '\r' '\n' < "$R/$last.log" | tail -3 | cut -c1-300; }
cd /root && find runs results eval_* batch -type f -size -3M ! -name '*.safetensors' ! -name '*.pt' ! -name '*.arrow' \
  ! -name '*.bin' ! -name '*.jsonl.tmp' 2>/dev/null | tar czf "${OUT:-/tmp}/res.tgz" -T -
C=${CARRY:-/root/carry}  # what the next lease needs (synth answers, a trained drafter: steps.sh pack_answers, pack_dir)
sent=0  # each part brought back once, three a call: with res.tgz within the tool's 64 MiB a call
for part in "$C"/*.part??; do  # partaa, partab, ...: not their .sent markers
  [ "$sent" -lt 3 ] && [ -f "$part" ] && [ ! -f "$part.sent" ] && cp "$part" "${OUT:-/tmp}/" && touch "$part.sent" && sent=$((sent + 1))
done
ls -la "${OUT:-/tmp}"

# Sourced by the H200 drivers (h200_recipe.sh, ablation_h200.sh): their common start and one
# resumable step runner.
#   driver_start START_MIN HARD_MIN  the results folder $R, unbuffered Python, $DEADLINE (START_MIN
#                                    minutes from now) and $HARD_DEADLINE (HARD_MIN after it) unless
#                                    set, the GPUs and versions in $R/gpu.txt, and the embedded
#                                    default's GGUF ($GGUF) as an HF folder at $HF (once)
#   step NAME TIMEOUT_S COMMAND...   run COMMAND under a timeout, log it to $R/NAME.log, record its
#                                    start, rc and end in $R/steps.log; a step that ended with rc 0
#                                    ($R/NAME.ok) is skipped on a rerun, and so is every step that
#                                    would start after $DEADLINE (epoch seconds), if it is set;
#                                    a step never runs past $HARD_DEADLINE (its timeout is cut)
step() {
  local name=$1 limit=$2; shift 2
  [ -f "$R/$name.ok" ] && { echo "=== $name skipped: done earlier" >> "$R/steps.log"; return; }
  local now; now=$(date +%s)
  if [ -n "${DEADLINE:-}" ] && [ "$now" -ge "$DEADLINE" ]; then
    echo "=== $name skipped: past the deadline" >> "$R/steps.log"; return 1
  fi
  if [ -n "${HARD_DEADLINE:-}" ] && [ $(( HARD_DEADLINE - now )) -lt "$limit" ]; then
    limit=$(( HARD_DEADLINE - now )); [ "$limit" -gt 0 ] || limit=1
  fi
  echo "=== $name start $(date -u +%FT%TZ) (limit ${limit}s)" >> "$R/steps.log"
  timeout "$limit" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc end $(date -u +%FT%TZ)" >> "$R/steps.log"
  [ $rc -eq 0 ] && touch "$R/$name.ok"
  return $rc
}

R=${R:-/root/results}
GGUF=${GGUF:-/root/m/SmolLM2-135M-Instruct.Q4_1.gguf}
HF=${HF:-/root/smollm2-hf}
RUN=${RUN:-/root/runs/h200}

driver_start() {
  mkdir -p "$R"
  export PYTHONUNBUFFERED=1
  export DEADLINE=${DEADLINE:-$(( $(date +%s) + $1 * 60 ))}
  export HARD_DEADLINE=${HARD_DEADLINE:-$(( DEADLINE + $2 * 60 ))}
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.txt"
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' >> "$R/gpu.txt"
  [ -f "$HF/config.json" ] || step convert 300 python3 bench/gguf_to_hf.py "$GGUF" "$HF"
}

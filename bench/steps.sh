# Sourced by the H200 drivers (h200_recipe.sh, ablation_h200.sh): one resumable step runner.
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

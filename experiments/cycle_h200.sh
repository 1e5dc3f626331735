#!/usr/bin/env bash
# One device call, carrying only .whl (issue 53's tree cycle, on the GPU): the chain's, the adaptive
# chain's (chain_walk: eval --stop-below drafting every step, a graph and host read each) and the
# tree's cycle by part and kernel by kernel, the tree's top-k by its parts, on a SmolLM2-135M-shaped
# target and drafter of random weights (kernel times depend on the shapes; tau is ~1, so only the
# per-cycle costs mean anything), after the adaptive chain's GPU tests on that target (graphed
# adaptive-chain decoding equals plain decoding; eval's other GPU tests passed on 2026-12-05 11:55).
# experiments/cond_graph_probe.py ran once (H100, 2026-12-05 11:55: torch 2.11 has no CUDA-graph
# conditional nodes) and is not run again.
#   bash experiments/cycle_h200.sh     # results in $OUT (the device tool's), else /tmp/cycle
# The call carries .whl (experiments/h200_wheels.sh: what draftsmith needs and the image lacks).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/cycle}
mkdir -p "$O"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  git log -1 --format='revision %h %cI' 2>/dev/null; date -u +%FT%TZ; } > "$O/setup.log" 2>&1
python3 experiments/random_target.py /root/rand135m >> "$O/setup.log" 2>&1
# first the adaptive chain's GPU tests (new: the lease of 2026-12-05 14:47 never reached them), then
# the cycle's parts (draft, verify, glue: accept, compact, observe; the tree draft's step, top-k
# and its parts, selection and ancestor mask as graph replays), the verify cost by width, one
# profiled turn a shape, with the eager target and the compiled one; cycle.json is rewritten after
# each shape, so a run cut by its limit keeps what it measured (on 2026-12-05 14:47, H100, the three
# shapes' compiles took the whole 300 s and the JSON was only written at the end)
DRAFTSMITH_TEST_TARGET=/root/rand135m timeout 150 python3 -m pytest tests/gpu/test_eval_gpu.py --run-gpu -q \
  -p no:cacheprovider -k adaptive > "$O/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$O/setup.log"
timeout 380 python3 bench/eval_bench.py --target /root/rand135m --parts verify,cycle --cycle-shapes chain,chain_walk,chain_walk_sync,tree \
  --compile-target --num-questions 10 --max-new-tokens 128 --plain-prompts 3 --plain-tokens 128 \
  --profile "$O/prof" --out-json "$O/cycle.json" > "$O/bench.log" 2>&1
echo "bench rc=$?" >> "$O/setup.log"
rm -f "$O"/prof/*.json  # the traces: too large to bring back
tar -C "$O" -czf "$O/prof.tgz" prof && rm -rf "$O/prof"  # one file: the device tool brings back 8

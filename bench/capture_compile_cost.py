"""What `train --compile-capture` pays to compile: its one decoder layer compiled for all the
layers (`runtime.capture.CompiledCapture`), against the whole target forward compiled as one
region (what it compiled before 2026-12-06 14:30). Each scope runs in its own process with an
empty inductor cache: the first packed row (where the compile happens), the median of later rows,
and the largest difference from the eager capture.

    python bench/capture_compile_cost.py --target smollm2-135m --device cpu --width 256

On CPU this is inductor's C++ backend, a proxy of the compile's size; the GPU's rate is
`bench/train_bench.py`'s A-B-A.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from draftsmith.layers import default_aux_layers
from draftsmith.runtime.capture import CompiledCapture, capture, capturing, packed_positions, stacked_aux
from draftsmith.target import base_model, load_target


class WholeForward:
    """The whole forward compiled as one region, its hooks filling a dict that outlives the
    graph (dynamo keeps no guard on hooks), emptied after each row."""

    def __init__(self, model: torch.nn.Module, aux_layer_ids: list[int]) -> None:
        self.model, self.aux_layer_ids, self.captured = model, aux_layer_ids, {}
        base = base_model(model)

        def forward(ids: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = base(input_ids=ids, position_ids=pos, use_cache=False)
            return stacked_aux(self.captured, aux_layer_ids, ids.device), out.last_hidden_state

        self.forward = torch.compile(forward, dynamic=False)

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with capturing(self.model, self.aux_layer_ids, None, self.captured):
            try:
                return self.forward(ids, pos)
            finally:
                self.captured.clear()


def one_scope(args: argparse.Namespace) -> dict:
    """In this process: the first row and later rows of one scope's compiled capture."""
    target = load_target(args.target, device=args.device, dtype=args.dtype)
    aux = default_aux_layers(target.info.num_layers)
    compiled = CompiledCapture(target.model, aux, None) if args.scope == "layers" else WholeForward(target.model, aux)
    gen = torch.Generator().manual_seed(0)
    w = args.width
    rows = [(torch.randint(3, 1000, (1, w), generator=gen), [w // 4, w // 2, w - w // 4 - w // 2]) for _ in range(4)]
    times, diff = [], 0.0
    for ids, lengths in rows:
        ids, pos = ids.to(target.device), packed_positions(lengths, target.device)[None]
        t0 = time.perf_counter()
        got = compiled(ids, pos)
        if target.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        want = capture(target.model, ids, None, aux, pos)
        diff = max(diff, *((g.float() - x.float()).abs().max().item() for g, x in zip(got, want, strict=True)))
    frames = torch._dynamo.utils.counters["frames"]["total"]
    return {
        "scope": args.scope,
        "first_row_s": round(times[0], 2),
        "later_row_s": round(statistics.median(times[1:]), 4),
        "frames_compiled": frames,
        "max_abs_diff_from_eager": diff,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--width", type=int, default=256, help="tokens of a packed row (three samples)")
    ap.add_argument("--scope", choices=["layers", "whole"], default=None, help="one scope, in this process")
    ap.add_argument("--out-json", default=None)
    args = ap.parse_args()
    if args.scope is not None:
        print(json.dumps(one_scope(args)))
        return
    scopes = {}
    for scope in ("layers", "whole"):  # each in a fresh process and inductor cache: a cold compile
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="inductor-")}
        cmd = [sys.executable, __file__, "--scope", scope, "--target", args.target, "--width", str(args.width)]
        cmd += ["--dtype", args.dtype] + (["--device", args.device] if args.device else [])
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        scopes[scope] = json.loads(out.strip().splitlines()[-1])
    result = {
        "bench": "capture_compile_cost",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([sys.executable, *sys.argv]),
        "torch": torch.__version__,
        **scopes,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out_json:
        with open(args.out_json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

"""Can this torch capture a data-dependent branch (`torch.cond`) into a CUDA graph as a conditional
node, so that a graphed chain draft could stop on the drafter's confidence (issue 53's adaptive
depth) without leaving its one graph? Captures 8 drafter-sized steps (a [1, 576] x [576, 32000]
matmul each), the last 6 each behind `torch.cond(confidence >= threshold)`, replays the graph with
the predicate true and false, checks the results against eager and times both replays.

    python experiments/cond_graph_probe.py          # prints one JSON line; needs CUDA
"""

from __future__ import annotations

import json
import time

import torch


def main() -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(576, 32000, device=dev, generator=g, dtype=torch.bfloat16) / 24
    back = torch.randn(32000, 576, device=dev, generator=g, dtype=torch.bfloat16) / 180
    x0 = torch.randn(1, 576, device=dev, generator=g, dtype=torch.bfloat16)
    conf = torch.ones((), device=dev)  # the drafter's confidence, written before each replay

    def step(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.softmax((x @ w).float(), -1).to(x.dtype) @ back * 50) + x  # each step moves x

    def draft(x: torch.Tensor) -> torch.Tensor:
        x = step(step(x))
        for _ in range(6):
            x = torch.cond(conf >= 0.5, step, lambda y: y.clone(), (x,))
        return x

    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name()}
    expect = {v: None for v in (1.0, 0.0)}
    for v in expect:
        conf.fill_(v)
        expect[v] = draft(x0).clone()
    out["branches_differ"] = not torch.allclose(expect[1.0].float(), expect[0.0].float(), atol=1e-2)
    try:  # torch 2.11 has no such module (2026-12-05, H100): the probe says so
        from torch._higher_order_ops.cudagraph_conditional_nodes import (
            ControlFlowOpWarmupDispatchMode,
            CUDAGraphCaptureControlFlowOpDispatchMode,
        )

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), ControlFlowOpWarmupDispatchMode():
            draft(x0)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), CUDAGraphCaptureControlFlowOpDispatchMode():
            y = draft(x0)
    except Exception as e:  # the probe's answer is whether this works
        out["captured"] = False
        out["error"] = f"{type(e).__name__}: {e}"[:400]
        print(json.dumps(out), flush=True)
        return
    out["captured"] = True
    for v, name in ((1.0, "all_8_steps"), (0.0, "first_2_steps")):
        conf.fill_(v)
        graph.replay()
        torch.cuda.synchronize()
        out[f"{name}_equal_eager"] = bool(torch.allclose(y.float(), expect[v].float(), atol=1e-2))
        t = time.perf_counter()
        for _ in range(200):
            graph.replay()
        torch.cuda.synchronize()
        out[f"{name}_ms"] = round((time.perf_counter() - t) / 200 * 1e3, 4)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

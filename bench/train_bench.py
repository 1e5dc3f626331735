"""Training throughput and peak memory of the EAGLE-3 TTT step (issue 5, must-show 5).

For each mode (offline: hidden states already on the host, copied in like a loader would;
online: the target's hook capture runs inside the step) and each row length (2k, 8k, 32k
tokens; one packed row = one micro-batch), it times full optimizer steps (capture if online,
K-step TTT forward, chunked loss, backward, clip, AdamW) and reads the peak GPU memory.

    python bench/train_bench.py --target /root/m/SmolLM2-135M-Instruct.Q4_1.gguf --out-json train_bench.json
    python bench/train_bench.py --smoke            # CPU, tiny random target, seconds

Prints one JSON object and writes it to --out-json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch

from draftsmith.layers import default_aux_layers
from draftsmith.runtime.capture import capture
from draftsmith.target import lm_head_weight, load_target, target_from_model, text_config
from draftsmith.train.config import TrainConfig
from draftsmith.train.loss import TTTObjective
from draftsmith.train.run import build_drafter
from draftsmith.train.ttt import default_backend, doc_and_positions


def tiny_target():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    return target_from_model(LlamaForCausalLM(cfg), tokenizer=None, name="tiny-random")


def make_row(seq_len: int, sample_len: int, vocab: int, device: torch.device) -> dict[str, torch.Tensor]:
    """One packed row of `seq_len` tokens: samples of `sample_len` tokens, random ids, all trained on."""
    lengths = [sample_len] * (seq_len // sample_len) + ([seq_len % sample_len] if seq_len % sample_len else [])
    doc, pos = doc_and_positions(lengths, seq_len, device)
    ids = torch.randint(3, vocab, (1, seq_len), device=device)
    return {"ids": ids, "loss_mask": torch.ones_like(ids), "doc": doc[None], "pos": pos[None]}


def bench_one(target, objective, optimizer, mode: str, seq_len: int, sample_len: int, steps: int, warmup: int,
              autocast: bool, profile: bool = False) -> dict:
    device = target.device
    layers = objective.drafter.config.aux_layer_ids
    row = make_row(seq_len, sample_len, target.info.vocab_size, device)
    host = None
    if mode == "offline":  # hidden states made once, kept on the host (pinned), copied in per step
        aux, final = capture(target.model, row["ids"], None, layers)
        pin = device.type == "cuda"
        host = {"aux": aux.cpu().pin_memory() if pin else aux.cpu(), "final": final.cpu().pin_memory() if pin else final.cpu()}
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    prof = None
    for i in range(warmup + steps):
        if profile and i == warmup:  # profile the first timed step
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        t0 = time.perf_counter()
        if host is None:
            aux, final = capture(target.model, row["ids"], None, layers)  # [1, T, n*H], [1, T, H]
        else:
            aux, final = host["aux"].to(device, non_blocking=True), host["final"].to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss, _ = objective(row["ids"], row["loss_mask"], row["doc"], row["pos"], aux, final)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in objective.parameters() if p.requires_grad], 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        if prof is not None and i == warmup:
            prof.__exit__(None, None, None)
            for key in ("self_cuda_time_total", "self_cpu_time_total"):
                print(f"--- {mode} {seq_len}: top ops by {key}", file=sys.stderr)
                print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60), file=sys.stderr, flush=True)
            prof = None
    step_s = sum(times) / len(times)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {"mode": mode, "seq_len": seq_len, "sample_len": sample_len, "step_ms": round(step_s * 1000, 1),
            "tok_per_s": round(seq_len / step_s, 1), "peak_mem_gib": round(peak, 2) if peak is not None else None,
            "loss": round(float(loss), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m", help="target spec (alias, .gguf, HF folder)")
    ap.add_argument("--seq-lens", default="2048,8192,32768", help="packed row lengths to measure")
    ap.add_argument("--sample-len", type=int, default=0, help="tokens per packed sample (0: one sample fills the row, the worst case for attention)")
    ap.add_argument("--modes", default="offline,online")
    ap.add_argument("--ttt", type=int, default=7)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps (flex_attention compiles here)")
    ap.add_argument("--attention", default="auto", choices=["auto", "eager", "flex"])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny random target, short rows")
    ap.add_argument("--profile", action="store_true", help="print torch.profiler tables of the first timed step")
    ap.add_argument("--out-json", type=Path, default=None)
    args = ap.parse_args()

    if args.smoke:
        target, device = tiny_target(), torch.device("cpu")
        args.seq_lens, args.steps, args.warmup, args.draft_vocab, args.ttt = "64,128", 2, 1, 512, 3
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        target = load_target(args.target, device, "auto")
    vocab = target.info.vocab_size
    k = min(args.draft_vocab, vocab)
    d2t, t2d = torch.zeros(k, dtype=torch.long), torch.zeros(vocab, dtype=torch.bool)
    t2d[:k] = True
    layers = default_aux_layers(target.info.num_layers)
    backend = default_backend(device) if args.attention == "auto" else args.attention
    autocast = device.type == "cuda"
    results = []
    for seq_len in [int(s) for s in args.seq_lens.split(",")]:
        for mode in args.modes.split(","):
            torch.manual_seed(0)
            drafter = build_drafter(target, layers, d2t, t2d, TrainConfig(dataset_dir=Path('.'), out=Path('.'))).to(device)
            objective = TTTObjective(drafter, lm_head_weight(target.model).detach(), args.ttt, backend)
            optimizer = torch.optim.AdamW([p for p in objective.parameters() if p.requires_grad], lr=1e-4)
            try:
                r = bench_one(target, objective, optimizer, mode, seq_len, args.sample_len or seq_len, args.steps,
                              args.warmup, autocast, args.profile)
            except torch.OutOfMemoryError as e:
                r = {"mode": mode, "seq_len": seq_len, "error": f"OOM: {str(e)[:200]}"}
            results.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
            del drafter, objective, optimizer
            if device.type == "cuda":
                torch.cuda.empty_cache()
    report = {
        "bench": "train", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "target": target.info.name, "hidden_size": int(text_config(target.model.config).hidden_size),
        "aux_layers": layers, "ttt": args.ttt, "draft_vocab": k, "attention": backend, "autocast_bf16": autocast,
        "results": results,
    }
    print(json.dumps(report, indent=2))
    if args.out_json:
        args.out_json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

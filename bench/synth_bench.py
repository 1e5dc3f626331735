"""Benchmark of `draftsmith synth` (local backend): generated tokens/s for N GSM8K prompts
through the real synth code path (`draftsmith.synth.run.run`: batching, filters, JSONL output),
next to plain single-stream HF `generate` on the same target, same prompts, same cache, in the
same process. The bar (issue #3) is 20x the single-stream rate.

    python bench/synth_bench.py --target /root/m/SmolLM2-135M-Instruct.Q4_1.gguf \
        --num-prompts 1000 --max-new-tokens 256 --batch-size 256 --out-json bench_synth.json
    python bench/synth_bench.py --smoke        # CPU check, a minute

With --profile DIR, one batch of the real decode path (synth/generate.py: the static-KV engine,
one CUDA graph a step on GPU) is also run for --profile-steps steps, after a warm-up batch that
captures its graph: once timed (the wall ms a step), once under torch.profiler: DIR/synth_decode.txt
(kernels by device time) and .json (the trace), and per decode step the kernels' ms and their count
(wall - kernels: the device idle, waiting on the host).

    python bench/synth_bench.py --target ... --batch-size 1024 --profile runs/synth_prof

--decode-compiled profiles the same batch again with the step's forward compiled inside its graph,
whole (eval's compiled target) and layer by layer (one decoder layer's step compiled for all):
eager and compiled decode steps side by side, with each graph's capture (compile) seconds.

--sdpa-variants efficient_attention,cudnn_attention adds a synth pass per SDPA backend that the
engine's attention tries first (the step's attention ran cuDNN's kernel). --fuse-ab adds a pass
with the target's projections unfused and one fused (synth --no-fuse-target / --fuse-target).
--shrink-ab adds a pass whose batches shrink to their running rows (synth --shrink-batches) and
one whose batches keep every row to the end again (the default). --refill-ab adds a pass whose
rows take the next prompts as their answers end (synth --refill-batches) and one of the default
again. --compile-ab adds a pass with each decode graph compiled layer by layer (synth
--compile-target; the compiles in its time) and one eager again. --batch-ab 2048,4096 adds a pass
at each of those batch sizes (as many rows at a time as the device's memory fits: synth fits its
rows to the free memory) and one at --batch-size again. --flash-ab adds a pass whose decode steps
read the cache through masked SDPA (synth --no-flash-decode) and one through FlashAttention's variable-length kernel again (synth's
default where it runs: bf16/fp16 on a GPU); with --profile, the decode batch is profiled with
flash decoding too. Every other pass is synth's default, flash decoding included. --magpie N
makes each pass synthesise N Magpie conversations (self-prompted user turns, then answers: the
recipe's bulk) instead of answering the prompt file.

Prints one JSON object and writes it to --out-json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from draftsmith.assets import GSM8K_TRAIN
from draftsmith.data.formats import read_conversations
from draftsmith.data.sources import synth_folder
from draftsmith.runtime.engine import TargetEngine
from draftsmith.runtime.sampling import Sampling
from draftsmith.synth.config import SynthConfig
from draftsmith.synth.generate import cache_width, generate
from draftsmith.synth.local import LocalBackend, encode, stop_token_ids
from draftsmith.synth.output import read_records
from draftsmith.synth.run import run
from draftsmith.synth.turns import Request
from draftsmith.target import load_target


def single_stream(target, questions: list[str], max_new_tokens: int) -> dict:
    """Plain HF `generate`, one prompt at a time, greedy, stopping at the same end-of-turn ids."""
    tok, model = target.tokenizer, target.model
    eos = sorted(stop_token_ids(target))
    tokens, seconds = 0, 0.0
    for q in questions:
        text = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"].to(target.device)
        if target.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
        if target.device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - t0
        tokens += out.shape[1] - ids.shape[1]
    return {
        "prompts": len(questions),
        "generated_tokens": tokens,
        "seconds": round(seconds, 3),
        "tok_per_s": round(tokens / seconds, 2),
    }


def profile_decode(
    target, questions: list[str], steps: int, out: Path, compile: str | None = None, flash: bool = False
) -> dict:
    """One batch of `questions` (one row each) decoded for `steps` steps through synth's own
    `generate`, with no stop ids (every row runs every step): a warm-up batch that captures the
    step's graph, one timed batch, and one under torch.profiler. Returns the wall ms a step (the
    prefill included, once), the kernels' ms and count a step, and where the table and trace went.
    `compile`: the step's forward compiled inside its graph, whole ("forward": eval's compiled
    target) or layer by layer ("layers": one decoder layer's step compiled for all), its files
    named synth_decode_compiled.* or synth_decode_compiled_layers.*; `capture_seconds`: the
    graph's capture, its compile included. `flash`: the steps through FlashAttention's
    variable-length kernel (synth --flash-decode), its files named synth_decode_flash.*."""
    from torch.profiler import ProfilerActivity, profile

    dev = target.device
    backend = LocalBackend(target, batch_size=len(questions), generator="engine")  # synth's prompts and pad id
    prompts = [
        encode(backend.tokenizer, Request(f"p{i}", [{"role": "user", "content": q}]), False)
        for i, q in enumerate(questions)
    ]
    engine = TargetEngine(
        target.model,
        [],
        cache_width(max(map(len, prompts)), steps),
        batch=len(prompts),
        compile=compile is not None,
        compile_scope=compile or "forward",
        flash_decode=flash,
    )
    name = {None: "synth_decode", "forward": "synth_decode_compiled", "layers": "synth_decode_compiled_layers"}[compile]
    name += "_flash" if flash else ""
    sampling = Sampling(max_new_tokens=steps)

    def decode() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        generate(engine, prompts, sampling, set(), backend.pad, seed=0)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    decode()  # the warm-up: the step's CUDA graph captured (and its forward compiled)
    seconds = decode()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        decode()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    out.mkdir(parents=True, exist_ok=True)
    sort = "self_device_time_total" if kernels else "self_cpu_time_total"
    (out / f"{name}.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=60, max_name_column_width=90))
    prof.export_chrome_trace(str(out / f"{name}.json"))
    return {
        "flash_decode": flash,
        "compiled": engine.compiled,  # False where the compile failed (the engine's line on stderr says why)
        "rows": len(prompts),
        "cache_slots": engine.max_len,
        "capture_seconds": round(engine.capture_seconds, 2),
        "steps": steps,
        "wall_ms_per_step": round(1000 * seconds / steps, 3),  # the prefill included, once
        "kernel_ms_per_step": round(sum(e.self_device_time_total for e in kernels) / 1000 / steps, 3),
        "kernels_per_step": round(len(kernels) / steps, 1),
        "table": str(out / f"{name}.txt"),
    }


def synth_pass(
    args: argparse.Namespace,
    convs: list[dict],
    sdpa: str | None = None,
    fuse: bool | None = None,
    shrink: bool = False,
    compile: bool = False,
    flash: bool | None = None,
    refill: bool = False,
    batch_size: int | None = None,
    magpie_max_tokens: int | None = None,
) -> dict:
    """The prompts (or --magpie's self-prompts) through `draftsmith synth` (a fresh output each
    pass): its rate and counters.
    `sdpa`: the SDPA backend tried first wherever it can run (the engine's graphs are captured
    under it; math where it cannot, e.g. the self-check's HF forward on CPU), e.g.
    efficient_attention; None: torch's own choice. `fuse`: synth's --fuse-target (None: its
    default, fused on a GPU). `shrink`: synth's --shrink-batches. `compile`: synth's
    --compile-target (each decode graph compiled layer by layer; its compiles in the pass's time).
    `flash`: synth's --flash-decode (None: its default, on where the kernel runs). `refill`:
    synth's --refill-batches. `batch_size`: synth's --batch-size (None: --batch-size's).
    `magpie_max_tokens`: synth's --magpie-max-tokens, the self-prompted user turns' cap (None: --max-new-tokens)."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    with (
        tempfile.TemporaryDirectory() as tmp,
        nullcontext()
        if sdpa is None
        else sdpa_kernel([getattr(SDPBackend, sdpa.upper()), SDPBackend.MATH], set_priority=True),
    ):
        prompt_file = Path(tmp) / "prompts.jsonl"
        prompt_file.write_text(
            "".join(json.dumps({"id": c["id"], "prompt": c["messages"][0]["content"]}) + "\n" for c in convs)
        )
        out = Path(tmp) / "synth" / "conversations.jsonl"
        cfg = SynthConfig(
            prompts=None if args.magpie else prompt_file,
            magpie=args.magpie or None,
            seed=11,  # a Magpie pass's user turns are sampled: the same seed each pass
            target=args.target,
            out=out,
            max_new_tokens=args.max_new_tokens,
            keep_unfinished=True,  # as the recipe synthesises (a --smoke run's 16 tokens end no answer)
            temperature=0.0,
            batch_size=batch_size or args.batch_size,
            cache=args.cache,
            generator=args.generator,
            device=args.device,
            dtype=args.dtype,
            fuse_target=fuse,
            shrink_batches=shrink,
            refill_batches=refill,
            compile_target=compile,
            flash_decode=flash,
            magpie_max_tokens=magpie_max_tokens,
        )
        t0 = time.perf_counter()
        run(cfg)
        wall = time.perf_counter() - t0
        progress = json.loads((synth_folder(out) / "progress.json").read_text())
        kept = read_records(out)
    return {
        "batch_size": cfg.batch_size,
        "sdpa": sdpa or "torch's choice",
        "fuse_target": "default" if fuse is None else fuse,
        "shrink": shrink,
        "refill": refill,
        "compile_target": compile,
        "flash_decode": "default" if flash is None else flash,
        "generated_tokens": progress["tokens"],
        "seconds": progress["elapsed_s"],
        "tok_per_s": progress["tok_per_s"],
        "conversations_per_s": progress["rate"],
        "wall_s_with_load": round(wall, 1),
        "kept": len(kept),
        "counters": progress["counters"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m", help="target spec (alias, .gguf file or HF folder)")
    ap.add_argument("--prompts", type=Path, default=GSM8K_TRAIN, help="prompt file (default: bundled GSM8K train)")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--cache", choices=["dynamic", "static"], default="dynamic", help="KV cache of --generator hf")
    ap.add_argument(
        "--generator",
        choices=["auto", "engine", "hf"],
        default="auto",
        help="local generator (auto: the static-KV engine where the target passes its self-check, else HF generate)",
    )
    ap.add_argument("--baseline-prompts", type=int, default=3, help="prompts for the single-stream baseline")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--bar", type=float, default=20.0, help="required speed-up over single-stream generate")
    ap.add_argument("--profile", type=Path, default=None, help="also profile one batch's decode steps into this folder")
    ap.add_argument("--profile-steps", type=int, default=64, help="decode steps of the timed and profiled batch")
    ap.add_argument(
        "--sdpa-variants",
        default="",
        help="also a pass per SDPA backend, comma-separated (efficient_attention, cudnn_attention, math)",
    )
    ap.add_argument(
        "--decode-compiled",
        action="store_true",
        help="with --profile: the same batch again with the step's forward compiled whole (eval's compiled target) "
        "and layer by layer, eager and both compiled side by side",
    )
    ap.add_argument(
        "--fuse-ab",
        action="store_true",
        help="after the first pass (synth's default engine), the same prompts unfused, then fused, in this process",
    )
    ap.add_argument(
        "--refill-ab",
        action="store_true",
        help="then the same prompts with rows refilled as their answers end (synth --refill-batches), then the default again",
    )
    ap.add_argument(
        "--shrink-ab",
        action="store_true",
        help="then the same prompts with batches shrinking to their running rows, then keeping every row again",
    )
    ap.add_argument(
        "--compile-ab",
        action="store_true",
        help="then the same prompts with each decode graph compiled layer by layer (synth --compile-target), then eager again",
    )
    ap.add_argument(
        "--flash-ab",
        action="store_true",
        help="then the same prompts with decode steps through masked SDPA (synth --no-flash-decode), then "
        "FlashAttention's kernel again (the default); with --profile the decode batch with it too",
    )
    ap.add_argument(
        "--batch-ab",
        default="",
        help="then a pass at each of these batch sizes (comma-separated), then --batch-size's again",
    )
    ap.add_argument(
        "--magpie-cap-ab",
        type=int,
        default=0,
        help="with --magpie: then a pass with the self-prompted user turns capped at this many tokens "
        "(synth --magpie-max-tokens), then the default again (seconds and conversations/s compare; tok/s "
        "counts the user turns' tokens too)",
    )
    ap.add_argument(
        "--magpie", type=int, default=0, help="each pass synthesises this many Magpie conversations instead"
    )
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run: 8 prompts, 16 new tokens, batch 4")
    ap.add_argument("--out-json", type=Path, default=Path("bench_synth.json"))
    args = ap.parse_args()
    if args.magpie_cap_ab < 0:
        ap.error(f"--magpie-cap-ab {args.magpie_cap_ab}: give a cap of 1 or more tokens (0: no such pass)")
    if args.magpie_cap_ab and not args.magpie:
        ap.error("--magpie-cap-ab caps self-prompted user turns: add --magpie N")
    if args.decode_compiled and args.profile is None:
        ap.error("--decode-compiled profiles the decode batch a second time: add --profile DIR")
    from torch.nn.attention import SDPBackend

    unknown = [b for b in args.sdpa_variants.split(",") if b and not hasattr(SDPBackend, b.upper())]
    if unknown:
        ap.error(
            f"unknown variant(s) {', '.join(unknown)}: "
            "--sdpa-variants takes efficient_attention, cudnn_attention, flash_attention, math"
        )
    if args.smoke:
        args.num_prompts, args.max_new_tokens, args.batch_size, args.baseline_prompts = 8, 16, 4, 2
        args.device = args.device or "cpu"

    convs = read_conversations(args.prompts)[: args.num_prompts]
    passes = {"synth": synth_pass(args, convs)}
    for backend in args.sdpa_variants.split(",") if args.sdpa_variants else []:  # the same prompts, one backend each
        passes[f"sdpa_{backend}"] = synth_pass(args, convs, backend)
    if args.fuse_ab:  # --fuse-target off and on, each a whole pass (its load and graphs included)
        passes["unfused"] = synth_pass(args, convs, fuse=False)
        passes["fused"] = synth_pass(args, convs, fuse=True)
    if args.refill_ab:  # A-B-A with the first pass: rows refilled as their answers end, then the default again
        passes["rows_refilled"] = synth_pass(args, convs, refill=True)
        passes["default_after_refill"] = synth_pass(args, convs)
    if args.shrink_ab:  # A-B-A with the first pass: batches that shrink, then keep every row again (the default)
        passes["rows_shrunk"] = synth_pass(args, convs, shrink=True)
        passes["rows_kept"] = synth_pass(args, convs)
    if args.compile_ab:  # A-B-A with the first pass: compiled layer by layer, then eager again (the default)
        passes["compiled"] = synth_pass(args, convs, compile=True)
        passes["eager_again"] = synth_pass(args, convs)
    if args.flash_ab:  # A-B-A with the first pass (flash decoding where it runs): masked SDPA, then the default again
        passes["masked"] = synth_pass(args, convs, flash=False)
        passes["default_again"] = synth_pass(args, convs)
    if args.magpie_cap_ab:  # A-B-A with the first pass: user turns capped, then the default again
        passes[f"magpie_cap_{args.magpie_cap_ab}"] = synth_pass(args, convs, magpie_max_tokens=args.magpie_cap_ab)
        passes["default_after_cap"] = synth_pass(args, convs)
    if args.batch_ab:  # A-B-..-A with the first pass: each batch size, then --batch-size's again
        for size in map(int, args.batch_ab.split(",")):
            passes[f"batch_{size}"] = synth_pass(args, convs, batch_size=size)
        passes["batch_again"] = synth_pass(args, convs)

    target = load_target(args.target, device=args.device, dtype=args.dtype)
    base = single_stream(
        target, [c["messages"][0]["content"] for c in convs[: args.baseline_prompts]], args.max_new_tokens
    )
    questions = [c["messages"][0]["content"] for c in convs]
    decode = None
    if args.profile is not None:  # one batch of --batch-size rows (the prompts repeated if fewer)
        rows = (questions * args.batch_size)[: args.batch_size]
        decode = profile_decode(target, rows, args.profile_steps, args.profile)
        if args.decode_compiled or args.flash_ab:  # each variant's step beside the eager masked one
            variants = {"eager": decode}
            for scope in ("forward", "layers") if args.decode_compiled else ():
                variants[f"compiled_{scope}"] = profile_decode(target, rows, args.profile_steps, args.profile, scope)
            if args.flash_ab:
                variants["flash"] = profile_decode(target, rows, args.profile_steps, args.profile, flash=True)
                variants["flash_compiled_layers"] = profile_decode(
                    target, rows, args.profile_steps, args.profile, "layers", flash=True
                )
            decode = variants
    synth_rate = passes["synth"]["tok_per_s"]
    result = {
        "bench": "synth",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "hardware": torch.cuda.get_device_name(target.device)
        if target.device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "target": args.target,
        "device": str(target.device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "prompts": args.magpie or len(convs),
        "magpie": bool(args.magpie),
        "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size,
        "cache": args.cache,
        "generator": args.generator,
        **passes,
        "single_stream_generate": base,
        "decode_profile": decode,
        "speedup": round(synth_rate / base["tok_per_s"], 2),
        "bar": args.bar,
    }
    result["passes_bar"] = result["speedup"] >= args.bar
    text = json.dumps(result, indent=2)
    print(text)
    args.out_json.write_text(text + "\n")


if __name__ == "__main__":
    main()

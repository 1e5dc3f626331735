"""`draftsmith synth`: conversations answered by the target itself (on-policy training data).

    load the prompts (any format `prepare` reads, or a named source) or plan N Magpie self-prompts,
    or select them from the sources of a mix file (`synth/mix.py`, which also writes mix.json)
    -> de-duplicate -> skip the ids already in the output -> take this rank's shard
    -> generate chunk by chunk, turn by turn (local HF batches or a remote server)
    -> append each finished conversation as one JSONL line; rank 0 merges torchrun parts.

Output lines are OpenAI `messages` records that `prepare` reads unchanged, plus `id` (stable:
source file stem and id, or Magpie index, plus the seed), `key` (the resume key: a hash of the
prompt, the generation settings, the seed and the model), `source_id`, `model`, `generation`,
`generated_tokens` and `ended` (why a conversation stopped before its last user turn, or null).
Files and resume rules: `synth/output.py`. The run's own files (progress.json, run.yaml, mix.json)
and its lock live in `OUT.synth/` beside the output, which is locked while synth runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from draftsmith.config import write_run_record
from draftsmith.data.chat import check_template_options
from draftsmith.data.sources import MIX_FILE, read_source, synth_folder
from draftsmith.errors import UserError
from draftsmith.fsutil import check_output, mark_output, output_lock
from draftsmith.progress import Progress
from draftsmith.runtime.sampling import Sampling
from draftsmith.synth import output
from draftsmith.synth.config import SynthConfig
from draftsmith.synth.filters import dedupe, prompt_key
from draftsmith.synth.mix import mix_inputs, plan_from
from draftsmith.synth.remote import ServerUnreachable
from draftsmith.synth.turns import Backend, Work, synthesize
from draftsmith.torchrun import dist_env


def shard_of(conv_id: str, world: int) -> int:
    """The rank that owns a conversation: a hash of its id, so that every rank decides alone
    and the same way, whatever the other ranks have already written."""
    return int.from_bytes(hashlib.sha256(conv_id.encode()).digest()[:8], "little") % world


def load_work(cfg: SynthConfig) -> tuple[list[Work], int]:
    """The conversations to produce, and how many duplicate prompts were dropped."""
    system = [{"role": "system", "content": cfg.system}] if cfg.system else []
    if cfg.magpie is not None:
        if cfg.prompts is not None:
            raise UserError("give either a prompt file or --magpie N, not both")
        return [
            Work(f"magpie:{i}:s{cfg.seed}", f"magpie:{i}", system, [None] * cfg.turns) for i in range(cfg.magpie)
        ], 0
    if cfg.prompts is None:
        raise UserError(
            "give a prompt file (any format `prepare` reads), or --magpie N to let the target write the prompts"
        )
    source = read_source(cfg.prompts, cfg.format)
    convs, n_dup = dedupe(source.convs)
    works = []
    for conv in convs:
        msgs = conv["messages"]
        head = [m for m in msgs[:1] if m["role"] == "system"] or system
        users = [m["content"] for m in msgs if m["role"] == "user"]
        if users:
            works.append(Work(f"{source.name}:{conv['id']}:s{cfg.seed}", conv["id"], head, users))
    if not works:
        raise UserError(
            f"{cfg.prompts}: no user turns to answer; synth needs prompts or conversations with user messages"
        )
    return works[: cfg.limit] if cfg.limit else works, n_dup


def build_backend(cfg: SynthConfig, world: int, local_rank: int, magpie: bool = False) -> tuple[Backend, Any]:
    """The backend, and the tokenizer whose chat template Magpie uses (None when not needed)."""
    if cfg.endpoint and cfg.generator == "vllm":
        raise UserError("--endpoint sends the prompts to a server; --generator vllm runs vLLM here: give one of them")
    if cfg.endpoint:
        from draftsmith.synth.remote import RemoteBackend
        from draftsmith.target import load_tokenizer

        backend = RemoteBackend(cfg.endpoint, cfg.model, cfg.concurrency, cfg.timeout, cfg.retries, cfg.backoff)
        return backend, load_tokenizer(cfg.target, cfg.chat_template) if magpie else None
    if cfg.generator == "vllm":
        from draftsmith.synth.vllm import VllmBackend

        if world > 1 or cfg.shard != "none" or cfg.device:
            raise UserError(
                "synth --generator vllm runs one vLLM engine on its own device: drop torchrun, --shard and --device"
            )
        backend = VllmBackend(cfg.target, cfg.chat_template, cfg.batch_size, cfg.dtype, cfg.completion)
        return backend, backend.tokenizer
    from draftsmith.synth.local import LocalBackend
    from draftsmith.target import load_target

    device = cfg.device
    if device is None and world > 1 and torch.cuda.is_available():
        device = f"cuda:{local_rank}"
    target = load_target(cfg.target, device=device, dtype=cfg.dtype, chat_template=cfg.chat_template, shard=cfg.shard)
    backend = LocalBackend(
        target,
        cfg.batch_size,
        cfg.cache,
        cfg.generator,
        cfg.completion,
        cfg.fuse_target,
        cfg.shrink_batches,
        cfg.compile_target,
        cfg.flash_decode,
        cfg.refill_batches,
    )
    return backend, target.tokenizer


def resume_key(work: Work, generation: dict[str, Any], model: str) -> str:
    """What makes a conversation the same one on a rerun: a hash of its id, its system and user
    turns as given (before generation), the generation settings with the seed, and the model (a
    local target's files' content id)."""
    blob = json.dumps([work.id, work.messages, work.users, generation, model], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def repeat_key(work: Work, settings: dict[str, Any], model: str) -> str | None:
    """What makes a conversation a repeat of one answered before under another id (the same
    prompts in a file of another name): a hash of its prompt as de-duplication compares it
    (`filters.prompt_key`), the generation settings with the seed, and the model. None for
    Magpie, whose user turns the target writes."""
    if None in work.users:
        return None
    turns = [*work.system, *({"role": "user", "content": u} for u in work.users)]
    blob = json.dumps([prompt_key(turns), settings, model], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def resume_plan(out: Path, done: output.Done, works: list[Work], keys: dict[str, str]) -> set[str]:
    """The ids of `works` already in the output files with the same key: kept, or dropped (a
    dropped one under another key, made with other settings, is tried again). A kept line
    written before resume keys, or a kept id whose prompt or settings changed, is refused:
    resuming would mix two versions in one file."""
    fix = f"give synth another --out (prepare still reads {out} as it is)"
    if any(key is None for key in done.kept.values()):
        raise UserError(
            f"{out} was written by an older draftsmith, without resume keys, so a rerun cannot tell "
            f"which of its conversations match this run; {fix}"
        )
    changed = [w.id for w in works if w.id in done.kept and done.kept[w.id] != keys[w.id]]
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise UserError(
            f"{out}: conversation {changed[0]}{more} was made from another prompt "
            f"or with other settings (the target's files, sampling, max-new-tokens, seed) than this run; {fix}, "
            "or remove those lines"
        )
    return {w.id for w in works if keys[w.id] in (done.kept.get(w.id), done.dropped.get(w.id))}


def record(work: Work, key: str, repeat: str | None, model: str, generation: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": work.id,
        "key": key,
        "repeat_key": repeat,
        "messages": work.messages,
        "source_id": work.source_id,
        "model": model,
        "generation": generation,
        "generated_tokens": work.tokens,
        "ended": work.ended,
    }


def run(cfg: SynthConfig) -> Path:
    """Synthesize with the output's folder locked for the whole run (rank 0 holds the lock for
    all ranks): a second synth writing there is refused."""
    if Path(cfg.out).is_dir():
        raise UserError(
            f"--out {cfg.out} is a folder; synth writes one JSONL file: give a path such as "
            f"{Path(cfg.out) / 'conversations.jsonl'}"
        )
    # the real path of a symbolic link; never the prompts or mix file themselves
    inputs = [cfg.prompts, cfg.mix, cfg.chat_template, *(mix_inputs(cfg.mix) if cfg.mix is not None else [])]
    out = check_output(cfg.out, "synth", inputs, folder=False)
    side = output.check_synth_folder(out)
    rank, _, _ = dist_env()
    with output_lock(side) if rank == 0 else contextlib.nullcontext():
        return write_conversations(cfg.model_copy(update={"out": out}))


def check_completion(cfg: SynthConfig, magpie: bool) -> None:
    """Completion mode continues raw prompts on the local backend: no template, no system turn."""
    check_template_options(cfg.chat_template, cfg.completion)
    if not cfg.completion:
        return
    for given, what in (
        (magpie, "--magpie (self-prompting needs a chat template)"),
        (cfg.endpoint, "--endpoint (a server's chat API applies its own template)"),
        (cfg.system, "--system (a base model has no system turn)"),
    ):
        if given:
            raise UserError(f"--completion cannot be combined with {what}")


def write_conversations(cfg: SynthConfig) -> Path:
    out = Path(cfg.out)
    rank, world, local_rank = dist_env()
    plan = plan_from(cfg) if cfg.mix is not None else None  # a bad mix stops here, before any output
    works, n_dup = (plan.works, 0) if plan is not None else load_work(cfg)
    magpie = any(None in w.users for w in works)
    check_completion(cfg, magpie)
    if world > 1 and not torch.distributed.is_initialized():
        # only for the final barrier: generation itself never communicates
        torch.distributed.init_process_group("gloo", timeout=timedelta(days=7))
    out.parent.mkdir(parents=True, exist_ok=True)
    kept_file, drop_file = out, output.dropped_path(out)
    if world > 1:
        kept_file, drop_file = output.part_path(kept_file, rank), output.part_path(drop_file, rank)
    for path in (kept_file, drop_file):
        output.repair_tail(path)
    sampling = Sampling(cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_new_tokens, cfg.seed)
    # a user turn's own cap: a batch decodes until its longest row stops, and a few self-prompts
    # that never close their turn hold every row of theirs to the cap (experiments/LOG.md 2026-12-06)
    user_sampling = Sampling(
        cfg.magpie_temperature, cfg.magpie_top_p, cfg.top_k, cfg.magpie_max_tokens or cfg.max_new_tokens, cfg.seed
    )
    magpie_settings = {"temperature": user_sampling.temperature, "top_p": user_sampling.top_p}
    if cfg.magpie_max_tokens is not None:  # only then: the keys of earlier outputs stay valid
        magpie_settings["max_tokens"] = cfg.magpie_max_tokens
    generation = {
        "backend": "remote" if cfg.endpoint else "vllm" if cfg.generator == "vllm" else "local",
        **sampling.to_dict(),
        "magpie": magpie_settings if magpie else None,
    }
    settings = {**generation, "keep_thinking": cfg.keep_thinking, "keep_unfinished": cfg.keep_unfinished}
    if cfg.completion or cfg.chat_template:  # only then: the keys of earlier outputs stay valid
        template = cfg.chat_template and hashlib.sha256(Path(cfg.chat_template).read_bytes()).hexdigest()[:16]
        settings.update(completion=cfg.completion, chat_template=template)
    from draftsmith.target import files_id

    # a server's URL and model name can change between a run and its resume (a restart, another
    # port); each line records the model that answered, and the key holds the local target only: its
    # files' content id, so a copy at another path is the same target and one rewritten in place
    # (a fine-tune saved over it) another, whose kept answers are refused as done by other weights
    model = "" if cfg.endpoint else files_id(cfg.target)
    keys = {w.id: resume_key(w, settings, model) for w in works}
    repeats = {w.id: repeat_key(w, settings, model) for w in works}
    found = output.done_ids(out)
    done = resume_plan(out, found, works, keys)
    answered = {w.id for w in works if w.id not in done and repeats[w.id] in found.repeats}  # under another id
    works, n_dup = [w for w in works if w.id not in answered], n_dup + len(answered)
    mine = [w for w in works if shard_of(w.id, world) == rank]
    pending = sorted((w for w in mine if w.id not in done), key=lambda w: len(w.users[0] or ""))
    # the target first: a target no backend can run is refused before anything is written
    backend, tokenizer = build_backend(cfg, world, local_rank, magpie) if pending else (None, None)
    side = synth_folder(out)
    if rank == 0:
        mark_output(side, "synth")
        write_run_record(side, cfg)
        if plan is not None:
            plan.write(out, cfg.seed)

    chunk = cfg.concurrency * 4 if cfg.endpoint else cfg.batch_size * 4
    totals: Counter[str] = Counter()
    with Progress("synth", side if rank == 0 else None, total=len(mine), unit="conversations") as progress:
        progress.skip(len(mine) - len(pending))
        progress.set(duplicate_prompts=n_dup)
        if backend is not None and rank == 0:
            print(f"[synth] {backend.name}: {backend.decoding}", file=sys.stderr, flush=True)
        if plan is not None:
            plan.track(mine)
            progress.set(**plan.count_done([w.id for w in mine if w.id in done]))
        for start in range(0, len(pending), chunk):
            try:
                batch = synthesize(
                    backend,
                    pending[start : start + chunk],
                    sampling,
                    user_sampling,
                    tokenizer,
                    cfg.keep_thinking,
                    cfg.keep_unfinished,
                    found.users,
                )
            except ServerUnreachable as e:
                raise ServerUnreachable(
                    f"{e}\n{totals['kept']} conversations written by this run (and {len(mine) - len(pending)} "
                    f"before) are kept in {out}; rerun the same command to resume"
                ) from None
            counts: Counter[str] = Counter()
            written = 0
            for w in batch:
                if w.answered:
                    written += output.write(kept_file, record(w, keys[w.id], repeats[w.id], backend.name, generation))
                    counts["kept"] += 1
                    counts["truncated"] += w.ended is not None  # a later turn dropped: the answered ones kept
                    counts["unfinished"] += w.unfinished > 0  # an answer cut by --max-new-tokens, kept
                else:
                    output.write(
                        drop_file,
                        {
                            "id": w.id,
                            "key": keys[w.id],
                            "repeat_key": repeats[w.id],
                            "source_id": w.source_id,
                            "reason": w.ended,
                            "rejected": w.rejected[:2000],
                        },
                    )
                    counts[f"dropped_{w.ended}"] += 1
            totals.update(counts)
            if plan is not None:
                progress.set(**plan.count_done([w.id for w in batch]))
            if backend.capture_seconds:  # the local engine's CUDA graphs, in the time above
                progress.set(graph_capture_s=round(backend.capture_seconds, 2))
            progress.set(decoding=backend.decoding)  # as it stands after the batch (a lever may have failed)
            progress.advance(len(batch), tokens=sum(w.tokens for w in batch), bytes_written=written, **counts)

    if world > 1:
        torch.distributed.barrier()  # every rank's part files are complete
    if rank == 0:
        for path in (out, output.dropped_path(out)):
            output.merge_parts(path)
        details = ", ".join(f"{k} {v}" for k, v in sorted(totals.items()))
        who = "this run" if world == 1 else "rank 0"
        print(
            f"[synth] {out}: {len(output.read_records(out))} conversations in the file; {who}: {details or 'nothing to do'}, "
            f"duplicate prompts skipped {n_dup}",
            file=sys.stderr,
        )
        if plan is not None:
            plan.write(out, cfg.seed, finished=True)
            print(f"[synth] {side / MIX_FILE}: what came from where, what was dropped and why", file=sys.stderr)
        dropped = {k: v for k, v in totals.items() if k.startswith("dropped_")}
        if dropped and not totals["kept"]:
            hint = (
                " (pass --keep-unfinished to keep answers cut by --max-new-tokens, or raise it)"
                if "dropped_no_eot" in dropped
                else ""
            )
            raise UserError(
                f"synth: every answer of this run was dropped ({details}); nothing was added to {out}. "
                f"The rejected answers and their reasons are in {output.dropped_path(out)}{hint}"
            )
    return out

"""`draftsmith train`: train an EAGLE-3 drafter, offline from a hidden-state store (`--hidden`)
or online with the target running inside the step.

    OUT/drafter/            the best drafter by validation τ (what `eval` and `export` take;
                            they also accept OUT itself)
    OUT/metrics.jsonl       one record per logged step (train) and per validation (val)
    OUT/metrics.png         loss and accuracy per TTT step, and τ, over training
    OUT/tensorboard/        the same metrics for TensorBoard
    OUT/checkpoints/        resumable checkpoints (`--resume`)
    OUT/vocab.safetensors   the draft vocab used; OUT/run.yaml, OUT/progress.json

Under `torchrun` (WORLD_SIZE > 1) each rank trains on its share of the packed rows with DDP
(default) or FSDP2; in online mode every rank runs its own target replica.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from draftsmith.config import RUN_RECORD, absolute_paths, changed_options, load_yaml_mapping, write_run_record
from draftsmith.data.dataset import TokenizedDataset, check_tokenizer, check_trainable, load_dataset, split_indices
from draftsmith.data.vocab import build_vocab, draft_vocab_size, load_vocab, save_vocab, token_counts
from draftsmith.draft.methods import METHODS
from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
from draftsmith.draft.shape import default_backend, eager_attention_bytes
from draftsmith.errors import UserError, from_os_error
from draftsmith.fsutil import LOCK_FILE, check_output, human_bytes, mark_output, output_lock
from draftsmith.layers import resolve_aux_layers, validate_layers
from draftsmith.progress import Progress
from draftsmith.runtime.capture import supports_flex
from draftsmith.runtime.head import check_output_head, output_head
from draftsmith.target import Target, available_memory, check_model_memory, default_device, load_target
from draftsmith.torchrun import dist_env
from draftsmith.train.batching import OfflineSource, OnlineSource
from draftsmith.train.checkpointing import CKPT_DIR, latest_checkpoint, resume_checkpoint
from draftsmith.train.config import TrainConfig, requested_layers
from draftsmith.train.loop import Env, TrainData, Trainer
from draftsmith.train.metrics import METRICS_FILE, MetricsLog, plot_metrics, truncate_metrics
from draftsmith.train.objectives import OBJECTIVES, eagle3_config


def setup_env(cfg: TrainConfig) -> Env:
    """One process, or one rank of a torchrun job (nccl on GPU, gloo on CPU)."""
    _, world, local_rank = dist_env()
    if world == 1:
        return Env(device=torch.device(cfg.device) if cfg.device else default_device())
    use_cuda = torch.cuda.is_available() and (cfg.device or "cuda").startswith("cuda")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return Env(rank=dist.get_rank(), world=world, device=device, fsdp=cfg.distributed == "fsdp")


def check_out(cfg: TrainConfig) -> Path | None:
    """What --out holds against --resume and --overwrite, checked before anything is written;
    returns the checkpoint to resume from, if any."""
    out = Path(cfg.out)
    if cfg.resume and cfg.overwrite:
        raise UserError("--resume continues the run in --out and --overwrite replaces it: give one of them")
    if cfg.resume:
        if not out.is_dir() or not any(p.name != LOCK_FILE for p in out.iterdir()):  # (run's lock makes the folder)
            raise UserError(f"--resume: {out} holds no training run to continue; leave out --resume to start one")
        found = latest_checkpoint(out)
        if found is None:
            print(f"[train] --resume: {out} has no checkpoint yet; starting from step 0", flush=True)
        return found
    if ((out / CKPT_DIR).exists() or (out / METRICS_FILE).exists()) and not cfg.overwrite:
        raise UserError(
            f"{out} already holds a training run; pass --resume to continue it or --overwrite to start over"
        )
    return None


def resumed_options(cfg: TrainConfig) -> TrainConfig:
    """--resume continues a run as it was started: the options its run.yaml records stand for
    those not given now, and a given option whose value differs from the record is refused,
    naming it, before anything is written."""
    path = Path(cfg.out) / RUN_RECORD
    if not path.exists():  # stopped before it was written: nothing to compare
        return cfg
    recorded = load_yaml_mapping(path, "--resume: the run's record").get("config")
    if not isinstance(recorded, dict):
        raise UserError(
            f"--resume: {path} records no options ('config:'); start over with --overwrite or another --out"
        )
    kept = {"resume", "overwrite", "out"}
    # paths compared absolute: given here, or recorded relative by a draftsmith before issue 55
    recorded = absolute_paths(type(cfg), recorded)
    given = type(cfg).model_validate(absolute_paths(type(cfg), cfg.model_dump(mode="json")))
    differ = {k: v for k, v in changed_options(given, recorded, kept).items() if k in cfg.model_fields_set}
    if differ:
        listed = ", ".join(f"--{k.replace('_', '-')} {now} (the run's: {was})" for k, (was, now) in differ.items())
        raise UserError(
            f"--resume: {cfg.out} was made with other options: {listed}. --resume continues the run as it "
            f"was started (its checkpoints hold that schedule and optimizer): leave those options out "
            f"({path} gives them), or start a new run with --overwrite or another --out"
        )
    fields = type(cfg).model_fields
    record = {type(cfg).renamed.get(k, k): v for k, v in recorded.items()}
    return type(cfg).model_validate(
        {
            **cfg.model_dump(),
            **{k: v for k, v in record.items() if k in fields and k not in kept and k not in cfg.model_fields_set},
        }
    )


def start_out(cfg: TrainConfig, env: Env) -> None:
    """Make the output folder, once everything is validated: --overwrite removes the old run now."""
    out = Path(cfg.out)
    if env.main and cfg.overwrite and out.exists():
        for old in out.iterdir():  # all but the lock this run holds
            if old.name == LOCK_FILE:
                continue
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()
    out.mkdir(parents=True, exist_ok=True)
    if env.main:
        mark_output(out, "train")
    if env.world > 1:
        dist.barrier()


def resolve_vocab(
    cfg: TrainConfig, dataset: TokenizedDataset, dataset_rows: list[int], vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if cfg.vocab is not None:
        d2t, t2d = load_vocab(cfg.vocab)
        if t2d.numel() != vocab_size:
            raise UserError(
                f"--vocab {cfg.vocab}: made for a vocab of {t2d.numel()} tokens, but the target has {vocab_size}"
            )
        return d2t, t2d
    size = draft_vocab_size(cfg.draft_vocab_size, vocab_size)
    return build_vocab(token_counts(dataset, vocab_size, dataset_rows), size)  # counts [V]


def capture_attention(choice: str, target: Target) -> str | None:
    """--capture-attention as the attention implementation `capture` takes (None: the model's own)."""
    flex = supports_flex(target.model)
    if choice == "flex" and not flex:
        raise UserError(
            f"--capture-attention flex: transformers runs {type(target.model).__name__} without flex_attention; "
            "use --capture-attention dense"
        )
    if choice == "flex" or (choice == "auto" and flex and target.device.type == "cuda"):
        return "flex_attention"
    return None


def source_summary(source: OnlineSource | OfflineSource, cfg: TrainConfig) -> str:
    """Where the run's hidden states come from, for its first log line."""
    if isinstance(source, OfflineSource):
        return f"offline from {cfg.hidden}"
    attention = source.attention or "the model's own"
    layout = "packed" if source.packed else "padded" if source.padded else "one-sample"
    compiled = ", compiled" if source.compiled is not None else ""
    return f"online, {layout} capture with {attention} attention{compiled}"


def step_summary(cfg: TrainConfig, device: torch.device) -> str:
    """The drafter step this run takes (`--compile-step` resolved), for its first log line."""
    if not cfg.compile_step:
        return "dynamic"
    return "static, compiled" if device.type == "cuda" else "static, eager"


def build_source(
    cfg: TrainConfig, target: Target, dataset: TokenizedDataset
) -> tuple[OnlineSource | OfflineSource, list[int], list[int]]:
    """The sample source, the aux layer ids, and the dataset rows of the source's samples."""
    max_len = min(cfg.max_len, cfg.batch_tokens)
    n_layers = target.info.num_layers
    wanted = requested_layers(cfg, n_layers)
    count = METHODS[cfg.method].aux_count  # EAGLE-3 reads three layers, DFlash any number
    if cfg.hidden is None:
        aux_layer_ids = resolve_aux_layers(wanted, n_layers, count)
        source = OnlineSource(
            dataset,
            target.model,
            aux_layer_ids,
            max_len,
            token_budget=max(cfg.batch_tokens, max_len),
            attention=capture_attention(cfg.capture_attention, target),
            compile=cfg.compile_capture,
        )
        return source, aux_layer_ids, list(range(len(dataset)))
    from draftsmith.data.store import StoreReader, check_store_matches, check_store_ready, dataset_rows

    check_store_ready(cfg.hidden, cfg.partial_store)  # not still being written, not incomplete
    check_store_matches(cfg.hidden, dataset, target.info)  # made from this dataset, for this target
    reader = StoreReader(cfg.hidden)
    reader.check_files()  # a missing, truncated or (in a small store) corrupt sample, before anything is written
    aux_layer_ids = [int(k) for k in reader.meta["aux_layer_ids"]]
    try:  # a store captured for another method's drafter (DFlash reads any number of layers)
        validate_layers(aux_layer_ids, n_layers, count)
    except UserError as e:
        raise UserError(f"store {cfg.hidden}: {e}; extract a store for --method {cfg.method}") from None
    if wanted is not None and validate_layers(wanted, n_layers, count) != aux_layer_ids:
        asked = f"--aux-layer-ids {wanted}" if cfg.aux_layer_ids else f"--paper-settings' target layers {wanted}"
        raise UserError(
            f"{asked} disagrees with the store {cfg.hidden}, captured at layers {aux_layer_ids}; extract a store at "
            f"these layers (extract --aux-layer-ids {','.join(map(str, wanted))}), or train online"
        )
    if reader.hidden_size != target.info.hidden_size:
        raise UserError(
            f"store {cfg.hidden} has hidden size {reader.hidden_size}, target {cfg.target!r} has {target.info.hidden_size}: wrong target?"
        )
    if len(reader) == 0:
        raise UserError(f"store {cfg.hidden} holds no samples yet; run `draftsmith extract` first")
    return OfflineSource(reader, max_len), aux_layer_ids, dataset_rows(cfg.hidden, reader.sample_ids, dataset)


def build_drafter(
    target: Target, aux_layer_ids: list[int], d2t: torch.Tensor, t2d: torch.Tensor, cfg: TrainConfig
) -> torch.nn.Module:
    """A fresh drafter of --method (train/objectives.py), shaped by the target and `cfg`."""
    return OBJECTIVES[cfg.method].drafter(target, aux_layer_ids, d2t, t2d, cfg)


def build_trainer(cfg: TrainConfig) -> Trainer:
    """Everything before the first step: the environment, the target and its checked head, the
    data source and split, the draft vocab, the drafter (resumed from --out's last checkpoint with
    --resume), and the output folder with its run.yaml and vocab. The target is loaded here (a
    pipeline's `shared_targets` hands back the one it has)."""
    env = setup_env(cfg)
    if cfg.optimizer == "muon" and env.fsdp:
        raise UserError(
            "--optimizer muon works on whole weight matrices and cannot run under --distributed fsdp; use ddp or adamw"
        )
    out = Path(cfg.out)
    resume_from = check_out(cfg)
    if cfg.resume:
        cfg = resumed_options(cfg)
    on_gpu = env.device.type == "cuda"  # what the GPU defaults resolve to, recorded in run.yaml as such
    training = OBJECTIVES[cfg.method]
    # (a step without a static, compiled form: off, so that its log line, its run.yaml and a --resume agree)
    defaults = {"autocast": on_gpu, "compile_step": on_gpu and training.compiled_step}
    cfg = cfg.model_copy(update={k: v for k, v in defaults.items() if getattr(cfg, k) is None})
    torch.manual_seed(cfg.seed)

    target = load_target(cfg.target, env.device, cfg.dtype, shard=cfg.shard)
    head = output_head(target.model)  # the teacher: the target's own output path,
    check_output_head(target.model, head)  # checked against its logits (a UserError, before any output)
    dataset = load_dataset(cfg.dataset_dir)
    check_tokenizer(dataset, target.tokenizer, cfg.target)  # tokenized with this target's vocabulary
    source, aux_layer_ids, dataset_rows = build_source(cfg, target, dataset)
    train_idx, val_idx = split_indices(len(source), cfg.val_fraction, cfg.val_seed)
    first = training.first_drafted  # the position of a sample's first drafted token (train/objectives.py)
    rows = [dataset_rows[i] for i in train_idx]
    check_trainable(dataset, rows, min(cfg.max_len, cfg.batch_tokens), first, cfg.loss_tokens == "all")
    d2t, t2d = resolve_vocab(cfg, dataset, [dataset_rows[i] for i in train_idx], target.info.vocab_size)
    shape = lambda: Eagle3Drafter(eagle3_config(target, aux_layer_ids, d2t, cfg))  # noqa: E731 (its size, on meta)
    check_model_memory(shape, torch.device("cpu"), "the drafter", "lower --intermediate-size or --num-layers")
    drafter = training.drafter(target, aux_layer_ids, d2t, t2d, cfg)
    say = (lambda line: print(line, flush=True)) if env.main else (lambda line: None)
    checkpoint = resume_checkpoint(out, drafter, target.info.fingerprint, say) if resume_from is not None else None

    backend = default_backend(env.device) if cfg.attention == "auto" else cfg.attention
    if training.ttt and backend == "eager":
        check_eager_memory(cfg, drafter.config, env.device, int(dataset.lengths.sum()))
    start_out(cfg, env)  # all validated: from here on the run writes
    if env.main:
        if not (cfg.resume and (out / RUN_RECORD).exists()):  # a resumed run keeps the record it started with
            write_run_record(out, cfg)
        save_vocab(out / "vocab.safetensors", d2t, t2d)

    objective = training.objective(drafter.to(env.device), head.to(env.device), cfg, backend)
    meta = {
        "target": target.info.to_dict(),
        "mode": "online" if cfg.hidden is None else "offline",
        "data": str(cfg.dataset_dir),
        "hidden": str(cfg.hidden) if cfg.hidden else None,
        "method": cfg.method,
        "depth": cfg.depth,
        "trained_embedding": cfg.train_embedding,  # export then writes the drafter's own
        "loss": cfg.loss if cfg.loss != "lk" else f"lk (eta {cfg.lk_eta:g})",
        "train_samples": len(train_idx),
        "val_samples": len(val_idx),
    }
    if dataset.meta.get("mix"):
        meta["data_mix"] = dataset.meta["mix"]  # synth --mix's sources and licenses, for the model card
    if env.main:  # how this run trains, where the GPU and CPU defaults differ
        print(
            f"[train] {len(train_idx)} training / {len(val_idx)} validation samples; {source_summary(source, cfg)}; "
            f"drafter step {step_summary(cfg, env.device)}, TTT attention {objective.attention}, "
            f"autocast {'bf16' if cfg.autocast else 'off'}" + (f", loss {meta['loss']}" if cfg.loss != "ce" else ""),
            flush=True,
        )
    log = MetricsLog(out, enabled=env.main)
    trainer = Trainer(cfg, env, objective, TrainData(source, train_idx, val_idx), log, meta)
    if checkpoint is not None:
        trainer.resume(*checkpoint)
        if trainer.pos.step >= trainer.total:
            say(f"[train] --resume: {out} finished at step {trainer.total} already; nothing to train")
    if cfg.resume and env.main:
        truncate_metrics(out, trainer.pos.step)  # records after the checkpoint are logged again
    return trainer


def check_eager_memory(cfg: TrainConfig, drafter: DrafterConfig, device: torch.device, data_tokens: int) -> None:
    """Refuse, before anything is written, a run whose eager TTT attention (the CPU's; O(T²)
    scores) would not fit in the memory free on `device`, naming the largest --batch-tokens that
    does: the kernel would otherwise kill the process mid-step, with nothing in the log. A row
    holds at most `data_tokens` (the dataset's), however large --batch-tokens is."""
    free = available_memory(device)
    heads, layers = drafter.num_attention_heads, drafter.num_layers
    row = min(cfg.batch_tokens, data_tokens)

    def need(tokens: int) -> int:
        return eager_attention_bytes(tokens, heads, cfg.depth, layers)

    if free is None or need(row) <= 0.8 * free:
        return
    fits = next((t for t in (2**i for i in range(16, 6, -1)) if t < row and need(t) <= 0.5 * free), None)
    hint = f"give --batch-tokens {fits} (~{human_bytes(need(fits))})" if fits else "give a smaller --depth"
    on_gpu = " or --attention flex (O(T) memory)" if device.type == "cuda" else ""
    raise UserError(
        f"--batch-tokens {cfg.batch_tokens}: the eager TTT attention keeps ~{human_bytes(need(row))} of "
        f"[{heads} heads, T, T] scores over rows of {row} tokens at --depth {cfg.depth} and {layers} layer(s), "
        f"and {device} has {human_bytes(free)} free; {hint}{on_gpu}"
    )


def run(cfg: TrainConfig) -> Path:
    """Train (see the module docstring for what --out holds), --out locked against a second
    writer for the whole run (rank 0 holds the lock for all ranks)."""
    main = dist_env().rank == 0
    check_output(
        cfg.out, "train", [cfg.dataset_dir, cfg.hidden, cfg.vocab, cfg.target], cfg.overwrite
    )  # before the lock writes
    with output_lock(Path(cfg.out)) if main else contextlib.nullcontext():
        trainer = build_trainer(cfg)
        env, out = trainer.env, trainer.out
        progress = Progress("train", out, total=trainer.total, unit="steps") if env.main else None
        try:
            if progress is not None:
                with progress:
                    progress.skip(trainer.pos.step)
                    trainer.run(progress)
            else:
                trainer.run(None)
        except OSError as e:  # a full disk: exit 4, what to free, and how to go on
            raise from_os_error(
                e,
                "the checkpoints, metrics and published drafter written before are kept: rerun "
                "with --resume to continue from the last checkpoint",
            ) from None
        finally:
            trainer.log.close()
        if env.main:
            plot_metrics(out)
    if env.world > 1:
        dist.barrier()
    return out

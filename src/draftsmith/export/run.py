"""`draftsmith export`: a drafter folder -> a serving-ready folder for vLLM or SGLang.

load the drafter (native, exported or third-party)
check its method is served by --engine (`Method.engines`) and has a layout for --format (`WRITERS`)
the layout's writer: its checks (3 capturable layers, norms, vocab), config.json, model.safetensors
  and the model card (EAGLE-3 and P-EAGLE: eagle.py or speculators.py; DFlash: dflash.py)
write them into a temporary folder, reload that folder, compare logits (the writer's reload check)
rename the folder into place (nothing is left at --out on any error)
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

from draftsmith.config import write_run_record
from draftsmith.draft.checkpoint import load_drafter, save_file
from draftsmith.draft.importer import import_drafter
from draftsmith.draft.layouts import arch_options, check_vocab
from draftsmith.draft.methods import check_depth, method_of, serving_refusal, trained_depth
from draftsmith.draft.model import Eagle3Drafter
from draftsmith.draft.peagle import placeholder_hidden
from draftsmith.errors import UserError
from draftsmith.export import dflash, eagle, sglang, speculators
from draftsmith.export.card import model_card, serving_shape
from draftsmith.export.config import ExportConfig
from draftsmith.export.writer import Files, Writer
from draftsmith.fsutil import atomic_output_dir, atomic_write_json, atomic_write_text
from draftsmith.layers import to_engine
from draftsmith.target import DTYPES


def read_report(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8 text (a binary file)
        raise UserError(f"--eval-report {path}: cannot be read as JSON ({e})") from None
    if not isinstance(report, dict) or "tau" not in report:
        raise UserError(
            f"--eval-report {path}: not an eval report.json (it has no 'tau'); pass the one `draftsmith eval` wrote"
        )
    if "depth" not in report and "k" in report:  # a report written before `k` was renamed `depth`
        report["depth"] = report["k"]
    return report


def weight_dtype(model: Eagle3Drafter, name: str) -> torch.dtype:
    return model.fc.weight.dtype if name == "auto" else DTYPES[name]


@torch.no_grad()
def reload_check(model: Eagle3Drafter, folder: Path, dtype: torch.dtype) -> None:
    """The written folder must import back to the same layer ids, options, logits and next hidden state."""
    reloaded, record = import_drafter(folder)
    expected = copy.deepcopy(model).to(dtype).float().eval()
    if record["meta"]["needs_target_embeddings"]:  # exported without embeddings: the engines share the target's
        reloaded.load_target_embeddings(expected.embed_tokens.weight)
    cfg = model.config
    if reloaded.config.aux_layer_ids != cfg.aux_layer_ids or arch_options(reloaded.config) != arch_options(cfg):
        raise RuntimeError(f"export reload changed the config: {reloaded.config} != {cfg}")
    g = torch.Generator().manual_seed(0)
    aux = torch.randn(1, 8, len(cfg.aux_layer_ids) * cfg.target_hidden_size, generator=g)  # [1, 8, n_aux*H_t]
    ids = torch.randint(0, cfg.vocab_size, (1, 8), generator=g)
    pos = torch.arange(8)[None]
    # (logits [1, 8, draft_vocab], next hidden [1, 8, H]): norm_output only shows in the second
    got, want = reloaded(reloaded.project(aux), ids, pos), expected(expected.project(aux), ids, pos)
    if (reloaded.config.method, reloaded.config.ptd_token_id) != (cfg.method, cfg.ptd_token_id):
        raise RuntimeError(f"export reload changed the method: {reloaded.config} != {cfg}")
    if expected.mask_hidden is not None:  # and the parallel slots' input (P-EAGLE)
        got, want = (*got, placeholder_hidden(reloaded)), (*want, placeholder_hidden(expected))
    same = all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    if not same or not torch.equal(reloaded.d2t, model.d2t) or not torch.equal(reloaded.t2d, model.t2d):
        diff = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
        raise RuntimeError(f"export reload gives different outputs or vocab maps (max diff {diff:.3g})")


def eagle_files(model: Eagle3Drafter, record: dict[str, Any], cfg: ExportConfig, dtype: torch.dtype) -> Files:
    """An EAGLE-3 module (EAGLE-3 or P-EAGLE) in `--format eagle` or `speculators`."""
    dcfg, target, meta = model.config, record.get("target") or {}, record.get("meta") or {}
    eagle.check_exportable(dcfg, cfg.engine, target.get("num_layers"), cfg.sglang_release)
    check_vocab(dcfg, model.d2t, model.t2d, str(cfg.drafter))
    dtype_name = str(dtype).removeprefix("torch.")
    report = read_report(cfg.eval_report)
    measured = serving_shape(report)
    chain = measured["depth"] if measured is not None and measured["mode"] == "chain" else None
    if cfg.depth:  # no deeper than it was trained for (an eval's measured chain is, eval refuses deeper)
        check_depth(dcfg, cfg.depth, trained=trained_depth(record))
    depth = cfg.depth or chain or int(meta.get("depth") or 3)  # the eval's chain length before the trained depth
    verifier = cfg.verifier or str(target.get("name") or "TARGET")
    tensors = eagle.export_tensors(model, cfg.include_embeddings, dtype)
    if cfg.engine == "sglang":
        tensors = sglang.sglang_tensors(tensors, dcfg.num_layers)
    if cfg.format == "eagle":
        config = eagle.eagle_config(dcfg, cfg.engine, dtype_name, target)
    else:
        arch = cfg.verifier_architectures or speculators.verifier_architectures(str(target.get("model_type", "llama")))
        config = speculators.speculators_config(dcfg, dtype_name, target, verifier, arch, depth)
        tensors = speculators.to_speculators_keys(tensors)
    hint = str(Path(cfg.out).absolute())
    card = model_card(
        dcfg,
        {**record, "target": {**target, "name": verifier}},
        cfg.format,
        cfg.engine,
        hint,
        depth,
        report,
        cfg.sglang_release,
    )
    ids = f"{dcfg.aux_layer_ids} draftsmith = {to_engine(dcfg.aux_layer_ids, cfg.engine)} {cfg.engine}"
    return Files(config, tensors, card, cfg.format, ids)


def without_identity_maps(
    tensors: dict[str, torch.Tensor], d2t: torch.Tensor, vocab_size: int, where: str
) -> dict[str, torch.Tensor]:
    """A drafter whose draft vocabulary is the target's whole vocabulary, in its order, ships no
    d2t/t2d: vLLM (0.26 and 0.32 alike) then has no draft_id_to_target_id to load them into and
    refuses to start (the lease of 2026-12-06 04:50), and every importer reads their absence as
    the identity. d2t [draft_vocab] holds offsets, so the identity is all zeros."""
    if d2t.numel() != vocab_size:  # a draft vocabulary smaller than the target's: the maps ship
        return tensors
    if d2t.any():
        raise UserError(
            f"{where}: its draft vocabulary is the target's whole vocabulary, reordered (d2t is not zero); the engines "
            "map draft ids only for a smaller draft vocabulary. Rebuild the vocabulary with `draftsmith vocab`, "
            "whose draft ids follow the target's order"
        )
    return {k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}


EAGLE = Writer(eagle_files, reload_check)
DFLASH = Writer(dflash.dflash_files, dflash.reload_check)
# each method's writer per --format (a method's engine-layout folder under "eagle", the default)
WRITERS: dict[str, dict[str, Writer]] = {
    "eagle3": {"eagle": EAGLE, "speculators": EAGLE},
    "peagle": {"eagle": EAGLE, "speculators": EAGLE},
    "dflash": {"eagle": DFLASH},
}


def run(cfg: ExportConfig) -> Path:
    engine = eagle.check_engine(cfg.engine)
    if cfg.sglang_release is not None:
        if engine != "sglang":
            raise UserError(
                "--sglang-release names the SGLang that will serve the export: give it with --engine sglang"
            )
        sglang.release_tuple(cfg.sglang_release)  # a malformed release is refused before the drafter is read
    if cfg.format == "speculators":
        speculators.check_engine_for_speculators(engine)
    model, record = load_drafter(cfg.drafter, convention=cfg.source_convention)  # a NaN or Inf weight is refused there
    if "ttt" in (record.get("meta") or {}):  # a drafter trained before train's `ttt` was renamed `depth`
        record = {**record, "meta": {("depth" if k == "ttt" else k): v for k, v in record["meta"].items()}}
    method = method_of(model)
    why = serving_refusal(model.config, engine)
    if why is not None:
        raise UserError(why)
    writer = WRITERS[method.name].get(cfg.format)
    if writer is None:
        raise UserError(
            f"--format {cfg.format}: draftsmith writes a {method.title} drafter in its engine's own layout only; "
            "drop --format or use --format eagle"
        )
    if cfg.include_embeddings and (record.get("meta") or {}).get("needs_target_embeddings"):
        raise UserError(f"{cfg.drafter} has no embed_tokens of its own, so --include-embeddings has nothing to write")
    if (record.get("meta") or {}).get("trained_embedding"):  # not the target's: the engines must load this one
        cfg = cfg.model_copy(update={"include_embeddings": True})
    dtype = weight_dtype(model, cfg.dtype)
    files = writer.files(model, record, cfg, dtype)
    files.tensors = without_identity_maps(files.tensors, model.d2t, model.config.vocab_size, str(cfg.drafter))
    inputs = [cfg.drafter, cfg.eval_report]
    with atomic_output_dir(cfg.out, "export", inputs, cfg.overwrite) as tmp:  # full disk: exit 4
        save_file(files.tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        atomic_write_json(tmp / "config.json", files.config)
        atomic_write_text(tmp / "README.md", files.card)
        write_run_record(tmp, cfg)
        writer.reload_check(model, tmp, dtype)
    print(
        f"[export] {files.layout} for {engine}: {cfg.out} (layers {files.layers}; checked: reload gives identical logits)"
    )
    return Path(cfg.out)

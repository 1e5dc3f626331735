"""Every bad-input probe of issue 16, one row each: the command must end with a clean `error:`
line naming the file, line or field and the fix, the row's exit code (2 for bad input, 4 for a
stage stopped with its output kept), no traceback, and no output folder left behind.

Each row builds its bad input in a fresh folder (`Env`) and returns the command line. The tiny
target folder loads in about a second, so the whole table runs in well under a minute on CPU.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from draftsmith.draft.checkpoint import save_drafter
from tests.helpers import cli, failed, make_tiny_drafter, prepared_chats


@dataclass
class Env:
    root: Path  # a fresh folder for this row
    target: Path  # the tiny target folder
    chats: Path  # a valid conversations file
    ds: Path  # a valid prepared dataset (of the tiny target)

    @property
    def out(self) -> Path:
        return self.root / "out"

    def file(self, name: str, data: bytes | str) -> Path:
        path = self.root / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        return path

    def drafter(self, damage: Callable[[Path], None]) -> Path:
        folder = save_drafter(make_tiny_drafter(), self.root / "drafter")
        damage(folder)
        return folder

    def train(self, *extra: object) -> list[object]:
        return [
            "train",
            self.ds,
            "--target",
            self.target,
            "--out",
            self.out,
            "--device",
            "cpu",
            "--steps",
            "2",
            "--batch-tokens",
            "64",
            "--val-fraction",
            "0",
            *extra,
        ]


BINARY = bytes(range(128, 256)) * 3
LATIN1 = '{"messages": [{"role": "user", "content": "caf\xe9"}]}\n'.encode("latin-1")
ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


def _nan_weights(folder: Path) -> None:
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    state["fc.weight"][0, 0] = float("nan")
    save_file(state, str(folder / "model.safetensors"))


def _bad_d2t(env: Env) -> Path:
    path = env.root / "vocab.safetensors"
    save_file({"d2t": torch.tensor([5, -9999, 3]), "t2d": torch.zeros(10, dtype=torch.bool)}, str(path))
    return path


def _readonly(env: Env) -> Path:
    folder = env.root / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


def _corrupt_dataset(env: Env) -> Path:
    ds = shutil.copytree(env.ds, env.root / "ds")
    (ds / "data.parquet").write_bytes(b"PAR1" + BINARY)
    return ds


def _pipeline(env: Env) -> Path:
    return env.file("pipe.yaml", f"out: {env.out}\ntarget: {env.target}\nstages:\n  - prepare: [data, {env.chats}]\n")


def _pipeline_file(env: Env, top: str, later_stage: str) -> Path:
    """A pipeline whose first stage is good (it would write `out/prepare`) and whose top level or
    later stage is bad: nothing may run."""
    return env.file(
        "pipe.yaml",
        f"out: {env.out}\n{top}: {env.target}\nstages:\n  - prepare: {{data: {env.chats}}}\n  - {later_stage}\n",
    )


def _progress(env: Env) -> Path:
    env.out.mkdir()
    (env.out / "progress.json").write_text('{"stage": "extract", "done": ')
    return env.out


def _disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(args[1]))

    monkeypatch.setattr("draftsmith.draft.checkpoint.save_file", full)
    monkeypatch.setattr("draftsmith.train.checkpointing.save_file", full)


def _model(env: Env, config_class: str, **config: object) -> Path:
    """A tiny random model of a transformers config class (a vocab of 300, hidden size 64) in a
    copy of the target folder (its tokenizer kept): a model some or every path cannot run."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    folder = shutil.copytree(env.target, env.root / config_class)
    cfg = getattr(transformers, config_class)(vocab_size=300, hidden_size=64, **config)
    auto = (
        transformers.AutoModelForCausalLM
        if cfg.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        else transformers.AutoModel
    )
    auto.from_config(cfg).save_pretrained(folder)
    return folder


def _jamba(env: Env) -> Path:  # Mamba layers between attention layers: extract and train run it, eval cannot
    return _model(
        env,
        "JambaConfig",
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        num_experts=2,
        mamba_d_state=8,
        mamba_dt_rank=8,
    )


@dataclass
class Probe:
    name: str
    args: Callable[[Env], list[object]]
    code: int
    message: str
    patch: Callable[[pytest.MonkeyPatch], None] | None = None
    skip: str | None = None  # a reason this machine cannot show it


PROBES = [
    Probe(
        "prepare binary input",
        lambda e: ["prepare", e.file("c.jsonl", BINARY), "--target", e.target, "--out", e.out],
        2,
        "c.jsonl:1: not UTF-8 text",
    ),
    Probe(
        "prepare latin-1 input",
        lambda e: ["prepare", e.file("c.jsonl", LATIN1), "--target", e.target, "--out", e.out],
        2,
        "c.jsonl:1: not UTF-8 text",
    ),
    Probe(
        "eval --bench binary",
        lambda e: [
            "eval",
            "--target",
            e.target,
            "--drafter",
            e.root / "none",
            "--out",
            e.out,
            "--bench",
            e.file("q.jsonl", BINARY + b"\n"),
            "--device",
            "cpu",
        ],
        2,
        "q.jsonl:1: not UTF-8 text",
    ),
    Probe(
        "prepare --out read-only",
        lambda e: ["prepare", e.chats, "--target", e.target, "--out", _readonly(e) / "ds"],
        2,
        "not writable here",
        skip="root writes anywhere" if ROOT else None,
    ),
    Probe(
        "prepare --out under a file",
        lambda e: ["prepare", e.chats, "--target", e.target, "--out", e.file("f", "x") / "ds"],
        2,
        "exists and is not a folder",
    ),
    Probe(
        "train --out under a file",
        lambda e: [
            "train",
            e.ds,
            "--target",
            e.target,
            "--out",
            e.file("f", "x") / "t",
            "--device",
            "cpu",
            "--steps",
            "1",
        ],
        2,
        "a part of this path is a file",
    ),
    Probe(
        "truncated .gguf target",
        lambda e: ["prepare", e.chats, "--target", e.file("m.gguf", b"GGUF\x03\0\0\0" + BINARY), "--out", e.out],
        2,
        "could not load the tokenizer",
    ),
    Probe(
        "corrupt dataset parquet",
        lambda e: ["vocab", _corrupt_dataset(e), "--out", e.out],
        2,
        "data.parquet: corrupt or truncated",
    ),
    Probe(
        "prepare: no assistant tokens within --max-len",
        lambda e: ["prepare", e.chats, "--target", e.target, "--out", e.out, "--max-len", "8"],
        2,
        "raise --max-len (samples are truncated already",
    ),
    Probe(
        "--device tpu",
        lambda e: ["extract", e.ds, "--target", e.target, "--out", e.out, "--device", "tpu"],
        2,
        "unknown device 'tpu'",
    ),
    Probe(
        "--device cuda without a GPU",
        lambda e: e.train("--device", "cuda"),
        2,
        "no CUDA GPU is visible",
        skip="a GPU is visible" if torch.cuda.is_available() else None,
    ),
    Probe("vocab --out DIR", lambda e: ["vocab", e.ds, "--out", e.root], 2, "is a folder; give a file path"),
    Probe("--vocab with a bad d2t", lambda e: e.train("--vocab", _bad_d2t(e)), 2, "d2t and t2d disagree"),
    Probe(
        "--vocab of garbage bytes",
        lambda e: e.train("--vocab", e.file("v.safetensors", BINARY)),
        2,
        "not a readable safetensors file",
    ),
    Probe(
        "drafter without weights",
        lambda e: ["export", e.drafter(lambda d: (d / "model.safetensors").unlink()), "--out", e.out],
        2,
        "model.safetensors: no such file",
    ),
    Probe(
        "drafter.json not JSON",
        lambda e: ["export", e.drafter(lambda d: (d / "drafter.json").write_text("{x")), "--out", e.out],
        2,
        "drafter.json: corrupt",
    ),
    Probe(
        "drafter.json without a config",
        lambda e: [
            "export",
            e.drafter(
                lambda d: (d / "drafter.json").write_text(
                    json.dumps({"format": "draftsmith-drafter", "config": {"hidden_size": 8}})
                )
            ),
            "--out",
            e.out,
        ],
        2,
        "its config does not describe a drafter",
    ),
    Probe(
        "drafter with a bad header",
        lambda e: [
            "eval",
            "--target",
            e.target,
            "--drafter",
            e.drafter(
                lambda d: (d / "model.safetensors").write_bytes(
                    b"\xff" * 16 + (d / "model.safetensors").read_bytes()[16:]
                )
            ),
            "--out",
            e.out,
            "--device",
            "cpu",
        ],
        2,
        "not a readable safetensors file",
    ),
    Probe(
        "export of a NaN drafter",
        lambda e: ["export", e.drafter(_nan_weights), "--out", e.out],
        2,
        "NaN or Inf weights in fc.weight",
    ),
    Probe("pipeline stage options as a list", lambda e: ["pipeline", _pipeline(e)], 2, "options must be a mapping"),
    Probe(
        "pipeline top-level typo",
        lambda e: ["pipeline", _pipeline_file(e, "taget", "vocab: {}")],
        2,
        "pipe.yaml: unknown top-level key 'taget': no stage takes it; did you mean 'target'?",
    ),
    Probe(
        "pipeline later stage with an unknown option",
        lambda e: ["pipeline", _pipeline_file(e, "target", "train: {stepz: 2}")],
        2,
        "pipeline stage train: invalid options:\n  --stepz: Extra inputs are not permitted",
    ),
    Probe(
        "pipeline later stage with a duplicate layer",
        lambda e: ["pipeline", _pipeline_file(e, "target", "extract: {aux_layer_ids: [2, 2, 15]}")],
        2,
        "--aux-layer-ids: layer ids [2, 2, 15] contain duplicates",
    ),
    Probe(
        "extract --aux-layer-ids 2,2,15",
        lambda e: ["extract", e.ds, "--target", e.target, "--out", e.out, "--aux-layer-ids", "2,2,15"],
        2,
        "contain duplicates",
    ),
    Probe(
        "train --aux-layer-ids 2,15",
        lambda e: e.train("--aux-layer-ids", "2,15"),
        2,
        "EAGLE-3 takes exactly 3 auxiliary layers",
    ),
    Probe(
        "train --aux-layer-ids outside the target",
        lambda e: e.train("--aux-layer-ids", "0,1,3"),
        2,
        "layer ids [3] are out of range: this target has 2 decoder layers, so ids must be in 0..2",
    ),
    Probe(
        "train --lr 1e38",
        lambda e: e.train("--lr", "1e38"),
        2,
        "--lr: 1e+38 is above 1e30, where the optimizer's step overflows fp32",
    ),
    Probe(
        "train whose eager attention does not fit in memory",
        lambda e: e.train("--batch-tokens", "4096"),
        2,
        "the eager TTT attention keeps",
        patch=lambda mp: mp.setattr("draftsmith.train.run.available_memory", lambda device: 1024),
    ),
    Probe("status of a corrupt progress.json", lambda e: ["status", _progress(e)], 2, "not a readable progress file"),
    Probe(
        "synth --out DIR",
        lambda e: ["synth", e.chats, "--target", e.target, "--out", e.root, "--device", "cpu"],
        2,
        "is a folder; synth writes one JSONL file",
    ),
    Probe(
        "synth where every answer is dropped",
        lambda e: [
            "synth",
            e.chats,
            "--target",
            e.target,
            "--out",
            e.root / "c.jsonl",
            "--device",
            "cpu",
            "--max-new-tokens",
            "1",
        ],
        2,
        "every answer of this run was dropped",
    ),
    Probe("disk full during train", lambda e: e.train("--save-every", "1"), 4, "disk full", patch=_disk_full),
    Probe(
        "extract on a model without a final norm (Mamba)",
        lambda e: [
            "extract",
            e.ds,
            "--target",
            _model(e, "MambaConfig", num_hidden_layers=2, state_size=8),
            "--out",
            e.out,
            "--device",
            "cpu",
        ],
        2,
        "MambaForCausalLM: no path of draftsmith can run this model: its language model MambaModel has no final norm",
    ),
    Probe(
        "train on a post-norm decoder (BERT)",
        lambda e: [
            "train",
            e.ds,
            "--target",
            _model(e, "BertConfig", num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, is_decoder=True),
            "--out",
            e.out,
            "--device",
            "cpu",
            "--steps",
            "1",
        ],
        2,
        "BertLMHeadModel: no path of draftsmith can run this model: its language model BertEncoder has no final norm",
    ),
    Probe(
        "synth on a model that is no causal LM (T5)",
        lambda e: [
            "synth",
            e.chats,
            "--target",
            _model(e, "T5Config", d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16),
            "--out",
            e.out / "c.jsonl",
            "--device",
            "cpu",
        ],
        2,
        "T5Config (model_type 't5') has no causal-LM class in transformers",
    ),
    Probe(
        "eval on a model whose cache cannot be cropped (Jamba)",
        lambda e: [
            "eval",
            "--target",
            _jamba(e),
            "--drafter",
            save_drafter(make_tiny_drafter((1, 2, 3)), e.root / "drafter"),
            "--out",
            e.out,
            "--device",
            "cpu",
        ],
        2,
        "JambaForCausalLM: no path of draftsmith can verify drafts for this model: its cache cannot be cropped",
    ),
    Probe(
        "extract --shard auto without a GPU",
        lambda e: ["extract", e.ds, "--target", e.target, "--out", e.out, "--shard", "auto"],
        2,
        "no CUDA GPU is visible; use --shard none",
        skip="a GPU is visible" if torch.cuda.is_available() else None,
    ),
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, tiny_target_dir: Path) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bad-inputs")
    return prepared_chats(root, tiny_target_dir)


@pytest.mark.parametrize("probe", PROBES, ids=[p.name for p in PROBES])
def test_bad_input(
    probe: Probe, prepared: tuple[Path, Path], tiny_target_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if probe.skip:
        pytest.skip(probe.skip)
    env = Env(tmp_path, tiny_target_dir, *prepared)
    args = [str(a) for a in probe.args(env)]
    if probe.patch:
        probe.patch(monkeypatch)
    r = cli(*args)
    failed(r, probe.code, probe.message)
    if probe.code == 2:
        assert not env.out.exists() or env.out.is_dir() and set(os.listdir(env.out)) <= {"progress.json"}

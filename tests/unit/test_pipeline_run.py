"""`draftsmith pipeline` never replaces an output it did not make: a foreign folder at a stage's
`out:` is refused with a clear error and kept, while a stage this pipeline started and that
was cut short is still run again over its own leftovers."""

import json

import pytest

from draftsmith.data.dataset import load_dataset
from draftsmith.errors import UserError
from draftsmith.pipeline.config import PipelineConfig
from draftsmith.pipeline.run import run

PAIRS = [{"prompt": "Name a prime number.", "response": "Seven is a prime number."},
         {"prompt": "Say hi.", "response": "Hi!"}]


def write_pipeline(tmp_path, target, out):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"out: {tmp_path / 'run'}\ntarget: {target}\nstages:\n"
                   f"  - prepare: {{data: {data}, out: {out}}}\n")
    return PipelineConfig(pipeline_config=cfg)


def test_a_foreign_folder_is_refused_and_kept(tmp_path, tiny_target_dir):
    precious = tmp_path / "o" / "precious"
    precious.mkdir(parents=True)
    (precious / "NOTES.txt").write_text("x\n")
    cfg = write_pipeline(tmp_path, tiny_target_dir, precious)
    with pytest.raises(UserError, match=r"precious already exists and this pipeline did not make it.*overwrite: true"):
        run(cfg)
    assert sorted(p.name for p in precious.iterdir()) == ["NOTES.txt"]
    assert (precious / "NOTES.txt").read_text() == "x\n"


def test_its_own_interrupted_stage_is_rerun(tmp_path, tiny_target_dir, monkeypatch):
    out = tmp_path / "run" / "prepare"
    cfg = write_pipeline(tmp_path, tiny_target_dir, out)
    import draftsmith.data.prepare as prepare

    real = prepare.run

    def killed(c):  # the stage wrote part of its output, then the process died
        out.mkdir(parents=True)
        (out / "data.parquet").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "run", killed)
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    assert not (tmp_path / "run" / ".pipeline" / "prepare.done").exists()
    monkeypatch.setattr(prepare, "run", real)
    run(cfg)  # the .started marker names this folder: it is rewritten
    assert len(load_dataset(out)) == len(PAIRS)
    assert (tmp_path / "run" / ".pipeline" / "prepare.done").exists()

"""`draftsmith pipeline` never replaces an output it did not make: a foreign folder at a stage's
`out:` is refused with a clear error and kept, while a stage this pipeline started and that
was cut short is still run again over its own leftovers."""

import json

import pytest

from draftsmith.data.dataset import load_dataset
from draftsmith.errors import UserError
from draftsmith.pipeline.config import PipelineConfig
from draftsmith.pipeline.run import check_common, parse_stages, plan_stages, run, stage_changes
from draftsmith.synth.config import SynthConfig

PAIRS = [
    {"prompt": "Name a prime number.", "response": "Seven is a prime number."},
    {"prompt": "Say hi.", "response": "Hi!"},
]


def write_pipeline(tmp_path, target, out):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"out: {tmp_path / 'run'}\ntarget: {target}\nstages:\n  - prepare: {{data: {data}, out: {out}}}\n")
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


def test_a_stage_whose_options_changed_is_rerun(tmp_path, tiny_target_dir, capsys):
    """Issue 16 item 6: the .done marker records the stage's resolved options; a rerun with other
    options runs the stage again over its own output instead of keeping the stale one."""
    out = tmp_path / "run" / "prepare"
    cfg = write_pipeline(tmp_path, tiny_target_dir, out)
    run(cfg)
    assert load_dataset(out).meta["max_len"] == 2048
    run(cfg)
    assert "done earlier, skipped" in capsys.readouterr().out
    cfg.pipeline_config.write_text(
        cfg.pipeline_config.read_text().replace(f"out: {out}}}", f"out: {out}, max_len: 40}}")
    )
    run(cfg)
    assert "changed since it ran (max_len): running it again" in capsys.readouterr().out
    assert load_dataset(out).meta["max_len"] == 40
    run(cfg)
    assert "done earlier, skipped" in capsys.readouterr().out


def test_the_old_layers_key_still_works_with_a_warning(tmp_path, capsys):
    """`layers:` (now `aux_layer_ids:`) is still taken at the top level and in a stage, with the
    deprecation warning; a stage's own option beats the top level's under either name, and a
    marker written before the rename (recording `layers`) does not count as changed options."""
    spec = {"target": "t", "layers": [8, 2, 5]}
    stages = parse_stages(
        [
            {"extract": {"dataset_dir": "ds"}},
            {"train": {"dataset_dir": "ds", "layers": [1, 2, 3]}},
            {"train": {"name": "other", "dataset_dir": "ds", "aux_layer_ids": [3, 4, 5]}},
        ]
    )
    check_common(tmp_path / "p.yaml", spec, stages)
    planned = plan_stages(tmp_path / "run", stages, spec)
    assert [p.cfg.aux_layer_ids for p in planned] == [[2, 5, 8], [1, 2, 3], [3, 4, 5]]
    assert "option 'layers' (--layers) is deprecated" in capsys.readouterr().err
    marker = tmp_path / "extract.done"
    recorded = planned[0].cfg.model_dump(mode="json")
    recorded["layers"] = recorded.pop("aux_layer_ids")
    marker.write_text(json.dumps({"command": "extract", "config": recorded}))
    assert stage_changes(marker, planned[0].cfg) == []
    del recorded["token_budget"]  # a marker written before an option existed: changed only off its default
    marker.write_text(json.dumps({"command": "extract", "config": recorded}))
    assert stage_changes(marker, planned[0].cfg) == []
    assert stage_changes(marker, planned[0].cfg.model_copy(update={"token_budget": 7})) == ["token_budget"]


def test_an_option_off_in_the_marker_is_no_change(tmp_path):
    """synth's --compile-target (removed on 2026-12-06, back since, off by default): a marker
    written while it first existed, holding it off (as carried synth answers do), is not a
    changed stage; one holding it on is."""
    cfg = SynthConfig(prompts=tmp_path / "p.jsonl", out=tmp_path / "synth" / "c.jsonl")
    marker = tmp_path / "synth.done"
    for held, changed in ((False, []), (True, ["compile_target"])):
        recorded = {**cfg.model_dump(mode="json"), "compile_target": held}
        marker.write_text(json.dumps({"command": "synth", "config": recorded}))
        assert stage_changes(marker, cfg) == changed


def test_a_stage_whose_input_was_made_again_is_rerun(tmp_path, tiny_target_dir, capsys):
    """A done stage that reads an output made again since it finished runs again, instead of
    keeping what it made from the old one: when the stage it reads runs in the same pipeline
    run, and when it ran in an earlier one (`--only`). Unchanged, both are skipped."""
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    cfg = tmp_path / "p.yaml"

    def write(max_len):
        cfg.write_text(
            f"out: {tmp_path / 'run'}\ntarget: {tiny_target_dir}\nstages:\n"
            f"  - prepare: {{data: {data}, max_len: {max_len}}}\n  - vocab: {{draft_vocab_size: 50}}\n"
        )

    def pipeline(only=None):
        run(PipelineConfig(pipeline_config=cfg, only=only))
        return capsys.readouterr().out

    write(2048)
    pipeline()
    vocab_done = tmp_path / "run" / ".pipeline" / "vocab.done"
    first = json.loads(vocab_done.read_text())
    prepare_id = json.loads((tmp_path / "run" / ".pipeline" / "prepare.done").read_text())["id"]
    assert first["inputs"] == {"prepare": prepare_id}
    assert pipeline().count("done earlier, skipped") == 2
    write(40)  # prepare runs again in this run: vocab follows
    out = pipeline()
    assert (
        "prepare: changed since it ran (max_len)" in out
        and "vocab: changed since it ran (input prepare made again)" in out
    )
    assert json.loads(vocab_done.read_text())["id"] != first["id"]
    write(64)  # prepare alone now, vocab in a later run
    assert "vocab: not selected" in pipeline(["prepare"])
    assert "vocab: changed since it ran (input prepare made again)" in pipeline(["vocab"])
    assert pipeline().count("done earlier, skipped") == 2

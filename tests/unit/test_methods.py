"""One home per drafter method: draft/methods.py's METHODS record, and one table per stage keyed
by its names (train's OBJECTIVES and option validators, evaluate's PROPOSERS, export's WRITERS);
outside a method's own files no stage tests which method it holds; drafter.json names one method."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.draft.checkpoint import DRAFTER_FILE, load_drafter, save_drafter
from draftsmith.draft.methods import METHODS, method_of, record_method
from tests.helpers import make_tiny_llama, random_dflash, random_drafter

SRC = Path(__file__).parents[2] / "src" / "draftsmith"
# a method's own files: its model, objective, proposer and writer (docs/adding-a-method.md)
OWN = {
    "draft/methods.py",
    "draft/model.py",
    "draft/peagle.py",
    "draft/dflash.py",
    "draft/dflash_layout.py",
    "train/dflash.py",
    "evaluate/dflash_proposer.py",
    "export/dflash.py",
}
STAGES = ("train", "evaluate", "export", "plan", "draft")
TESTS = (
    r"\bis_parallel\(",
    r"\.method\s*[!=]=",
    r"method\s*[!=]=\s*\"",
    r"[!=]=\s*\"(eagle3|peagle|dflash)\"",
    r"isinstance\([^)]*(DFlashDrafter|Eagle3Drafter)",
    r"\bis_dflash_folder\(",
    r"\bdrafter_method\(",
)


def test_every_stage_table_holds_every_method():
    from draftsmith.evaluate.proposers import PROPOSERS
    from draftsmith.export.run import WRITERS
    from draftsmith.plan.config import PlanConfig
    from draftsmith.train.config import METHOD_OPTIONS, TrainConfig
    from draftsmith.train.objectives import OBJECTIVES

    names = list(METHODS)
    for table in (OBJECTIVES, METHOD_OPTIONS, PROPOSERS, WRITERS):
        assert list(table) == names
    for config in (TrainConfig, PlanConfig):  # the --method choices (light: --help imports no torch)
        assert list(typing.get_args(config.model_fields["method"].annotation)) == names
    for m in METHODS.values():
        assert "eagle" in WRITERS[m.name]  # the default --format: each method's engine layout
        assert m.engines and m.config.__dataclass_fields__["method"].default in (m.name, "eagle3")


def test_no_stage_tests_which_method_it_holds():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        if rel.split("/")[0] not in STAGES or rel in OWN:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(re.search(pattern, line) for pattern in TESTS):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("method", ["eagle3", "peagle"])
def test_drafter_json_names_one_method_and_old_records_still_read(tmp_path, method):
    model = make_tiny_llama(300)
    drafter = random_drafter(model, method=method)
    save_drafter(drafter, tmp_path / "d")
    record = json.loads((tmp_path / "d" / DRAFTER_FILE).read_text())
    assert record["method"] == record["config"]["method"] == method
    if method == "peagle":  # a record from before: "eagle3" at the top, "peagle" in its config
        (tmp_path / "d" / DRAFTER_FILE).write_text(json.dumps({**record, "method": "eagle3"}))
    again, _ = load_drafter(tmp_path / "d")
    assert method_of(again).name == method
    assert torch.equal(again.fc.weight, drafter.fc.weight)


def test_record_method_reads_every_record():
    assert record_method({"config": {}}) == "eagle3"  # older than any method field
    assert record_method({"method": "dflash", "config": {"method": "dflash"}}) == "dflash"
    assert record_method({"method": "eagle3", "config": {"method": "peagle"}}) == "peagle"


def test_a_dflash_drafter_round_trips_its_method(tmp_path):
    drafter = random_dflash(make_tiny_llama(300))
    save_drafter(drafter, tmp_path / "d")
    assert json.loads((tmp_path / "d" / DRAFTER_FILE).read_text())["method"] == "dflash"
    again, _ = load_drafter(tmp_path / "d")
    assert method_of(again) is METHODS["dflash"] and METHODS["dflash"].depth_limit(again.config) == 3


def test_train_help_shows_each_methods_options_and_defaults():
    out = " ".join(CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "EAGLE-3 and P-EAGLE options" in out and "--method peagle 1.0" in out


def test_each_method_resolves_its_own_defaults():
    from draftsmith.train.config import TrainConfig

    cfg = {"dataset_dir": "d", "out": "o"}
    assert TrainConfig(**cfg).step_decay == 0.8 and "step_decay" not in TrainConfig(**cfg).model_fields_set
    assert TrainConfig(**cfg, method="peagle").step_decay == 1.0
    assert TrainConfig(**cfg, method="peagle", step_decay=0.5).step_decay == 0.5
    assert TrainConfig(**cfg, method="dflash").step_decay == 0.8


def report_meta_keywords(path: Path) -> set[str]:
    """The keywords of the `ReportMeta(...)` call in an engine's module (empty: it builds none)."""
    import ast

    calls = [
        node
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ReportMeta"
    ]
    given = {k.arg for call in calls for k in call.keywords if k.arg}
    spread = [k.value for call in calls for k in call.keywords if k.arg is None]  # **options_meta(cfg)
    assert all(getattr(v, "func", None) and v.func.id == "options_meta" for v in spread), "an unknown ** in ReportMeta"
    if spread:  # the keys options_meta returns, from an EvalConfig's options
        from draftsmith.evaluate.config import EvalConfig
        from draftsmith.evaluate.report import options_meta

        given |= set(options_meta(EvalConfig(drafter=Path("d"), out=Path("o"))))
    return given


@pytest.mark.parametrize("engine", ["run.py", "vllm_eval.py"])
def test_each_eval_engine_fills_the_one_report_schema(engine):
    """report.json's metadata is one `ReportMeta` for both engines (`draftsmith eval`, run.py;
    `eval --engine vllm`, vllm_eval.py): each fills every field a run knows (those without a
    default) and no other, so the two reports have the same keys."""
    from dataclasses import MISSING, fields

    from draftsmith.evaluate.report import ReportMeta

    given = report_meta_keywords(SRC / "evaluate" / engine)
    if not given:
        pytest.xfail(f"evaluate/{engine} still writes its own report metadata")
    required = {f.name for f in fields(ReportMeta) if f.default is MISSING and f.default_factory is MISSING}
    assert {"method", "aux_layer_ids", "target_info", "drafter_meta"} <= required
    assert required <= given <= {f.name for f in fields(ReportMeta)}

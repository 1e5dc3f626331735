"""The data card (issue 17 item 4): a `synth --mix` output's mix.json goes through `prepare`
(dataset.json's `mix`) and `train` (the drafter's meta `data_mix`) into the exported model
card as a table of sources, licenses and counts. Also `prepare` from named sources."""

from __future__ import annotations

import json

import pytest

from draftsmith.data.config import PrepareConfig
from draftsmith.data.prepare import run as prepare
from draftsmith.data.sources import data_card
from draftsmith.draft.checkpoint import load_drafter, save_drafter
from draftsmith.errors import UserError
from draftsmith.export.config import ExportConfig
from draftsmith.export.run import run as export
from tests.helpers import make_tiny_drafter

MIX_JSON = {
    "mix": "/somewhere/h200.yaml",
    "output": "conversations.jsonl",
    "seed": 0,
    "kept": 3,
    "finished": True,
    "sources": [
        {
            "name": "evals",
            "source": "evals",
            "license": "MIT",
            "selected": 2,
            "synth": {"kept": 2},
            "license_excluded_tasks": ["ballots", "steganography"],
        },
        {"name": "mine", "source": "data/mine.jsonl", "license": "CC-BY-4.0", "selected": 1, "synth": {"kept": 1}},
    ],
}
CONVS = [
    {
        "id": f"evals:t/s:line-{i}:s0",
        "messages": [
            {"role": "user", "content": f"What is {i} plus {i}?"},
            {"role": "assistant", "content": f"It is {2 * i}."},
        ],
    }
    for i in range(2)
]
CONVS.append(
    {
        "id": "mine:line-1:s0",
        "messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}],
    }
)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tiny_target_dir):
    root = tmp_path_factory.mktemp("card")
    (root / "synth").mkdir()
    (root / "synth" / "conversations.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CONVS))
    (root / "synth" / "mix.json").write_text(json.dumps(MIX_JSON))
    prepare(PrepareConfig(data=root / "synth" / "conversations.jsonl", target=str(tiny_target_dir), out=root / "ds"))
    return root


def test_prepare_carries_the_mix_card(prepared):
    meta = json.loads((prepared / "ds" / "dataset.json").read_text())
    assert meta["mix"] == data_card(MIX_JSON) and meta["mix"]["sources"][0]["left_out"] == ["ballots", "steganography"]


def test_train_and_export_put_the_data_in_the_model_card(prepared, tiny_target_dir):
    from typer.testing import CliRunner

    from draftsmith.cli import app

    out = prepared / "train"
    res = CliRunner().invoke(
        app,
        [
            "train",
            str(prepared / "ds"),
            "--target",
            str(tiny_target_dir),
            "--out",
            str(out),
            "--steps",
            "1",
            "--depth",
            "1",
            "--batch-tokens",
            "64",
            "--draft-vocab-size",
            "300",
            "--val-fraction",
            "0",
            "--device",
            "cpu",
        ],
    )
    assert res.exit_code == 0, res.output
    _, manifest = load_drafter(out)
    assert manifest["meta"]["data_mix"] == data_card(MIX_JSON)
    # the 2-layer tiny target's aux layers cannot be served, so export a servable drafter with that meta
    save_drafter(make_tiny_drafter(), prepared / "ckpt", target={"name": "t", "num_layers": 30}, meta=manifest["meta"])
    card = (export(ExportConfig(drafter=prepared / "ckpt", out=prepared / "export")) / "README.md").read_text()
    assert "## Training data" in card and "`draftsmith synth --mix h200.yaml`" in card and ": 3 in all" in card
    assert "| evals | MIT | 2 | left out (other licenses): ballots, steganography |" in card
    assert "| mine (`data/mine.jsonl`) | CC-BY-4.0 | 1 |  |" in card
    assert "data_mix" not in card  # shown as the table, not as a JSON bullet


def test_a_card_without_a_mix_has_no_data_table(tmp_path):
    # a drafter trained before `ttt` was renamed: its meta reads as `depth`
    save_drafter(make_tiny_drafter(), tmp_path / "ckpt", target={"name": "t", "num_layers": 30}, meta={"ttt": 1})
    card = (export(ExportConfig(drafter=tmp_path / "ckpt", out=tmp_path / "out")) / "README.md").read_text()
    assert "## Training data" not in card and "- `depth`: 1" in card and "ttt" not in card


def test_prepare_refuses_a_prompt_set_and_reads_named_sources(tmp_path, tiny_target_dir):
    with pytest.raises(UserError, match=r"evals: a prompt set without answers.*draftsmith synth evals"):
        prepare(PrepareConfig(data="evals", target=str(tiny_target_dir), out=tmp_path / "x"))
    assert not (tmp_path / "x").exists()
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "hf"
    datasets.Dataset.from_list([{k: v for k, v in c.items() if k != "id"} for c in CONVS]).save_to_disk(str(folder))
    prepare(PrepareConfig(data=f"hf:{folder}", target=str(tiny_target_dir), out=tmp_path / "ds"))
    meta = json.loads((tmp_path / "ds" / "dataset.json").read_text())
    assert meta["num_samples"] == 3 and meta["mix"] is None

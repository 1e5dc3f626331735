"""`draftsmith plan` on a tiny target: a table with disk, memory and calibrated time per stage; and
`extract --plan`, the store's disk check alone (both through `data.store.store_fit`)."""

import numpy as np
import pytest
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.data.store import projected_bytes
from draftsmith.fsutil import human_bytes
from tests.helpers import write_tokenized_dataset


@pytest.mark.slow
def test_plan_table(tmp_path, tiny_target_dir):
    rng = np.random.default_rng(0)
    samples = [rng.integers(0, 49152, size=30).tolist() for _ in range(10)]
    ds = write_tokenized_dataset(tmp_path / "ds", samples)
    r = CliRunner().invoke(
        app,
        [
            "plan",
            str(ds),
            "--target",
            str(tiny_target_dir),
            "--device",
            "cpu",
            "--hidden",
            str(tmp_path),
            "--calibrate-tokens",
            "64",
            "--depth",
            "2",
        ],
    )
    assert r.exit_code == 0, r.output
    for stage in ("extract", "train (offline)", "train (online)"):
        assert stage in r.output
    assert human_bytes(projected_bytes(300, 10, 3, 64, 4)) in r.output  # fp32 on CPU, layers [0, 1, 2]
    assert "tok/s" in r.output and ": fits" in r.output
    r = CliRunner().invoke(
        app, ["plan", str(ds), "--target", str(tiny_target_dir), "--device", "cpu", "--no-calibrate"]
    )
    assert r.exit_code == 0 and "calibration" not in r.output


def test_extract_plan_loads_no_weights_and_writes_nothing(tmp_path, tiny_target_dir, monkeypatch):
    ds = write_tokenized_dataset(tmp_path / "ds", [list(range(3, 33))] * 10)

    def no_weights(*args, **kwargs):
        raise AssertionError("extract --plan loaded the target's weights")

    monkeypatch.setattr("draftsmith.extract.run.load_target", no_weights)
    out = tmp_path / "store"
    r = CliRunner().invoke(
        app, ["extract", str(ds), "--target", str(tiny_target_dir), "--out", str(out), "--plan", "--dtype", "bf16"]
    )
    assert r.exit_code == 0, r.output
    whole = projected_bytes(300, 10, 3, 64, 2)  # bf16, the default layers [0, 1, 2] of 2 hidden-64 layers
    assert f"layers [0, 1, 2] of 2, hidden size 64, bfloat16: the store takes ~{human_bytes(whole)}" in r.output
    assert "it fits; nothing was loaded or written" in r.output and not out.exists()


@pytest.mark.slow
def test_plan_sizes_the_drafter_train_would_build(tmp_path, tiny_target_dir):
    """--draft-vocab-size, --intermediate-size and --num-layers are train's (one definition,
    `DrafterShape`): the training rows' device memory is that drafter's, optimizer state included,
    and on CPU the eager TTT attention's scores over one --batch-tokens row, which plan says."""
    from draftsmith.draft.model import DrafterConfig, Eagle3Drafter
    from draftsmith.draft.shape import DrafterShape, eager_attention_bytes
    from draftsmith.plan.run import ADAM_BYTES_PER_PARAM
    from draftsmith.target import load_target, text_config

    ds = write_tokenized_dataset(tmp_path / "ds", [list(range(3, 33))] * 10)
    tc = text_config(load_target(str(tiny_target_dir), "cpu", "fp32").model.config)
    rows = []
    for shape in ({}, {"draft_vocab_size": 500, "intermediate_size": "4x", "num_layers": 2}):
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in shape.items()]
        r = CliRunner().invoke(
            app, ["plan", str(ds), "--target", str(tiny_target_dir), "--device", "cpu", "--no-calibrate", *flags]
        )
        assert r.exit_code == 0, r.output
        drafter = Eagle3Drafter(
            DrafterShape(**shape).shaped(DrafterConfig.from_target(tc, shape.get("draft_vocab_size", 32000), [0, 1, 2]))
        )
        trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
        frozen = sum(p.numel() for p in drafter.parameters() if not p.requires_grad)
        cfg = drafter.config
        scores = eager_attention_bytes(8192, cfg.num_attention_heads, 7, cfg.num_layers)
        expected = human_bytes(trainable * ADAM_BYTES_PER_PARAM + frozen * 4 + scores)
        assert f"eager TTT attention, ~{human_bytes(scores)} of scores at --batch-tokens 8192" in r.output
        row = next(line for line in r.output.splitlines() if "train (offline)" in line)
        assert expected in row, (expected, row)
        rows.append(row)
    assert rows[0] != rows[1]

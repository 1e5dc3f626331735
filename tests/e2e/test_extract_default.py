"""Must show 1: on the embedded default, every stored aux and final tensor equals a plain HF
forward's hidden_states[k] (and the final-norm output), for the default and a custom --aux-layer-ids."""

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.data.store import StoreReader
from tests.helpers import write_tokenized_dataset

pytestmark = pytest.mark.slow


def rel_err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("aux_layer_ids", [None, [1, 14, 29]])
def test_store_matches_hf_hidden_states(tmp_path, smollm2, aux_layer_ids, monkeypatch):
    if aux_layer_ids:  # the default-layers case loads the GGUF through the CLI; this one reuses the loaded target
        monkeypatch.setattr("draftsmith.extract.run.load_target", lambda *a, **k: smollm2)
    rng = np.random.default_rng(0)
    samples = [rng.integers(0, 49152, size=n).tolist() for n in (23, 9, 31)]  # unequal: padding is exercised
    ds = write_tokenized_dataset(tmp_path / "ds", samples)
    args = [
        "extract",
        str(ds),
        "--target",
        "smollm2-135m",
        "--out",
        str(tmp_path / "store"),
        "--device",
        "cpu",
        "--check-every",
        "1",
    ]
    if aux_layer_ids:
        args += ["--aux-layer-ids", ",".join(map(str, aux_layer_ids))]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    reader = StoreReader(tmp_path / "store")
    expected = aux_layer_ids or [2, 15, 27]
    L, H = 30, 576
    assert reader.meta["aux_layer_ids"] == expected and reader.meta["n_aux"] == len(expected)
    assert reader.meta["target"]["fingerprint"] == smollm2.info.fingerprint and reader.meta["complete"]
    assert len(reader) == 3
    for i in range(len(reader)):
        reader.verify(i)
        s = reader[i]
        with torch.no_grad():
            hs = smollm2.model(s["input_ids"][None], output_hidden_states=True).hidden_states  # L+1 x [1, T, H]
        for j, k in enumerate(expected):
            got = s["aux_hidden_states"][:, j * H : (j + 1) * H]  # [T, H]
            assert rel_err(got, hs[k][0]) < 1e-4, (k, rel_err(got, hs[k][0]))
        assert rel_err(s["final_hidden_states"], hs[L][0]) < 1e-4
        assert s["input_ids"].tolist() == samples[s["sample_id"]]

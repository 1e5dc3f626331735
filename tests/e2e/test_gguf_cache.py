"""A GGUF target is read once: the first load keeps a converted copy (`draftsmith.gguf_cache`),
and a later load that reads only the copy gives the same weights, logits, config, tokenizer and
target identity. Only a float32 load writes the weights; `DRAFTSMITH_CACHE=off` writes nothing;
a copy that another process wrote first, or a folder that cannot be written, fails no load."""

from __future__ import annotations

import os

import gguf
import pytest
import torch

from draftsmith import gguf_cache
from draftsmith.target import load_target, load_text_config, load_tokenizer, resolve_spec
from tests.helpers import SMOLLM2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SMOLLM2.startswith("smollm2"), reason="the embedded default's GGUF is not installed"),
]


def no_gguf_reads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the GGUF was read although its converted copy is there")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)


def test_a_later_load_reads_the_copy_and_gets_the_same_target(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    config = load_text_config(SMOLLM2)  # from the GGUF's header: no copy yet
    first = load_target(SMOLLM2, "cpu", "fp32")
    gguf_file = resolve_spec(SMOLLM2)[0] / resolve_spec(SMOLLM2)[1]
    assert gguf_cache.cached(gguf_file, "model") and gguf_cache.cached(gguf_file, "tokenizer")

    no_gguf_reads(monkeypatch)
    again = load_target(SMOLLM2, "cpu", "fp32")
    assert again.info == first.info  # the identity stays the GGUF's (stores and drafters record it)
    a, b = first.model.state_dict(), again.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.tensor([[1, 504, 3458, 314, 260, 1345, 30]])
    torch.testing.assert_close(first.model(ids).logits, again.model(ids).logits, rtol=0, atol=0)

    def fields(c):  # where it was read from, the dtype it records and the class it names aside
        return {k: v for k, v in c.to_dict().items() if k not in ("_name_or_path", "dtype", "architectures")}

    copied = load_text_config(SMOLLM2)
    assert fields(copied) == fields(config)
    assert copied.architectures == [type(first.model).__name__]  # the copy names its class, for vLLM
    chat = [{"role": "user", "content": "What is 12 times 7? Answer in one line."}]
    for tok in (again.tokenizer, load_tokenizer(SMOLLM2)):
        assert tok.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True
        ) == first.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        text = "Speculative decoding: ünïcode, code `x = 1`, and 3.14159.\n"
        assert tok(text)["input_ids"] == first.tokenizer(text)["input_ids"]
        assert (tok.eos_token_id, tok.pad_token_id, len(tok)) == (
            first.tokenizer.eos_token_id,
            first.tokenizer.pad_token_id,
            len(first.tokenizer),
        )


def test_only_float32_loads_write_the_weights_and_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "c"))
    load_target(SMOLLM2, "cpu", "bf16")
    gguf_file = resolve_spec(SMOLLM2)[0] / resolve_spec(SMOLLM2)[1]
    assert gguf_cache.cached(gguf_file, "tokenizer") and not gguf_cache.cached(gguf_file, "model")
    monkeypatch.setenv("DRAFTSMITH_CACHE", "off")
    load_tokenizer(SMOLLM2)
    assert gguf_cache.copy_dir(gguf_file) is None


def test_a_copy_written_first_elsewhere_or_an_unwritable_folder_fails_no_load(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path))
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"not read here")
    folder = gguf_cache.copy_dir(gguf_file)

    def raced(tmp):  # another process renames its copy into place while this one writes
        (tmp / "a").write_text("mine")
        (folder / "model").mkdir()
        (folder / "model" / "a").write_text("theirs")

    gguf_cache.store(gguf_file, "model", raced)
    assert (folder / "model" / "a").read_text() == "theirs" and os.listdir(folder) == ["model"]  # no temp left

    os.utime(gguf_file, ns=(0, 0))
    assert gguf_cache.copy_dir(gguf_file) != folder  # a changed file gets a copy of its own

    def full(tmp):
        raise OSError(28, "No space left on device")

    gguf_cache.store(gguf_file, "tokenizer", full)
    assert "could not keep a converted copy" in capsys.readouterr().err
    assert gguf_cache.cached(gguf_file, "tokenizer") is None

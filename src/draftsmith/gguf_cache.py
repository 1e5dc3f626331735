"""A converted copy of a GGUF target, so that only the first command pays for reading the GGUF.

transformers parses a GGUF three times (config, tokenizer, weights) and de-quantises it, many
times slower than reading a Hugging Face folder. The first load of a GGUF writes that folder:

    <cache>/<gguf stem>-<key>/tokenizer/   the tokenizer as the GGUF gives it (before any
                                           --chat-template override), written by any load
    <cache>/<gguf stem>-<key>/model/       config.json + model.safetensors in float32, the
                                           de-quantised values; written only by a float32 load

`key` hashes the GGUF's absolute path, size and modification time, the transformers version and
the copy's FORMAT. Writes are atomic per part and never fail a load (docs/reliability.md).
Where: `$DRAFTSMITH_CACHE` (`off` turns the cache off), else `$XDG_CACHE_HOME/draftsmith`, else
`~/.cache/draftsmith`. The target's identity (`TargetInfo`) is always the GGUF's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cache_root() -> Path | None:
    """The cache folder, or None when `DRAFTSMITH_CACHE=off`."""
    env = os.environ.get("DRAFTSMITH_CACHE")
    if env == "off":
        return None
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "draftsmith"


FORMAT = 2  # the copy's layout: 2 names its class and keeps tied weights under the embedding's name


def copy_dir(gguf: Path) -> Path | None:
    """The folder that holds (or will hold) the converted copy of the GGUF file `gguf`."""
    root = cache_root()
    if root is None:
        return None
    import transformers

    st = gguf.stat()
    ident = f"{gguf.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{transformers.__version__}\0{FORMAT}"
    return root / f"{gguf.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def cached(gguf: Path, part: str) -> Path | None:
    """The converted `part` ("model" or "tokenizer") of `gguf` when a whole copy is there."""
    folder = copy_dir(gguf)
    return folder / part if folder is not None and (folder / part).is_dir() else None


def save_model(model: Any, folder: Path) -> None:
    """The GGUF-loaded `model` as a plain HF folder that transformers and vLLM both load: its
    config without the GGUF quantisation entry (the weights are de-quantised already;
    transformers' save_pretrained refuses a model loaded from a GGUF) and naming its class (vLLM
    builds the class `architectures` names), and its weights, a tied output embedding kept once,
    under the input embedding's name (vLLM loads that one and skips `lm_head` when tied)."""
    from safetensors.torch import save_file

    config = json.loads(model.config.to_json_string(use_diff=False))
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    embed = model.get_input_embeddings().weight
    tied = [n for n, p in model.named_parameters(remove_duplicate=False) if p is embed][1:]  # the first is its own
    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k not in tied}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def store(gguf: Path, part: str, save: Callable[[Path], None]) -> None:
    """Write `part` of the converted copy with `save(folder)`, unless it is there already."""
    folder = copy_dir(gguf)
    if folder is None or (folder / part).is_dir():
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{part}-", dir=folder))
        try:
            save(tmp)
            tmp.rename(folder / part)  # atomic; fails when another process got there first
        except OSError:
            if not (folder / part).is_dir():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except Exception as e:  # the load succeeded; only its copy failed (a full disk, a read-only home, ...)
        print(
            f"[target] could not keep a converted copy of {gguf.name} in {folder} ({e}); every load reads the "
            "GGUF again. Set DRAFTSMITH_CACHE to a writable folder, or to 'off'",
            file=sys.stderr,
            flush=True,
        )


def discard(gguf: Path, part: str, why: Exception) -> None:
    """Remove a converted `part` of `gguf` that did not load (`why`), saying so: the next load
    reads the GGUF and keeps a new copy."""
    folder = copy_dir(gguf)
    if folder is None or not (folder / part).is_dir():
        return
    print(
        f"[target] the converted copy {folder / part} of {gguf.name} did not load ({why}); removed it, "
        "converting the GGUF again",
        file=sys.stderr,
        flush=True,
    )
    shutil.rmtree(folder / part, ignore_errors=True)

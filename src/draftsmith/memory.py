"""Memory free for new allocations, the one check of an estimate against it, the one release of what
dropped objects still hold, and the one error for running out anyway (issue 55).

Free memory is the GPU's on CUDA; on the host it is MemAvailable and, under an address-space limit
(`ulimit -v`, RLIMIT_AS), what the limit leaves beyond ADDRESS_SPACE_BASE, the address space that
PyTorch, transformers, the tokenizer and their threads map of their own. (What the process maps
now says little: allocators reserve what the limit allows.) Loading a target needs its weights
plus RUNTIME_RESERVE, a tokenizer TOKENIZER_RESERVE: a failed mapping in either can abort the
process outright, with no Python error, so `target.load_target` and `target.load_tokenizer` check
first. What runs out later (a batch too large) is `out_of_memory`, which the CLI turns into a
clean error naming the limit and what to lower. No torch import at the top: the CLI's `--help` loads none.
"""

from __future__ import annotations

import contextlib
import gc
import resource
from pathlib import Path
from typing import Any

from draftsmith.errors import UserError
from draftsmith.fsutil import human_bytes

# measured on torch 2.13 (CPU build), a 2-core VM, on the tiny target: train passes under a 2.0 GB
# limit, ends in PyTorch's allocator error at 1.6 GB and aborts (a new thread, the tokenizer) at
# 1.05-1.1 GB; extract passes at 1.5 GB; prepare (a tokenizer, no model) passes at 1.3 GB and
# aborts in the tokenizer at 1.0 GB
ADDRESS_SPACE_BASE = 1 << 30
RUNTIME_RESERVE = 256 << 20
TOKENIZER_RESERVE = 128 << 20


def address_limit() -> int | None:
    """The process's address-space limit (`ulimit -v`) in bytes, or None where there is none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def available_memory(device: Any) -> int | None:
    """Bytes free for new allocations on `device` (a torch.device): the GPU's free memory, or
    the host's MemAvailable (Linux) and what an address-space limit leaves (see the module
    docstring), whichever is less; None where neither can be read."""
    if device.type == "cuda":
        import torch

        return torch.cuda.mem_get_info(device)[0]
    free = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    limit = address_limit()
    if limit is not None:
        free = max(limit - ADDRESS_SPACE_BASE, 0) if free is None else min(free, max(limit - ADDRESS_SPACE_BASE, 0))
    return free


def release_memory(device: Any = None) -> None:
    """Free what dropped objects still hold before something large is allocated: a collection
    (a target engine refers to itself through its bound methods, a cycle that reference counts
    never free), then, on a GPU, the caching allocator's unused blocks (of `device`, a CUDA
    torch.device, made current; default: whichever is)."""
    gc.collect()
    import torch

    if device is not None and device.type == "cuda":
        torch.cuda.set_device(device)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def describe_free(device: Any, free: int) -> str:
    """What limits `free` on `device`, in words: the address-space limit where it is the lesser."""
    limit = address_limit() if device.type != "cuda" else None
    if limit is not None and free <= max(limit - ADDRESS_SPACE_BASE, 0):
        return (
            f"the address-space limit (`ulimit -v`) of {human_bytes(limit)} leaves {human_bytes(free)} beside the "
            f"~{human_bytes(ADDRESS_SPACE_BASE)} PyTorch and its libraries map (raise it: `ulimit -v unlimited`)"
        )
    return f"{device} has {human_bytes(free)} free"


def check_memory(need: int, device: Any, what: str, fix: str) -> None:
    """Refuse, before it is allocated, work whose estimate `need` (bytes) exceeds the memory
    free on `device`, saying what needs it, what is free and `fix` (what to lower)."""
    free = available_memory(device)
    if free is None or need <= free:
        return
    raise UserError(f"{what} needs about {human_bytes(need)}, and {describe_free(device, free)}; {fix}")


def out_of_memory(e: BaseException) -> bool:
    """Whether `e` is running out of memory: a MemoryError, PyTorch's allocator failing (on the
    host or a GPU), or, under an address-space limit, a library that could not be mapped."""
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return True
    if isinstance(e, RuntimeError) and ("allocate memory" in str(e) or "out of memory" in str(e)):
        return True
    return isinstance(e, ImportError | SystemError) and address_limit() is not None


def memory_error(command: str, e: BaseException, lower: str) -> UserError:
    """The clean error for `draftsmith COMMAND` that ran out of memory (`out_of_memory`): what
    failed, the limit where there is one, and `lower`: what to lower and what became of the output."""
    what = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    limit = address_limit()
    if limit is None:
        return UserError(f"draftsmith {command} ran out of memory ({what}); {lower}")
    return UserError(
        f"draftsmith {command} ran out of memory ({what}) under the address-space limit (`ulimit -v`) of "
        f"{human_bytes(limit)}; raise it (`ulimit -v unlimited`) or {lower}"
    )

"""vLLM's `ExampleHiddenStatesConnector` with a synchronous copy, for vLLM's CPU build.

The stock connector copies a finished request's hidden states out of its cache into pinned
memory on a CUDA stream (`_submit_async_write`), which the CPU build cannot do
(`pin_memory=True requires a CUDA or other accelerator backend`). This one gathers the same
rows with a plain copy and writes the file in the connector's writer thread, under the same
`.lock` protocol: the lock file is created and held (LOCK_EX) before the request's path
reaches the client, and released when the file is whole.

Loaded only inside vLLM's engine (`kv_connector_module_path`, by `vllm_worker`), never by
draftsmith itself: it imports vLLM. On GPU the worker uses the stock connector.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class SyncHiddenStatesConnector(ExampleHiddenStatesConnector):
    """Writes each request's `hidden_states [T, n_slots, H]` and `token_ids [T]` like the stock
    connector, without CUDA streams or pinned memory."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)  # [n_blocks]
        offsets = torch.arange(self._block_size, dtype=torch.long)  # [block]
        slots = (blocks[:, None] * self._block_size + offsets[None, :]).flatten()  # [n_blocks*block]
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()  # [T, n_slots, H]
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        future = self._executor.submit(self._write_tensors, tensors, _Done(), pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = _Done()  # get_finished reports the request done (its blocks freed)
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))


class _Done:
    """Stands in for the CUDA event of the stock connector's copy: this copy is already done."""

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

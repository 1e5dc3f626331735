"""Where this process stands in a `torchrun` job, read from the environment torchrun sets.

    rank, world, local_rank = dist_env()     # (0, 1, 0) when not under torchrun

Used by synth and extract (each rank takes its share of the samples) and train (DDP / FSDP2).
"""

from __future__ import annotations

import os
from typing import NamedTuple


class DistEnv(NamedTuple):
    rank: int  # this process among all (RANK)
    world: int  # processes in the job (WORLD_SIZE)
    local_rank: int  # this process on its host: its GPU (LOCAL_RANK)


def dist_env() -> DistEnv:
    return DistEnv(
        int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    )

"""torch.distributed in one place: is this a torchrun job, which rank am I, set-up once."""

from __future__ import annotations

import atexit
import os

import torch
import torch.distributed as dist

from ..errors import ConfigError


def launched() -> bool:
    """True under torchrun (or any launcher that sets WORLD_SIZE/RANK)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def ensure_process_group(device: torch.device) -> tuple[int, int]:
    """(rank, world size), initialising the default process group on first use."""
    if not dist.is_initialized():
        if not launched():
            raise ConfigError("--backend distributed needs a launcher: torchrun --nproc-per-node K -m flatcheck ...")
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        # A process group left to the interpreter's teardown can have its worker threads
        # destroyed while still joinable, which aborts the rank (SIGABRT, "terminate called
        # without an active exception") after its work is done, so torchrun reports a failure.
        atexit.register(_close_process_group)
    return dist.get_rank(), dist.get_world_size()


def _close_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_main_process() -> bool:
    """Only rank 0 prints results and writes files."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


def local_cuda_device() -> torch.device:
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))

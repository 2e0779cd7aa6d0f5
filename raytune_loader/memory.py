"""Memory a candidate configuration needs, checked before it starts.

A DataLoader holds ``num_workers x prefetch_factor`` batches in flight, in shared
memory (``/dev/shm``) and, when pinned, twice in host memory. :func:`check_memory`
refuses a configuration whose batches would not fit, with the reason that
``trials.csv`` records (``host_memory``, ``shm``). :func:`cap_gpu_memory` holds a
measurement to its share of a GPU's memory (and gives a reused process the whole
GPU back).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from raytune_loader.errors import TrialRefusedError
from raytune_loader.space import LoaderConfig

log = logging.getLogger(__name__)
SHM_SHARE = 0.5  # of free /dev/shm a trial may fill; Ray's object store lives there too
RAM_SHARE = 0.5  # of available RAM


def sample_nbytes(sample: Any) -> int:
    """Bytes of the tensors in one collated-to-be sample."""
    if isinstance(sample, torch.Tensor):
        return sample.element_size() * sample.numel()
    if isinstance(sample, (tuple, list)):
        return sum(sample_nbytes(item) for item in sample)
    if isinstance(sample, dict):
        return sum(sample_nbytes(item) for item in sample.values())
    return 8  # a Python number becomes one int64/float64


def bytes_in_flight(config: LoaderConfig, sample_bytes: int) -> tuple[int, int]:
    """(host bytes, /dev/shm bytes) held by batches the loader has prepared ahead."""
    batch = sample_bytes * config.batch_size
    batches = config.num_workers * (config.prefetch_factor or 0) if config.num_workers else 1
    host = batch * batches * (2 if config.pin_memory else 1)
    shm = batch * batches if config.num_workers and config.workers == "process" else 0
    return host, shm


def check_memory(
    config: LoaderConfig, sample_bytes: int, available_ram: int, free_shm: int | None
) -> int:
    """Refuse a configuration that would not fit; returns its host bytes in flight."""
    host, shm = bytes_in_flight(config, sample_bytes)
    return check_bytes(config.label(), host, shm, available_ram, free_shm)


def check_bytes(
    label: str,
    host: int,
    shm: int,
    available_ram: int,
    free_shm: int | None,
    holder: str = "batches",
) -> int:
    """Refuse a candidate (``label``) that would hold ``host`` bytes in host memory and
    ``shm`` in ``/dev/shm`` (its ``holder``'s: the batches, or Ray's object store),
    beyond their shares of what is free; returns ``host``."""
    if host > RAM_SHARE * available_ram:
        raise TrialRefusedError(
            "host_memory",
            f"{label} would hold {host / 2**20:.0f} MiB of batches in host memory, "
            f"more than half of the {available_ram / 2**20:.0f} MiB available",
        )
    if free_shm is not None and shm > SHM_SHARE * free_shm:
        fix = (
            "fewer workers or a smaller prefetch_factor"
            if holder == "batches"
            else "a smaller object_store_bytes, map_batch_size or prefetch_batches"
        )
        raise TrialRefusedError(
            "shm",
            f"{label} would put {shm / 2**20:.0f} MiB of {holder} in /dev/shm, which has "
            f"{free_shm / 2**20:.0f} MiB free; raise it (docker run --shm-size=8g) or use "
            f"{fix}",
        )
    return host


def cap_gpu_memory(share: float, device: torch.device) -> float | None:
    """Hold this process to ``share`` of the GPU's memory (``--gpus-per-trial`` below 1),
    or give it the whole GPU again (a share of 1, or none).

    Two trials at ``--gpus-per-trial 0.5`` would otherwise take memory first come,
    first served, and one of them would back off (or fail) depending on timing.
    The ceiling and the verification runs get the same cap, so every measurement
    of a search backs off at the same batch size. The cap is the allocator's, and
    so the process's: a Ray worker that measured a trial at half the GPU and then
    verifies with the whole GPU would keep the half without the reset. Returns the
    share of memory the process may now use, or None off CUDA.
    """
    if device.type != "cuda":
        return None
    fraction = share if 0 < share < 1 else 1.0
    index = torch.cuda.current_device() if device.index is None else device.index
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    if fraction < 1:
        log.info("GPU memory capped at %.0f%% (--gpus-per-trial)", fraction * 100)
    return fraction

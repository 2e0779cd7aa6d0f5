"""Memory a candidate configuration needs, checked before it starts.

What a candidate holds in flight is its engine's to say
(:meth:`~raytune_loader.engines.base.Engine.held`); :func:`check_bytes` refuses a
candidate whose batches would not fit, with the reason that ``trials.csv`` records
(``host_memory``, ``shm``). :func:`cap_gpu_memory` holds a
measurement to its share of a GPU's memory (and gives a reused process the whole
GPU back).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from raytune_loader.engines.base import Held
from raytune_loader.errors import TrialRefusedError

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


def check_bytes(label: str, held: Held, available_ram: int, free_shm: int | None) -> int:
    """Refuse a candidate (``label``) whose batches in flight (``held``: by its engine,
    :meth:`~raytune_loader.engines.base.Engine.held`) would take more than their shares of
    the available host memory and free ``/dev/shm``; returns its host bytes."""
    if held.host > RAM_SHARE * available_ram:
        raise TrialRefusedError(
            "host_memory",
            f"{label} would hold {held.host / 2**20:.0f} MiB of batches in host memory, "
            f"more than half of the {available_ram / 2**20:.0f} MiB available",
        )
    if free_shm is not None and held.shm > SHM_SHARE * free_shm:
        raise TrialRefusedError(
            "shm",
            f"{label} would put {held.shm / 2**20:.0f} MiB of {held.holder} in /dev/shm, which "
            f"has {free_shm / 2**20:.0f} MiB free; raise it (docker run --shm-size=8g) or use "
            f"{held.fix}",
        )
    return held.host


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

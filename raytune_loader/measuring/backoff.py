"""Batch-size back-off on CUDA out-of-memory, kept apart from CUDA itself.

:func:`run_with_backoff` calls ``run(batch_size)``; when it raises
``torch.cuda.OutOfMemoryError`` (and only that), the memory is released, the
batch size halved and ``run`` called again, down to ``min_batch_size``. Any
other exception passes through untouched. Because ``run`` and ``release`` are
parameters, a CPU test drives the exact sequence of batch sizes tried.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from raytune_loader.errors import BatchSizeTooSmallError

log = logging.getLogger(__name__)
T = TypeVar("T")


def release_cuda_memory() -> None:
    """Drop unreachable tensors and hand cached CUDA blocks back to the driver."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class BackoffOutcome(Generic[T]):
    """What a run with back-off gave: its value, the batch size asked for, and every batch size
    tried (the last is the one that fit)."""

    value: T
    requested_batch_size: int
    tried: tuple[int, ...]

    @property
    def effective_batch_size(self) -> int:
        """The batch size that fit."""
        return self.tried[-1]

    @property
    def backoffs(self) -> int:
        """How many times the batch was halved."""
        return len(self.tried) - 1


def run_with_backoff(
    run: Callable[[int], T],
    batch_size: int,
    min_batch_size: int = 1,
    release: Callable[[], None] = release_cuda_memory,
) -> BackoffOutcome[T]:
    """Run at ``batch_size``, halving it on CUDA out-of-memory down to ``min_batch_size``."""
    tried: list[int] = []
    current = batch_size
    while True:
        tried.append(current)
        out_of_memory = False
        try:
            return BackoffOutcome(run(current), batch_size, tuple(tried))
        except torch.cuda.OutOfMemoryError:
            # Leave the except block first: the traceback pins the step's tensors.
            out_of_memory = True
        if out_of_memory:
            release()
            if current // 2 < max(1, min_batch_size):
                raise BatchSizeTooSmallError(
                    f"CUDA out of memory at batch size {current} (tried {tried}); "
                    f"the minimum batch size is {min_batch_size}: use a smaller model, "
                    "a smaller --min-batch-size or more --gpus-per-trial"
                )
            log.info("CUDA out of memory at batch size %d; retrying at %d", current, current // 2)
            current //= 2

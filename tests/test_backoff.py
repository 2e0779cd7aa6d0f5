from __future__ import annotations

import pytest
import torch

from raytune_loader.errors import BatchSizeTooSmallError
from raytune_loader.measuring.backoff import run_with_backoff


def _step_that_fits_up_to(limit: int, tried: list[int]):
    def run(batch_size: int) -> str:
        tried.append(batch_size)
        if batch_size > limit:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory at {batch_size}")
        return f"trained at {batch_size}"

    return run


def test_halves_until_it_fits_and_records_the_sequence() -> None:
    tried: list[int] = []
    releases: list[int] = []
    outcome = run_with_backoff(
        _step_that_fits_up_to(40, tried), 256, min_batch_size=8, release=lambda: releases.append(1)
    )
    assert tried == [256, 128, 64, 32]
    assert outcome.tried == (256, 128, 64, 32)
    assert outcome.value == "trained at 32"
    assert (outcome.requested_batch_size, outcome.effective_batch_size) == (256, 32)
    assert outcome.backoffs == 3
    assert len(releases) == 3  # memory released after every out-of-memory


def test_no_backoff_when_it_fits() -> None:
    tried: list[int] = []
    outcome = run_with_backoff(_step_that_fits_up_to(512, tried), 64, release=lambda: None)
    assert tried == [64] and outcome.backoffs == 0


def test_stops_at_the_minimum_batch_size() -> None:
    tried: list[int] = []
    with pytest.raises(BatchSizeTooSmallError, match="minimum batch size is 16"):
        run_with_backoff(
            _step_that_fits_up_to(4, tried), 64, min_batch_size=16, release=lambda: None
        )
    assert tried == [64, 32, 16]


def test_other_errors_pass_through_untouched() -> None:
    error = RuntimeError("CUDA error: an illegal memory access was encountered")

    def run(batch_size: int) -> None:
        raise error

    with pytest.raises(RuntimeError) as caught:
        run_with_backoff(run, 64, release=lambda: pytest.fail("released on a non-OOM error"))
    assert caught.value is error

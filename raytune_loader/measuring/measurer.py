"""The seam every consumer measures through: :class:`Measurer`.

The search, the bench and the experiments measure one configuration, the ceiling, the
input pipeline alone or the profile through one protocol: the search's measurer starts
Ray tasks with their own bundles (:class:`raytune_loader.tuning.tuner.RayMeasurer`);
:class:`LocalMeasurer` runs in this process. :func:`measure_ceilings` measures the model
on a resident batch per batch size, through either.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import (
    CORRUPT_FIX,
    DatasetError,
    SearchFailedError,
    UserInputError,
    corrupt_said,
    last_line,
)
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.measure import CEILING_WINDOWS
from raytune_loader.measuring.outcomes import InputRate, TrialOutcome
from raytune_loader.measuring.profile import Profile, profile
from raytune_loader.measuring.ranks import measure_ceiling, measure_input, run_trial
from raytune_loader.progress import Progress

log = logging.getLogger(__name__)


class Measurer(Protocol):
    """How a consumer measures: one candidate, the ceiling, the input pipeline alone, or
    the profile, each on ``job``."""

    def measure(self, job: TrialJob, config: LoaderConfig, slot: int = 0) -> TrialOutcome:
        """One measurement of ``config`` (``slot``: which disjoint subset a ``--cold`` run
        reads)."""
        ...

    def ceiling(
        self, job: TrialJob, batch_size: int, windows: int = CEILING_WINDOWS
    ) -> tuple[int, float]:
        """(effective batch size, samples/s) of the model on a resident batch, the best
        of ``windows``."""
        ...

    def input_rate(self, job: TrialJob, config: LoaderConfig) -> InputRate:
        """``config``'s input pipeline alone, with no model."""
        ...

    def profile(self, job: TrialJob, structures: list[LoaderConfig], cores: int) -> Profile:
        """What each stage of ``structures`` costs, on ``cores`` cores."""
        ...


class LocalMeasurer(Measurer):
    """Measurements in this process, one at a time, with the whole machine."""

    def measure(self, job: TrialJob, config: LoaderConfig, slot: int = 0) -> TrialOutcome:
        return run_trial(job, config, slot=slot)

    def ceiling(
        self, job: TrialJob, batch_size: int, windows: int = CEILING_WINDOWS
    ) -> tuple[int, float]:
        return measure_ceiling(job, batch_size, windows)

    def input_rate(self, job: TrialJob, config: LoaderConfig) -> InputRate:
        return measure_input(job, config)

    def profile(self, job: TrialJob, structures: list[LoaderConfig], cores: int) -> Profile:
        return profile(job, structures, cores)


def measure_ceilings(
    job: TrialJob,
    batch_sizes: Sequence[int],
    measurer: Measurer,
    progress: Progress,
    required: bool = True,
) -> dict[int, float]:
    """Samples/s on a resident batch, by the batch size that fit.

    ``required``: a failure ends the search (SearchFailedError); otherwise it is
    warned about and that batch size has no ceiling (the bench).
    """
    what = "measuring the ceiling (model on a resident batch)"
    ceilings: dict[int, float] = {}
    for i, batch_size in enumerate(batch_sizes):
        progress.count(what, i, len(batch_sizes))
        try:
            effective, speed = measurer.ceiling(job, batch_size)
        except UserInputError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever failed, there is no ceiling
            said = corrupt_said(last_line(exc))
            if required and said:  # the data is at fault, not the search
                raise DatasetError(
                    f"cannot measure the model's ceiling on a {said}; {CORRUPT_FIX}"
                ) from None
            if required:
                raise SearchFailedError(
                    f"cannot measure the model's ceiling: {last_line(exc)}"
                ) from None
            progress.warn(f"cannot measure the ceiling at batch size {batch_size}: {exc}")
            continue
        ceilings[effective] = max(speed, ceilings.get(effective, 0.0))
        if effective != batch_size:
            progress.warn(f"ceiling: batch size {batch_size} ran out of memory; {effective} fits")
    progress.count(what, len(batch_sizes), len(batch_sizes))
    return ceilings

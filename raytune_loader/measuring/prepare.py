"""Making the data ready before any measurement: :func:`prepare_data`.

Generates the default dataset if needed, checks the data (one sample through the
pipeline), and pre-warms what the trials read (the subset of samples, or a stream's
shards, counted as they are read) so that, without ``--cold``, every measurement starts
from the same page-cache state. The search, the bench and the experiments call it
once, before Ray starts.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from raytune_loader.errors import DatasetError
from raytune_loader.measuring import shards
from raytune_loader.measuring.job import TrialJob
from raytune_loader.progress import LogProgress, Progress
from raytune_loader.sources import datasets
from raytune_loader.sources.base import prewarm

log = logging.getLogger(__name__)


def prepare_data(job: TrialJob, largest_batch: int, progress: Progress | None = None) -> TrialJob:
    """Generate the default dataset if needed, check the data, pre-warm what the trials
    read (the subset of samples, or of a stream's shards), and return the job ready to
    measure. Without ``--cold`` every measurement then starts from the same page-cache
    state."""
    progress = progress or LogProgress()
    spec = job.dataset
    datasets.prepare(spec, progress)
    accesses = spec.source.accesses(spec)
    if "stream" in accesses:
        job = shards.prepare_stream(job, largest_batch, progress)
    if "map" in accesses:
        job = _prepare_map(job, largest_batch, progress)
    return job


def _prepare_map(job: TrialJob, largest_batch: int, progress: Progress) -> TrialJob:
    spec = job.dataset
    full = datasets.build_dataset(spec)
    job = replace(job, listing=datasets.listing_of(full))  # handed on: listed once
    length = len(full)  # type: ignore[arg-type]
    if min(length, job.samples_per_trial) < largest_batch:
        raise DatasetError(
            f"{spec.name} has {length} samples, fewer than one batch of {largest_batch}; "
            "use a smaller --batch-size or more data"
        )
    # the user's own step takes batches of any structure; a store may refuse them all
    datasets.check_sample(spec, full, pairs=not job.train_step)
    read = largest_batch * (min(job.segment.warmup_steps, 1) + job.segment.steps)
    if job.cold and job.samples_per_trial < read:
        progress.warn(
            f"--cold: a trial reads at least {read} samples but its block holds "
            f"{job.samples_per_trial}, so it reads some twice, from the page cache; "
            f"raise --samples-per-trial to {read} for every read to be cold"
        )
    indices = datasets.subset_indices(length, job.samples_per_trial, job.seed)
    files = datasets.sample_files(spec, full, indices)
    if files and not job.cold:
        progress.stage(f"Pre-warming {len(files)} files of the trial subset")
        log.info("pre-warmed %.1f MB", prewarm(files) / 1e6)
    return job

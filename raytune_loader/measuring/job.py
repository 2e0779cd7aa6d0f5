"""The job every measurement of a search repeats: :class:`TrialJob`, built in one place.

A trial, the ceiling, a verification run, the bench and the experiments all
train the same model on the same subset for the same segment; only the loader
configuration changes. :func:`job_from_options` builds that job from
:class:`~raytune_loader.tuning.options.SearchOptions` (the search's, or the ones the
bench rebuilds from ``best_config.json``); :mod:`raytune_loader.measuring.prepare` makes its
data ready. A new knob of the job is a field here, an option there, and one line in
:func:`job_from_options`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.sources import datasets

log = logging.getLogger(__name__)
DATA_SLOT = "data_slot"  # Tune config key: which disjoint subset a --cold trial reads


@dataclass(frozen=True)
class SegmentSpec:
    """Length and fixed settings of the measured training segment (same for every trial)."""

    # the command line's defaults (SearchOptions reads them from here), written once
    warmup_steps: int = 5
    steps: int = 48
    report_every: int = 16
    compute_threads: int = 1
    loader_timeout_s: float = 120.0
    time_limit_s: float = 600.0  # slower: ends with reason "timeout"
    watch: bool = True  # its processes watched (watch.Watcher); off to measure what that costs

    @property
    def loader_timeout(self) -> float:
        """DataLoader's ``timeout``: a batch slower than this fails the trial."""
        return min(self.loader_timeout_s, self.time_limit_s)

    @property
    def give_up_s(self) -> float:
        """When whoever waits for a measurement gives up on it: the time limit, plus a
        grace (up to a minute) for starting processes and reporting the limit itself."""
        return self.time_limit_s + min(60.0, self.time_limit_s)

    @property
    def reports(self) -> int:
        """Interim reports plus the final one: ASHA's ``max_t``."""
        return max(1, -(-self.steps // self.report_every))


@dataclass(frozen=True)
class TrialJob:
    """Everything a measurement needs besides its candidate configuration."""

    dataset: datasets.DatasetSpec
    model: str
    segment: SegmentSpec
    device: str = "cpu"
    samples_per_trial: int = 1024  # the command line's defaults, as SegmentSpec's
    seed: int = 0
    min_batch_size: int = 1
    cpus_per_worker: float = 1.0
    node_cpus: float = 1.0
    ceilings: dict[int, float] = field(default_factory=dict)
    cold: bool = False
    gpu_memory_share: float = 1.0  # of the GPU's memory each measurement may use
    precision: str | None = "fp32"  # fp32, tf32, bf16, fp16; None: torch's flags untouched
    channels_last: bool = False
    compile: bool = False  # torch.compile the model; compiled during warm-up
    train_step: str | None = None  # the user's module:function step factory
    ranks: int = 1  # data-parallel ranks of every measurement, each with its own loader
    stream_shards: int = (
        0  # shards a trial reads, for a stream that has them (prepare.prepare_data)
    )
    stream_workers: int | None = None  # the most loader workers a rank's stream can keep busy
    stream_note: str | None = None  # why, when that bound binds
    # what the source listed before any trial (an object store's keys), handed to each
    # measurement so that no trial, rank or worker lists the store again
    listing: Any = field(default=None, compare=False, repr=False)
    cache_bytes: int | None = None  # a cache candidate's budget (None: half the disk's free)
    # a folder the search's cache trials share, the first one's cold pass filling it
    # (measure.cold_pass); None (verification, the input alone, the probes): each
    # measurement fills a cache of its own
    shared_cache: str | None = None

    def cpus_for(self, num_workers: int) -> float:
        """CPUs a measurement with ``num_workers`` loader workers per rank reserves."""
        return reserved_cpus(num_workers, self.cpus_per_worker, self.node_cpus, self.ranks)

    def cpus_reserved(self, config: LoaderConfig) -> float:
        """CPUs a measurement of ``config`` reserves in all: its own bundle's
        (:meth:`cpus_for`) and a Ray Data candidate's actors' (on other nodes)."""
        return self.cpus_for(config.num_workers) + config.actor_cpus


def reserved_cpus(
    num_workers: int, cpus_per_worker: float, node_cpus: float, ranks: int = 1
) -> float:
    """CPUs a trial reserves: each of its ranks plus that rank's workers, never more than
    the node has."""
    return min(ranks * (1 + cpus_per_worker * num_workers), node_cpus)

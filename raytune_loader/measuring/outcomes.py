"""What a measurement returns: the figures of its window, its ranks, its outcome.

:class:`SegmentMetrics` holds a measured window's figures, each declared once with
how several ranks' values make the node's (:func:`merge_ranks` reads it), and which
go flat into Tune's reports and ``trials.csv`` (:meth:`SegmentMetrics.figures`; the
trial record and the CSV's columns are derived from them). :class:`TrialOutcome` is
one measurement: its figures, or the reason it failed, against a ceiling;
:class:`InputRate` the input pipeline alone. Every layer above the measurement reads
these types, without importing the measurement itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.machine.watch import Watch
from raytune_loader.measuring import steady
from raytune_loader.measuring.memoryfit import MemoryFit

_REQUIRED = dataclasses.MISSING


def _figure(merge: str, default: Any = _REQUIRED, *, flat: bool = True) -> Any:
    """A field of :class:`SegmentMetrics`: ``merge`` names how ranks' values make the
    node's (:data:`MERGES`); ``flat`` figures go into reports and ``trials.csv``."""
    return field(default=default, metadata={"merge": merge, "flat": flat},
                 repr=flat, compare=flat)  # fmt: skip


def _known(values: Sequence[Any]) -> list[Any]:
    return [v for v in values if v is not None]


def _total(values: Sequence[Any]) -> Any:
    return None if any(v is None for v in values) else sum(values)


def _all(values: Sequence[Any]) -> bool | None:
    known = _known(values)
    return None if not known else all(known)


def _farthest(values: Sequence[Any]) -> float | None:
    known = _known(values)
    return max(known, key=lambda r: max(r, 1 / r)) if known else None


# How several ranks' values of one figure make the node's: each gets every rank's value
# (in rank order) and the index of the slowest rank and of the one that waited most.
MERGES: dict[str, Callable[[Sequence[Any], int, int], Any]] = {
    "rate": lambda values, slowest, _: len(values) * values[slowest],  # N x the slowest's
    "slowest": lambda values, slowest, _: values[slowest],  # the slowest rank's
    "worst": lambda values, *_: max(_known(values), default=None),  # the highest
    "least": lambda values, *_: min(_known(values), default=None),  # the lowest
    # N x the lowest: a rate measured outside the window, as the node's (as "rate")
    "ranks_x_least": lambda values, *_: (
        len(values) * min(_known(values)) if _known(values) else None
    ),
    "total": lambda values, *_: _total(values),  # together (unknown if one is)
    "all": lambda values, *_: _all(values),  # true only when every rank's is
    "farthest": lambda values, *_: _farthest(values),  # the ratio farthest from 1
    "first": lambda values, *_: values[0],  # rank 0's
    "most_waiting": lambda values, _, waited: values[waited],  # the rank that waited most
}


@dataclass(frozen=True)
class SegmentMetrics:
    """A measured window's figures (docs/measurement.md; ``trials.csv``'s columns in
    docs/outputs.md). A new figure is one field here and its value where the window
    computes it."""

    samples_per_s: float = _figure("rate")  # samples over the window's steady wall time
    data_wait_frac: float = _figure("worst")  # share of the window waiting for a batch
    util: float = _figure("least")  # NVML's on CUDA; on a CPU, the rate over the ceiling
    util_source: str = _figure("slowest")
    device_util: float | None = _figure("slowest")  # the whole device's, where NVML read it
    samples: int = _figure("total")  # samples trained in the window
    wall_s: float = _figure("worst")  # the window's steady wall time
    steady: bool | None = _figure("all", None)  # the halves agreed (steady.STEADY_TOLERANCE)
    steady_ratio: float | None = _figure("farthest", None)  # first half's rate / second's
    first_batch_s: float | None = _figure("worst", None)  # iter(loader) to a first batch
    epoch_start_s: float | None = _figure("worst", None)  # an epoch's end to the next's batch
    data_wait_p50_s: float | None = _figure("worst", None)  # a step's wait: median
    data_wait_p99_s: float | None = _figure("worst", None)  # and 99th percentile
    data_wait_tail_frac: float | None = _figure("worst", None)  # lost to waits > 2 x median
    memory_growth_per_sample: float | None = _figure("total", None)  # bytes per sample read
    projected_epoch_growth_bytes: int | None = _figure("total", None)  # one epoch adds this
    watched_bytes: int | None = _figure("total", None)  # the processes' PSS at the end
    memory_free_bytes: int | None = _figure("least", None)  # the node's available memory
    worker_thread_count: int | None = _figure("worst", None)  # threads of the busiest worker
    worker_busy_threads: float | None = _figure("worst", None)  # busy threads per worker
    worker_cpu_s: float | None = _figure("total", None)  # the workers' CPU seconds
    # a Ray Data candidate's (raydata.PipelineWatch): what its object store and actors held
    store_spilled_bytes: int | None = _figure("total", None)  # Ray spilled in the window
    actor_rss_bytes: int | None = _figure("worst", None)  # an actor's resident memory, at most
    actor_free_bytes: int | None = _figure("least", None)  # its node's available memory, least
    actor_uss_ray_bytes: int | None = _figure("worst", None)  # Ray Data's figure: max task USS
    backpressure_s: float | None = _figure("worst", None)  # the executor held tasks back
    # an object store's (stores.StoreWatch): what the window asked of it
    store_requests: int | None = _figure("total", None)  # GETs answered in the window
    store_throttled: int | None = _figure("total", None)  # retried: the store said slow down
    store_timeouts: int | None = _figure("total", None)  # retried: timed out
    store_resets: int | None = _figure("total", None)  # retried: connection dropped
    store_request_s: float | None = _figure("worst", None)  # a GET's mean time, whole
    store_in_flight: float | None = _figure("total", None)  # requests in flight, on average
    # a local object cache's candidate (measure.cold_pass): its first, cold epoch apart
    cold_samples_per_s: float | None = _figure("ranks_x_least", None)  # the cold pass's
    cold_store_requests: int | None = _figure("total", None)  # its GETs (the window's: warm)
    watch: Watch | None = _figure("first", None, flat=False)  # all the watcher read
    memory: MemoryFit | None = _figure("first", None, flat=False)  # its fit
    waits: tuple[float, ...] = _figure("most_waiting", (), flat=False)  # each step's wait

    def figures(self) -> dict[str, Any]:
        """The flat figures (Tune reports, trials.csv)."""
        return {name: getattr(self, name) for name in FIGURES}

    @classmethod
    def from_figures(cls, values: dict[str, Any]) -> SegmentMetrics | None:
        """From a flat report (Tune's boundary); None when it has no rate."""
        if values.get("samples_per_s") is None:
            return None
        found = {name: values.get(name) for name in FIGURES}
        return cls(**found)

    def rebased(self, ceiling: float) -> SegmentMetrics:
        """On a CPU ``util`` is a share of the ceiling: against another one (the search's
        final one), so one ceiling serves every run."""
        if self.util_source != "step-timing":
            return self
        return replace(self, util=self.samples_per_s / ceiling)


FIGURES = tuple(f.name for f in fields(SegmentMetrics) if f.metadata["flat"])


def merge_ranks(metrics: Sequence[SegmentMetrics]) -> SegmentMetrics:
    """Several ranks' windows as the node's, each figure by its declared merge."""
    slowest = min(range(len(metrics)), key=lambda i: metrics[i].samples_per_s)
    waited = max(range(len(metrics)), key=lambda i: metrics[i].data_wait_frac)
    return SegmentMetrics(**{
        f.name: MERGES[f.metadata["merge"]]([getattr(m, f.name) for m in metrics],
                                            slowest, waited)
        for f in fields(SegmentMetrics)
    })  # fmt: skip


@dataclass(frozen=True)
class RankStat:
    """One rank of a measurement with several (``--ranks-per-node``)."""

    rank: int
    samples_per_s: float
    data_wait_frac: float
    host: str
    pid: int
    started: float  # wall clock of the rank's start and end
    ended: float


def efficiency(samples_per_s: float | None, ceiling: float | None) -> float | None:
    """A rate's share of the ceiling (the model on a resident batch)."""
    if samples_per_s is None or not ceiling:
        return None
    return samples_per_s / ceiling


@dataclass(frozen=True)
class TrialOutcome:
    """A finished trial: its metrics, or the reason it failed."""

    config: LoaderConfig
    cpus_reserved: float
    host_bytes_in_flight: int
    metrics: SegmentMetrics | None = None
    effective_batch_size: int | None = None
    oom_backoffs: int = 0
    ceiling_samples_per_s: float | None = None
    failure: str | None = None
    detail: str | None = None
    ranks: tuple[RankStat, ...] = ()  # with several ranks: each one's figures

    @property
    def efficiency(self) -> float | None:
        """Samples/s over the ceiling at the batch size trained (None without both)."""
        speed = self.metrics.samples_per_s if self.metrics else None
        return efficiency(speed, self.ceiling_samples_per_s)

    @property
    def beyond_bound(self) -> str | None:
        """Why this run's figure cannot be right: it beat the ceiling (the model on a
        resident batch) beyond noise; None when it did not."""
        if self.metrics is None:
            return None
        return steady.above_ceiling(self.metrics.samples_per_s, self.ceiling_samples_per_s)

    def rebased(self, ceiling: float | None) -> TrialOutcome:
        """This run against another ceiling (the search's final one)."""
        if self.metrics is None or not ceiling:
            return self
        return replace(self, metrics=self.metrics.rebased(ceiling), ceiling_samples_per_s=ceiling)

    def as_report(self) -> dict[str, Any]:
        """Flat metrics for Tune, trials.csv and the JSON."""
        out: dict[str, Any] = {
            "cpus_reserved": self.cpus_reserved,
            "host_bytes_in_flight": self.host_bytes_in_flight,
            "effective_batch_size": self.effective_batch_size,
            "oom_backoffs": self.oom_backoffs,
            "ceiling_samples_per_s": self.ceiling_samples_per_s,
            "efficiency": self.efficiency,
            "bounds": self.beyond_bound or "",
            "failure": self.failure or "",
            "detail": self.detail or "",
            "final": True,
        }
        if self.ranks:
            out.update(rank_columns(self.ranks))
        if self.metrics is not None:
            out.update(self.metrics.figures())
        else:  # a failed configuration is the worst possible for the searcher
            out.update(samples_per_s=0.0, data_wait_frac=1.0, util=0.0, util_source="")
        return out


def rank_columns(ranks: tuple[RankStat, ...]) -> dict[str, Any]:
    """Per-rank figures as flat columns (values joined by ``;``, in rank order)."""
    speeds = [r.samples_per_s for r in ranks]

    def joined(values: list[Any], form: str = "{}") -> str:
        return ";".join(form.format(v) for v in values)

    return {
        "ranks": len(ranks),
        "slowest_rank": speeds.index(min(speeds)),
        "rank_samples_per_s": joined(speeds, "{:.1f}"),
        "rank_data_wait_frac": joined([r.data_wait_frac for r in ranks], "{:.3f}"),
        "rank_hosts": joined([r.host for r in ranks]),
        "rank_windows": joined([f"{r.started:.3f}-{r.ended:.3f}" for r in ranks]),
    }


@dataclass(frozen=True)
class InputRate:
    """The input pipeline alone, no model: where the limit of a configuration is."""

    samples_per_s: float  # the loader and the device-side stages, nothing trained
    per_core: float  # the worker-side stages (decode, augment) on one core

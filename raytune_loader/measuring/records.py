"""One finished trial as every consumer sees it: :class:`TrialRecord`, and ``trials.csv``.

Tune hands back plain dicts; :func:`record_from_report` turns a trial's config
and last report into a typed record once, at the Ray boundary
(:mod:`raytune_loader.tuning.tuner` calls it), and everything downstream (verification,
``best_config.json``, the command line's notes, the CSV) reads records. The
trial's status is derived here and only here (:func:`trial_status`), for the
CSV and for the live progress lines alike. The CSV schema is the record's
fields, next to the code that writes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from raytune_loader.candidates.config import CONFIG_KEYS, LoaderConfig
from raytune_loader.errors import ConfigError
from raytune_loader.files import write_csv
from raytune_loader.measuring.outcomes import FIGURES, SegmentMetrics, TrialOutcome, efficiency
from raytune_loader.measuring.steady import above_ceiling

PREDICTED = "predicted_samples_per_s"  # the cost model's, in a trial's config and trials.csv

MEASURED = ("ok", "stopped_early")
FAILED = ("failed", "error")


def trial_status(metrics: dict[str, Any], errored: bool) -> str:
    """``ok``, ``stopped_early`` (ASHA), ``failed`` (a recorded reason), ``error`` (the
    trial raised) or ``interrupted`` (Ctrl-C before it ended), from its last report."""
    if errored:
        return "error"
    if metrics.get("failure"):
        return "failed"
    if metrics.get("final"):
        return "ok"
    if metrics.get("done"):  # Tune marks a trial done when ASHA stops it
        return "stopped_early"
    return "interrupted"


@dataclass(frozen=True)
class NodeFacts:
    """Where a trial ran and that node's hardware class (``trials.csv`` columns)."""

    node_id: str | None = None
    hostname: str | None = None
    hardware_class: str | None = None
    cpu_model: str | None = None
    node_cpus: float | None = None
    gpu_name: str | None = None
    node_gpus: float | None = None
    ram_bytes: int | None = None
    cuda_visible_devices: str | None = None


@dataclass(frozen=True)
class TrialRecord:
    """A trial of the search: its configuration, status and last measured figures.

    Attributes:
        Each field is a column of ``trials.csv`` (``docs/outputs.md``), except three
        whose values are spread into columns of their own: ``config`` (the loader's
        settings; None for a trial interrupted before Tune saved it), ``metrics`` (the
        figures of the trial's last report) and ``node`` (the facts of its node).
    """

    trial_id: str
    status: str
    reason: str = ""
    baseline: str = ""
    config: LoaderConfig | None = None  # None: interrupted before Tune saved its config
    effective_batch_size: int | None = None
    oom_backoffs: int | None = None
    cpus_reserved: float | None = None
    host_bytes_in_flight: int | None = None
    ceiling_samples_per_s: float | None = None
    metrics: SegmentMetrics | None = None  # its last report's figures (outcomes.FIGURES)
    predicted_samples_per_s: float | None = None  # the cost model's, for a model search
    training_iteration: int | None = None
    time_total_s: float | None = None
    finished_at: float | None = None
    ranks: int | None = None  # with several ranks per trial: the per-rank figures
    slowest_rank: int | None = None
    rank_samples_per_s: str | None = None
    rank_data_wait_frac: str | None = None
    rank_hosts: str | None = None
    rank_windows: str | None = None  # start-end wall clock of each rank
    node: NodeFacts = NodeFacts()

    @property
    def samples_per_s(self) -> float | None:
        """The trial's steady samples/s (None where it failed)."""
        return self.metrics.samples_per_s if self.metrics else None

    @property
    def efficiency(self) -> float | None:
        """Samples/s over the ceiling (None without both)."""
        return efficiency(self.samples_per_s, self.ceiling_samples_per_s)

    @property
    def bounds(self) -> str | None:
        """Why its figure cannot be right (above the ceiling beyond noise), if so."""
        return above_ceiling(self.samples_per_s, self.ceiling_samples_per_s)

    @property
    def steady(self) -> bool | None:
        """Whether its window's halves agreed (None: too short to tell, or failed)."""
        return self.metrics.steady if self.metrics else None

    def objective(self, name: str) -> float | None:
        """The value of objective ``name`` (a figure, or ``efficiency``).

        Args:
            name: ``util``, ``samples_per_s`` or ``efficiency``.

        Returns:
            The trial's value, or None where it has none (it failed).
        """
        value = getattr(self.metrics, name, None) if name in FIGURES else getattr(self, name)
        return None if value is None else float(value)

    @property
    def trusted(self) -> bool:
        """Its window was steady (or too short to tell) and its figure within bounds: a
        trial that may be ranked."""
        return self.steady is not False and not self.bounds

    @property
    def span(self) -> tuple[float, float] | None:
        """When the trial ran (wall clock, start and end; None where Tune did not say)."""
        if self.finished_at is None or self.time_total_s is None:
            return None
        return self.finished_at - self.time_total_s, self.finished_at

    def outcome(self) -> TrialOutcome | None:
        """The trial's window as one measurement of its configuration, as verification
        takes one (None where it has no figures, no configuration, or several ranks,
        whose figures are the slowest rank's).

        Returns:
            The outcome, against the ceiling the trial ran beside.
        """
        if self.metrics is None or self.config is None or (self.ranks or 1) > 1:
            return None
        return TrialOutcome(
            self.config,
            self.cpus_reserved or 0.0,
            self.host_bytes_in_flight or 0,
            metrics=self.metrics,
            effective_batch_size=self.effective_batch_size,
            oom_backoffs=self.oom_backoffs or 0,
            ceiling_samples_per_s=self.ceiling_samples_per_s,
        )

    def rebased(self, ceiling: float | None) -> TrialRecord:
        """Against the search's final ceiling (:meth:`SegmentMetrics.rebased`).

        Args:
            ceiling: the final ceiling at the trial's batch size.

        Returns:
            The record with its efficiency taken against ``ceiling``.
        """
        if not ceiling or self.metrics is None:
            return self
        return replace(self, metrics=self.metrics.rebased(ceiling), ceiling_samples_per_s=ceiling)

    def row(self) -> dict[str, Any]:
        """The flat ``trials.csv`` row.

        Returns:
            The row by ``trials.csv``'s column names.
        """
        flat = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in SKIP}
        figures = self.metrics.figures() if self.metrics else dict.fromkeys(FIGURES)
        loader = self.config.values() if self.config else LOADER_COLUMNS_EMPTY
        derived = {"efficiency": self.efficiency, "bounds": self.bounds}
        return {**flat, **derived, **figures, **loader, **asdict(self.node)}


SKIP = ("config", "node", "metrics")
LOADER_COLUMNS_EMPTY = dict.fromkeys(CONFIG_KEYS)
_HEAD = ("trial_id", "status", "reason", "baseline")
_OUTCOME = ("effective_batch_size", "oom_backoffs", "cpus_reserved", "host_bytes_in_flight",
            "ceiling_samples_per_s")  # fmt: skip
TRIAL_COLUMNS = [
    *_HEAD, *LOADER_COLUMNS_EMPTY, *_OUTCOME, "efficiency", "bounds", *FIGURES,
    *(f.name for f in fields(TrialRecord) if f.name not in (*SKIP, *_HEAD, *_OUTCOME)),
    *(f.name for f in fields(NodeFacts)),
]  # fmt: skip


def _typed(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that are fields of ``cls``, missing ones left out."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in values.items() if k in names and v is not None}


# Tune stamps a report in whole seconds: two trials one after the other may seem to
# share this much
SPAN_SLACK_S = 1.0


def ran_alone(records: list[TrialRecord]) -> list[TrialRecord]:
    """The trials no other trial of ``records`` ran beside (by their :attr:`~TrialRecord.span`),
    as one verification run is measured: a search one trial at a time (one CPU machine's),
    or a trial that happened to have the machine to itself. A span is known only for a
    trial that ended with its last report (``ok``, ``failed``, ``stopped_early``): one that
    raised or was interrupted may have run on after it, so beside it no trial is alone.
    A trial that never started (no figures, no node) ran beside nothing."""
    started = [r for r in records if r.metrics is not None or r.node.node_id is not None]
    spans = [(r, r.span if r.status in (*MEASURED, "failed") else None) for r in started]

    def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return min(a[1], b[1]) - max(a[0], b[0]) > SPAN_SLACK_S

    return [
        r for r, span in spans
        if span is not None
        and not any(o is not r and (s is None or overlaps(span, s)) for o, s in spans)
    ]  # fmt: skip


def record_from_report(
    trial_id: str,
    config: dict[str, Any],
    metrics: dict[str, Any],
    error: str | None,
    constants: Mapping[str, Any],
    baselines: Mapping[str, LoaderConfig],
) -> TrialRecord:
    """A record from Tune's trial config and last report (plain dicts, Ray's boundary);
    ``constants`` are what the space fixed rather than searched, ``baselines`` its
    baselines by name."""
    try:
        loader: LoaderConfig | None = LoaderConfig.from_trial_config({**constants, **config})
    except (ConfigError, TypeError):  # a trial interrupted before Tune saved its config
        loader = None
    status = trial_status(metrics, errored=error is not None)
    reasons = {
        "error": (error or "")[:300],
        "failed": f"{metrics.get('failure')}: {metrics.get('detail', '')}",
        "stopped_early": "ASHA",
        "interrupted": "the search was interrupted; --resume re-runs it",
    }
    values = _typed(TrialRecord, metrics)
    for name in SKIP + ("trial_id", "status", "reason", "baseline", "finished_at", PREDICTED):
        values.pop(name, None)
    return TrialRecord(
        metrics=SegmentMetrics.from_figures(metrics),
        trial_id=str(metrics.get("trial_id") or trial_id),
        status=status,
        reason=reasons.get(status, ""),
        baseline=next((name for name, b in baselines.items() if b == loader), ""),
        config=loader,
        finished_at=metrics.get("timestamp"),
        predicted_samples_per_s=config.get(PREDICTED),
        node=NodeFacts(**_typed(NodeFacts, metrics)),
        **values,
    )


def write_trials_csv(path: Path, records: list[TrialRecord]) -> None:
    """``trials.csv`` at ``path``: one row per record, the columns of ``TRIAL_COLUMNS``."""
    write_csv(path, [record.row() for record in records], TRIAL_COLUMNS)


def by_hardware_class(records: list[TrialRecord]) -> dict[str, list[TrialRecord]]:
    """Trials grouped by the hardware class of their node, largest group first; a trial
    that failed before its first report has no node and counts with the largest."""
    groups: dict[str, list[TrialRecord]] = {}
    for record in records:
        if record.node.hardware_class:
            groups.setdefault(record.node.hardware_class, []).append(record)
    ordered = dict(sorted(groups.items(), key=lambda item: -len(item[1])))
    unplaced = [record for record in records if not record.node.hardware_class]
    if not ordered:
        return {"unknown": unplaced}
    next(iter(ordered.values())).extend(unplaced)
    return ordered


def best_node(records: list[TrialRecord], objective: str) -> str | None:
    """The node the best measured trial ran on."""
    measured = [r for r in records if r.objective(objective) is not None and r.node.node_id]
    if not measured:
        return None
    return max(measured, key=lambda r: r.objective(objective) or 0.0).node.node_id

"""Choosing the winner from repeated verification measurements.

The top configurations of the search and both baselines are re-measured several
times, interleaved. Each gets a :class:`Stats` (median and range) of its
objective. A configuration is *within noise* of the best when either one's median
lies within the other's runs: its median reaches the best's lowest run, or one of its
runs reaches the best's median. The runs cannot tell them apart. Among
those, the one that reserves the fewest CPUs, then the least host memory, then
one with persistent workers, wins. The JSON says when this rule, not the raw
best, decided. :func:`decided` says when the runs are enough to choose: every
other configuration is either clearly apart from the best (all its runs below the
best's lowest) or clearly within its noise (all at or above it).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.outcomes import TrialOutcome

MIN_ROUNDS = 2  # verification rounds before the evidence may decide
# a configuration whose every run is this many times below the best steady one's worst
# is not re-measured: the runs of one configuration differ by a few percent to 20% (a
# window whose halves differ by more is marked not steady), not threefold
OUT_OF_REACH = 3.0


def rotation(names: Sequence[str], repeat: int) -> list[str]:
    """Round ``repeat``'s order: each round starts one later, so drift over the run hits
    every configuration alike."""
    shift = repeat % len(names)
    return [*names[shift:], *names[:shift]]


def rotated(names: Sequence[str], repeats: int) -> Iterator[tuple[int, str]]:
    """(round, name) for ``repeats`` rounds of :func:`rotation`."""
    for repeat in range(repeats):
        for name in rotation(names, repeat):
            yield repeat, name


@dataclass(frozen=True)
class Stats:
    """A metric over a candidate's runs: median, lowest, highest and how many."""

    median: float
    min: float
    max: float
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        """The stats of ``values`` (None without any)."""
        if not values:
            raise ValueError("Stats of no values")
        return cls(statistics.median(values), min(values), max(values), tuple(values))

    def as_dict(self) -> dict[str, object]:
        """As ``best_config.json`` records them."""
        return {
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "values": list(self.values),
        }


@dataclass(frozen=True)
class Candidate:
    """One verified configuration and its repeated measurements."""

    name: str
    config: LoaderConfig
    outcomes: tuple[TrialOutcome, ...]

    @property
    def ok(self) -> tuple[TrialOutcome, ...]:
        """The runs with figures to report: measured, and within their bounds."""
        return tuple(o for o in self.outcomes if o.metrics is not None and not o.beyond_bound)

    @property
    def refused(self) -> tuple[str, ...]:
        """Why runs were left out: each figure that beat its bound (a defect)."""
        return tuple(o.beyond_bound for o in self.outcomes if o.beyond_bound)

    @property
    def steady(self) -> bool:
        """At least half its runs had a steady window (or one too short to tell)."""
        unsteady = sum(1 for o in self.ok if o.metrics and o.metrics.steady is False)
        return 2 * unsteady <= len(self.ok)

    def stats(self, metric: str) -> Stats | None:
        """``metric`` over the successful runs (None without any)."""
        values = [float(v) for o in self.ok if (v := getattr(o.metrics, metric)) is not None]
        return Stats.of(values) if values else None

    def efficiency(self) -> Stats | None:
        """Its median samples/s over its ceiling."""
        values = [o.efficiency for o in self.ok if o.efficiency is not None]
        return Stats.of(values) if values else None

    @property
    def cost(self) -> tuple[float, int]:
        """(CPUs reserved, host bytes in flight): what the selection minimises within noise."""
        first = self.outcomes[0]
        return first.cpus_reserved, first.host_bytes_in_flight


@dataclass(frozen=True)
class Selection:
    """The verified winner, the best by the objective, every candidate ranked, and whether cost
    decided it."""

    winner: Candidate
    best_by_objective: Candidate
    within_noise: tuple[Candidate, ...]
    ranked: tuple[Candidate, ...]

    @property
    def decided_by_cost(self) -> bool:
        """Whether a cheaper candidate within noise won over the best by the objective."""
        return self.winner is not self.best_by_objective


def _keeps_workers(candidate: Candidate) -> bool:
    """Persistent workers: the segment is one epoch, so the measurement cannot tell
    them apart; in training they save starting the workers again at every epoch."""
    return candidate.config.num_workers > 0 and candidate.config.persistent_workers


def select(candidates: Sequence[Candidate], objective: str) -> Selection | None:
    """The cheapest candidate within noise of the best; None when all failed. Candidates
    whose windows were mostly not steady rank after every steady one, and win only when
    none is steady."""
    measured = [c for c in candidates if c.stats(objective) is not None]
    if not measured:
        return None
    by_objective = sorted(measured, key=lambda c: c.stats(objective).median, reverse=True)  # type: ignore[union-attr]
    ranked = [c for c in by_objective if c.steady] + [c for c in by_objective if not c.steady]
    best = ranked[0]
    best_stats = best.stats(objective)
    assert best_stats is not None
    close = [
        c for c in ranked if c.steady == best.steady and _within(c.stats(objective), best_stats)
    ]
    winner = min(close, key=lambda c: (c.cost, not _keeps_workers(c), -c.stats(objective).median))  # type: ignore[union-attr]
    return Selection(winner, best, tuple(close), tuple(ranked))


def _within(other: Stats | None, best: Stats) -> bool:
    """Whether the runs cannot tell ``other`` from ``best``: either one's median lies
    within the other's runs. The median alone against the best's lowest run let a
    best with three runs within 1% beat a no-worker loader whose runs spread 13% around
    it (0.96-0.966 against 0.887, 0.951 and 1.022), a real search's figures."""
    return other is not None and (other.median >= best.min or other.max >= best.median)


def decided(candidates: Sequence[Candidate], objective: str) -> bool:
    """Whether more rounds could change the winner: not when every other configuration
    is clearly apart from the best (all its runs below the best's worst) or clearly
    within its noise (all its runs at or above the best's worst)."""
    measured = [c for c in candidates if c.stats(objective) is not None]
    if len(measured) < 2:
        return True
    best = max(measured, key=lambda c: c.stats(objective).median)  # type: ignore[union-attr]
    low = best.stats(objective).min  # type: ignore[union-attr]
    for other in measured:
        stats = other.stats(objective)
        assert stats is not None
        if other is not best and stats.min < low <= stats.max:
            return False  # its runs straddle the best's worst: in or out is not known
    return True


def out_of_reach(candidates: Sequence[Candidate], objective: str) -> set[str]:
    """The configurations no further run could bring near the best: every run of theirs
    ``OUT_OF_REACH`` times or more below the worst run of the best steady configuration
    (none without a steady one), their own windows steady (one that was not may have
    been hit by something passing). Re-measuring them would only lengthen verification: a
    slow baseline on a bucket takes ten times a tuned candidate's window."""
    steady = [c for c in candidates if c.steady and c.stats(objective) is not None]
    if not steady:
        return set()
    best = max(steady, key=lambda c: c.stats(objective).median)  # type: ignore[union-attr]
    low = best.stats(objective).min  # type: ignore[union-attr]
    return {
        c.name
        for c in candidates
        if c is not best and c.steady and (stats := c.stats(objective)) is not None
        and stats.max * OUT_OF_REACH <= low
    }  # fmt: skip


def fitting(candidate: Candidate) -> LoaderConfig:
    """The candidate's configuration at the batch size its runs fit (after an
    out-of-memory back-off, what fits is what training should use)."""
    sizes = [o.effective_batch_size for o in candidate.ok if o.effective_batch_size]
    if sizes and max(sizes) < candidate.config.batch_size:
        return candidate.config.with_batch_size(min(sizes))
    return candidate.config

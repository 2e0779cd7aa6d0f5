"""The memory model: a measurement's memory readings fitted per sample read, projected to
an epoch.

:func:`fit_memory` takes what a :class:`~raytune_loader.machine.watch.Watcher` read over a
measured window and fits each process's growth per sample read: the main process's
pages a worker copies as reference counts touch them (what it still shares with the
main process shrinks: the copies follow the curve of pages read at random, up to the
dataset's Python objects, :func:`python_objects_bytes`) apart from new memory it keeps
(its resident anonymous memory grows, without a bound). :class:`MemoryFit` projects
that to one epoch of the whole dataset, which the memory finding judges.
"""

from __future__ import annotations

import math
import random
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from raytune_loader.machine.watch import FOLLOWED, MAIN, Reading, Watch

FLOOR_BYTES = 4 * 2**20  # growth over the window below this is the allocator's noise
JUMP_SHARE = 0.5  # one step this far above the even rate (of the growth) is a one-off
LATE_SHARE = 0.25  # the later half of the reads must hold this much of the growth
KEPT_SHARE = 0.25  # new memory per sample below this share of a sample is the allocator's
MIN_READINGS = 3  # a process read fewer times in the window gives no rate
SETTLING = 0.1  # the share of the window's reads left out of the rates


def distinct_reads(reads: float, subset: int | None, parts: int) -> float:
    """Expected distinct samples one of ``parts`` readers has read after ``reads`` of
    them, over a subset of ``subset`` samples read in fresh permutations split among
    the readers: every read is new in the first pass, then a pass brings the share it
    has not yet seen. Without a subset (a stream) every read counts."""
    if not subset or parts < 1:
        return reads
    per_pass = subset / parts
    passes, rest = divmod(reads, per_pass)
    unseen = (1 - 1 / parts) ** passes
    return subset * (1 - unseen) + rest * unseen


@dataclass(frozen=True)
class Scope:
    """What one rank's measurement reads: a subset of ``subset`` samples (None: a
    stream) out of a dataset of ``epoch`` samples (None: unknown), shared by
    ``ranks`` ranks; a sample holds ``sample_bytes`` as the loader delivers it."""

    subset: int | None
    epoch: int | None
    ranks: int = 1
    sample_bytes: int = 0
    objects_bytes: int | None = None  # the dataset's Python objects (python_objects_bytes)


@dataclass(frozen=True)
class Growth:
    """Sustained memory growth of a group of processes, per sample each reads."""

    copies: float  # bytes of the main process's pages copied, per distinct sample read
    kept: float  # bytes of new memory kept (a cache, a leak), per sample read


@dataclass(frozen=True)
class MemoryFit:
    """One rank's memory over its measured window, and where one epoch takes it."""

    workers: Growth  # per sample a worker reads (zero without worker processes)
    main: Growth  # per sample the training loop reads (it copies nothing: kept only)
    current_bytes: int  # the rank's processes at the window's end (PSS, else RSS)
    shared_bytes: tuple[int, ...]  # per worker: what it still shares with the main process
    worker_reads: float  # distinct samples each worker had read at the window's end
    epoch: int | None  # samples in one epoch of the whole dataset, all ranks
    parts: int  # readers of the epoch: workers x ranks (ranks without workers)
    ranks: int
    objects_bytes: int | None = None  # what reading every sample can copy, per worker
    copies_span: tuple[float, float] = (0.0, 0.0)  # distinct reads the copies were fitted over

    @property
    def per_sample(self) -> float:
        """Bytes the rank's processes gain per sample read."""
        return self.workers.copies + self.workers.kept + self.main.copies + self.main.kept

    def epoch_growth(self, epoch: int | None = None) -> int | None:
        """What one epoch of ``epoch`` samples (default the whole dataset's) adds to this
        rank's processes: each worker reads its share, copying the pages of the samples
        it has not read yet, at most what it still shares with the main process, and
        keeping new memory for every sample, without a bound."""
        epoch = epoch or self.epoch
        if epoch is None:
            return None
        share = epoch / self.parts
        growth = sum(
            self.copied(self.worker_reads, share, shared) + self.workers.kept * share
            for shared in self.shared_bytes
        )
        return int(growth + self.main.kept * epoch / self.ranks)

    def copied(self, read: float, more: float, shared: float) -> float:
        """What one worker copies between ``read`` and ``more`` distinct samples read.

        Reading samples at random touches the pages of the dataset's Python objects as a
        coupon collector does: the first reads copy a page each, later ones fewer and
        fewer, until every page is copied: ``F (1 - exp(-x u))`` after x samples. F is
        at least the objects' own bytes (``objects_bytes``) and at least what the slope
        measured over the window needs; u is then the slower of the curves with that
        slope there. The growth follows the curve, never past what the worker still
        shares; without the objects' size the measured rate goes on straight, up to that."""
        rate = self.workers.copies
        if rate <= 0 or more <= read:
            return 0.0
        if not self.objects_bytes:
            return min(rate * (more - read), shared)
        ceiling, decay = _saturation(rate, *self.copies_span, self.objects_bytes)
        return min(ceiling * (math.exp(-read * decay) - math.exp(-more * decay)), shared)


def _saturation(slope: float, start: float, end: float, objects: float) -> tuple[float, float]:
    """(F, u) of the curve ``F (1 - exp(-x u))`` whose mean slope between ``start`` and
    ``end`` distinct reads is ``slope``: F the larger of ``objects`` and the least F any
    curve needs for that slope there (a little more, to keep a solution), u the smaller
    of the two that give it (more growth left: the cautious one)."""
    span = max(end - start, 1e-9)
    best = math.log(end / start) / span if start > 0 else math.inf  # u of the steepest

    def mean_slope(ceiling: float, decay: float) -> float:
        return ceiling * (math.exp(-start * decay) - math.exp(-end * decay)) / span

    steepest = 1.0 if math.isinf(best) else mean_slope(1.0, best)  # per byte of F
    ceiling = max(objects, 1.05 * slope / steepest)
    low, high = 0.0, best if math.isfinite(best) else 1.0
    while math.isinf(best) and mean_slope(ceiling, high) < slope:
        high *= 2
    for _ in range(80):  # mean_slope rises with u up to the steepest curve
        middle = (low + high) / 2
        low, high = (middle, high) if mean_slope(ceiling, middle) < slope else (low, middle)
    return ceiling, high


def fit_memory(watch: Watch, scope: Scope) -> MemoryFit | None:
    """The growth per sample read over the measured window and its projection; None
    when nothing was read in the window."""
    start, end = watch.window
    inside = [r for r in watch.readings if start <= r.reads]
    if not inside:
        return None
    # a worker's first batches copy and allocate what any worker does once (caches, the
    # allocator's first pools): the rates leave out each process's first tenth of the
    # window, counted from its own first reading (without persistent workers a new
    # worker starts every epoch; one that lives less than that gives no rate)
    first: dict[tuple[int, int], int] = {}
    for r in inside:
        first.setdefault(r.process, r.reads)
    settle = SETTLING * (end - start)
    settled = [r for r in inside if r.reads >= first[r.process] + settle]
    workers = watch.workers
    parts = max(1, workers) * scope.ranks

    def distinct(reads: int) -> float:  # samples a worker has read, each counted once
        return distinct_reads(reads / max(1, workers), scope.subset, parts)

    floor = KEPT_SHARE * scope.sample_bytes
    full, last = _latest(inside), _latest(inside, full=False)
    others = [r for r in settled if r.worker != MAIN]
    mains = [r for r in settled if r.worker == MAIN]
    followed = [distinct(r.reads) for r in others if r.worker == FOLLOWED and r.uss is not None]
    return MemoryFit(
        workers=_growth(others, workers, distinct, floor) if workers else Growth(0.0, 0.0),
        main=Growth(0.0, _kept(mains, 1, floor)),
        current_bytes=sum(full[w].pss or 0 if w in full else r.rss for w, r in last.items()),
        shared_bytes=_shared(full, [w for w in last if w != MAIN], last),
        worker_reads=distinct(end),
        epoch=scope.epoch,
        parts=parts,
        ranks=scope.ranks,
        objects_bytes=scope.objects_bytes,
        copies_span=(min(followed), max(followed)) if followed else (0.0, 0.0),
    )


def python_objects_bytes(root: object, sample: int = 256, most: int = 20_000) -> int:
    """Estimated bytes of the Python objects (strings, numbers, tuples, and the headers
    of lists, dicts and sets) reachable from ``root`` through containers and instance
    attributes: what copy-on-write can copy in a worker that reads them all, since a
    reference count sits in every object. A container of more than ``sample`` items is
    estimated from ``sample`` of them, so a list of a million paths costs a few
    milliseconds; arrays and tensors keep their data outside Python objects and count
    for nothing; at most ``most`` objects are visited."""
    seen: set[int] = set()
    visits = [0]
    pick = random.Random(0)

    def size(obj: object, depth: int) -> float:
        if id(obj) in seen or depth > 16 or visits[0] >= most:
            return 0.0
        seen.add(id(obj))
        visits[0] += 1
        if isinstance(obj, (str, bytes, int, float, complex, type(None))):
            return float(sys.getsizeof(obj))
        if isinstance(obj, (list, tuple, set, frozenset, dict)):
            items = list(obj.values() if isinstance(obj, dict) else obj)
            own = sys.getsizeof(obj) if isinstance(obj, tuple) else sys.getsizeof(type(obj)())
            if isinstance(obj, dict):
                items += list(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType)):
            items, own = list(vars(obj).values()), sys.getsizeof(obj)
        else:
            return 0.0  # a module, a class, an array, a tensor: no per-sample objects
        scale = 1.0
        if len(items) > sample:
            scale, items = len(items) / sample, pick.sample(items, sample)
        return own + scale * sum(size(item, depth + 1) for item in items)

    return int(size(root, 0))


def _still_shared(reading: Reading) -> int:
    """Memory a worker still shares with the main process and may copy: its resident
    memory less the libraries' pages and less what is its own already (the batches it
    holds in shared memory are its own, and resident too, so they cancel out)."""
    return max(0, reading.rss - reading.file - (reading.uss or 0))


def _shared(
    full: dict[int, Reading], workers: Sequence[int], last: dict[int, Reading]
) -> tuple[int, ...]:
    """Per worker, what it still shares. A worker whose private memory was not read is
    taken as the others', or as all its resident anonymous memory."""
    known = {w: _still_shared(r) for w, r in full.items() if w != MAIN}
    mean = sum(known.values()) / len(known) if known else None
    return tuple(
        int(known.get(w, mean if mean is not None else last[w].anon))
        for w in sorted(workers)
    )  # fmt: skip


def _latest(readings: Sequence[Reading], full: bool = True) -> dict[int, Reading]:
    """Each process's last reading (the last with private memory, with ``full``)."""
    out: dict[int, Reading] = {}
    for reading in readings:
        if not full or reading.uss is not None:
            out[reading.worker] = reading
    return out


def _growth(
    readings: Sequence[Reading], readers: int, distinct: Callable[[int], float], floor: float
) -> Growth:
    """The workers' copies (what one shares with the main process shrinking, per
    distinct sample it reads: a page is copied once) and kept memory, when sustained."""
    copied = _sustained(
        [(r.process, distinct(r.reads), -float(_still_shared(r))) for r in readings if r.uss]
    )
    return Growth(copies=copied, kept=_kept(readings, readers, floor))


def _kept(readings: Sequence[Reading], readers: int, floor: float) -> float:
    """Resident anonymous memory growing per sample each of ``readers`` reads, when
    sustained and at least ``floor`` a sample: below that it is the allocator settling,
    which a short window cannot tell from a leak."""
    kept = _sustained([(r.process, r.reads / readers, float(r.anon)) for r in readings])
    return kept if kept >= floor else 0.0


def _sustained(points: Sequence[tuple[tuple[int, int], float, float]]) -> float:
    """The slope of memory against samples read, pooled over processes (each its own
    intercept) over the processes read MIN_READINGS times or more in the window, when
    the growth is sustained: at least FLOOR_BYTES in all, no step between readings
    exceeding the even rate by more than JUMP_SHARE of it (a one-off allocation, a
    garbage collection's pass), and LATE_SHARE of it after the middle of the samples
    read (a warm-up that levelled off is not a rate). Else 0: fewer readings cannot
    tell a rate from an allocator settling."""
    groups: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for group, x, y in points:  # group: a Reading's process
        groups.setdefault(group, []).append((x, y))
    runs = [sorted(g) for g in groups.values() if len(g) >= MIN_READINGS]
    growth = sum(run[-1][1] - run[0][1] for run in runs)
    span = sum(run[-1][0] - run[0][0] for run in runs)
    if not runs or growth < FLOOR_BYTES or span <= 0:
        return 0.0
    rate = growth / span
    excess = max(b[1] - a[1] - rate * (b[0] - a[0]) for run in runs for a, b in pairwise(run))
    late = sum(run[-1][1] - _at(run, (run[0][0] + run[-1][0]) / 2) for run in runs)
    if excess > JUMP_SHARE * growth or late < LATE_SHARE * growth:
        return 0.0
    return max(0.0, _pooled_slope(runs))


def _at(run: Sequence[tuple[float, float]], x: float) -> float:
    """``run``'s y at ``x``, interpolated between its readings."""
    for (x0, y0), (x1, y1) in pairwise(run):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return run[-1][1]


def _pooled_slope(runs: Sequence[Sequence[tuple[float, float]]]) -> float:
    """Least squares of y on x with an intercept per run."""
    num = den = 0.0
    for run in runs:
        mx = sum(x for x, _ in run) / len(run)
        my = sum(y for _, y in run) / len(run)
        num += sum((x - mx) * (y - my) for x, y in run)
        den += sum((x - mx) ** 2 for x, _ in run)
    return num / den if den > 0 and math.isfinite(num) else 0.0

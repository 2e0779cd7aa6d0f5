"""Watching a measurement's processes while it trains: memory, threads, CPU time.

A :class:`Watcher` runs in a thread of the measuring process beside the training
segment (:func:`raytune_loader.measure.train_segment`). Every ``interval_s`` it reads
the resident memory of the main process and of each DataLoader worker process
(``/proc/<pid>/status``: microseconds), and it follows one worker (the first)
closely: its private and proportional memory (USS and PSS, psutil's
``memory_full_info``: the kernel walks the process's page tables, 10-20 ms of CPU
for a process holding torch), no more often than a share (:data:`BUDGET`) of the
measurement's CPUs allows, counted in the readings' CPU time; every process's once
the window has ended, outside it (the other workers read the same data the same way:
they are taken to grow alike). Each reading carries the samples the training loop
had received, so that :func:`fit_memory` can fit the growth per
sample read and project it to an epoch of the whole dataset: the main process's
pages a worker copies as reference counts touch them (what it still shares with
the main process shrinks) apart from new memory it keeps (its resident anonymous
memory grows). At the start and end of the window it reads each worker's threads
and their CPU time, which shows a worker running more busy threads than the CPU it
was given. Thread workers are threads of the main process: no process to watch.
"""

from __future__ import annotations

import math
import os
import random
import sys
import threading
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import psutil

MAIN = -1  # the ``worker`` of the main process's readings
FOLLOWED = 0  # the worker whose private memory is read throughout the window
INTERVAL_S = 0.2  # between readings of resident memory (doubled every SLOWER_AFTER rounds)
SLOWER_AFTER = 250  # rounds: a long trial keeps a few hundred readings, not thousands
BUDGET = 0.01  # of the measurement's CPUs the private-memory readings may take
BUSY_SHARE = 0.1  # a thread that ran this share of the window is busy
BUSY_MIN_S = 0.02  # and at least this long (a short window's stray milliseconds are not)
FLOOR_BYTES = 4 * 2**20  # growth over the window below this is the allocator's noise
JUMP_SHARE = 0.5  # one step this far above the even rate (of the growth) is a one-off
LATE_SHARE = 0.25  # the later half of the reads must hold this much of the growth
KEPT_SHARE = 0.25  # new memory per sample below this share of a sample is the allocator's
TAIL_MARGIN_S = 0.001  # a wait counts in the tail above twice the median plus this
MIN_READINGS = 3  # a process read fewer times in the window gives no rate
SETTLING = 0.1  # the share of the window's reads left out of the rates


@dataclass(frozen=True)
class Reading:
    """One process's memory, with the samples the training loop had received."""

    reads: int
    worker: int  # the worker's index, MAIN for the main process
    rss: int  # resident bytes
    anon: int  # of which anonymous (not file-backed, not shared memory)
    file: int  # of which file-backed (libraries' pages, mapped as they are first used)
    uss: int | None = None  # private bytes; None where only the resident figure was read
    pss: int | None = None  # proportional bytes: shared pages split among their sharers
    pid: int = 0  # the process: without persistent workers an index is a new one each epoch

    @property
    def process(self) -> tuple[int, int]:
        """Which process this is: a worker's index and its process id."""
        return self.worker, self.pid


@dataclass(frozen=True)
class ThreadUse:
    """One worker process's threads over the measured window."""

    worker: int
    threads: int  # threads it had at the window's end
    busy: int  # threads that ran at least BUSY_SHARE of the window
    cpu_s: float  # CPU seconds it used in the window


@dataclass(frozen=True)
class Watch:
    """What a watcher read during one measurement."""

    readings: tuple[Reading, ...]
    workers: int  # worker processes watched (0 for no workers, or thread workers)
    window: tuple[int, int]  # samples received at the window's start and end
    window_s: float
    threads: tuple[ThreadUse, ...]
    free_bytes: int  # the node's available memory at the window's end
    libraries: tuple[tuple[str, int], ...]  # thread pools loaded here, and their size
    cost_s: float  # CPU seconds the private-memory readings took, in the watcher's thread
    full_readings: int
    watched_s: float = 0.0  # from the watcher's start to the window's end

    @property
    def busy_threads(self) -> float | None:
        """Busy threads per worker process, on average."""
        if not self.threads:
            return None
        return sum(t.busy for t in self.threads) / len(self.threads)


class Watcher:
    """Reads memory in a thread of its own; the training loop adds what it receives to
    :attr:`reads` and marks the measured window. ``worker_pids`` gives the current
    epoch's worker processes (none before the first batch); ``cpus`` is what the
    measurement keeps busy, which sets how often the costly readings may run."""

    def __init__(
        self,
        worker_pids: Callable[[], Sequence[int]],
        cpus: float,
        interval_s: float = INTERVAL_S,
        budget: float | None = None,
        active: bool = True,
    ) -> None:
        self.reads = 0
        self._active = active  # inactive: it only counts, to measure what watching costs
        self._worker_pids = worker_pids
        share = BUDGET if budget is None else budget
        self._budget_s = share * max(1.0, cpus)  # CPU seconds per second
        self._interval_s = interval_s
        self._processes: dict[int, psutil.Process] = {}
        self._readings: list[Reading] = []
        self._next_full = 0.0
        self._cost_s = 0.0
        self._full = 0
        self._rounds = 0
        self._window: list[int] = [0, 0]
        self._workers = 0
        self._free = 0
        self._started = self._ended = 0.0
        self._marks: list[tuple[float, dict[int, Any]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None  # started by start(), when active

    def start(self) -> Watcher:
        self._started = time.monotonic()
        if self._active:  # created here: an inactive watcher holds no thread (nor a cycle)
            self._thread = threading.Thread(target=self._run, name="raytune-watch", daemon=True)
            self._thread.start()
        return self

    def window_started(self) -> None:
        self._window[0] = self.reads
        if self._active:
            self._mark()

    def window_ended(self) -> None:
        """Mark the window's end; then, outside it, read every process in full."""
        self._window[1] = self.reads
        self._ended = time.monotonic()
        if not self._active:
            return
        self._mark()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            for worker, process in self._current():
                reading = self._read(process, worker, self.reads, full=True, budgeted=False)
                if reading is not None:
                    self._readings.append(reading)
        self._workers = len(self._worker_pids())
        self._free = psutil.virtual_memory().available

    def stop(self) -> Watch:
        """Stop reading (idempotent) and return what was read."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()
        return Watch(
            readings=tuple(self._readings),
            workers=self._workers,
            window=(self._window[0], self._window[1] or self.reads),
            window_s=self._marks[-1][0] - self._marks[0][0] if len(self._marks) == 2 else 0.0,
            threads=self._thread_use(),
            free_bytes=self._free or psutil.virtual_memory().available,
            libraries=thread_pools() if self._active else (),
            cost_s=self._cost_s,
            full_readings=self._full,
            watched_s=max(0.0, (self._ended or time.monotonic()) - self._started),
        )

    def _run(self) -> None:
        interval = self._interval_s
        while not self._stop.wait(interval):
            self._round()
            self._rounds += 1
            if self._rounds % SLOWER_AFTER == 0:
                interval *= 2

    def _current(self) -> list[tuple[int, psutil.Process]]:
        """(worker index, process) of the main process and the current workers."""
        pids = [(MAIN, os.getpid()), *enumerate(self._worker_pids())]
        current = []
        for worker, pid in pids:
            if pid not in self._processes:
                try:
                    self._processes[pid] = psutil.Process(pid)
                except psutil.NoSuchProcess:
                    continue
            current.append((worker, self._processes[pid]))
        return current

    def _round(self) -> None:
        """Every process's resident memory; when the budget allows, the followed
        worker's private memory too."""
        with self._lock:
            reads = self.reads
            followed = time.monotonic() >= self._next_full
            for worker, process in self._current():
                reading = self._read(process, worker, reads, full=followed and worker == FOLLOWED)
                if reading is not None:
                    self._readings.append(reading)

    def _read(
        self, process: psutil.Process, worker: int, reads: int, full: bool, budgeted: bool = True
    ) -> Reading | None:
        try:
            rss, anon, file = resident(process)
            if not full:
                return Reading(reads, worker, rss, anon, file, pid=process.pid)
            started = time.thread_time()  # CPU time: on a busy machine, waiting is not cost
            info = process.memory_full_info()
            cost = time.thread_time() - started
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            return None  # a worker that ended, or a platform that hides it
        if budgeted:
            self._cost_s += cost
            self._full += 1
            self._next_full = time.monotonic() + (
                cost / self._budget_s if self._budget_s > 0 else math.inf
            )
        uss, pss = getattr(info, "uss", None), getattr(info, "pss", None)
        return Reading(reads, worker, rss, anon, file, uss, pss, process.pid)

    def _mark(self) -> None:
        """Each worker's threads and CPU time now (cheap: /proc/<pid>/task)."""
        now = time.monotonic()
        snapshot: dict[int, Any] = {}
        for worker, pid in enumerate(self._worker_pids()):
            try:
                process = psutil.Process(pid)
                threads = {t.id: t.user_time + t.system_time for t in process.threads()}
                snapshot[worker] = (pid, threads, sum(process.cpu_times()[:2]))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        self._marks.append((now, snapshot))

    def _thread_use(self) -> tuple[ThreadUse, ...]:
        if len(self._marks) != 2:
            return ()
        (start, before), (end, after) = self._marks
        wall = max(end - start, 1e-9)
        use = []
        for worker, (pid, threads, cpu) in after.items():
            if worker not in before or before[worker][0] != pid:
                continue  # a worker that started within the window
            earlier = before[worker][1]
            used = [cpu_s - earlier.get(thread, 0.0) for thread, cpu_s in threads.items()]
            busy = sum(1 for cpu_s in used if cpu_s >= max(BUSY_SHARE * wall, BUSY_MIN_S))
            use.append(ThreadUse(worker, len(threads), busy, cpu - before[worker][2]))
        return tuple(use)


def resident(process: psutil.Process) -> tuple[int, int, int]:
    """(resident, of which anonymous, of which file-backed) bytes of ``process``: from
    ``/proc/<pid>/status`` on Linux (a few microseconds), which tells the batches a
    worker holds in shared memory apart; elsewhere from psutil (file-backed and shared
    memory together)."""
    try:
        with open(f"/proc/{process.pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if line.startswith("Rss"))
    except FileNotFoundError:
        if os.path.exists("/proc/self/status"):
            raise psutil.NoSuchProcess(process.pid) from None
        info = process.memory_info()
        shared = getattr(info, "shared", 0)
        return info.rss, info.rss - shared, shared
    kib = {name: int(value.split()[0]) * 1024 for name, value in fields.items()}
    anon, file = kib.get("RssAnon", 0), kib.get("RssFile", 0)
    return anon + file + kib.get("RssShmem", 0), anon, file


def thread_pools() -> tuple[tuple[str, int], ...]:
    """The BLAS and OpenMP libraries loaded in this process and their threads (what a
    forked worker inherits), through threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - a dependency; without it, nothing to say
        return ()
    return tuple(sorted({(p["internal_api"], p["num_threads"]) for p in threadpool_info()}))


def wait_tail(waits: Sequence[float], wall: float) -> tuple[float, float, float]:
    """(median, 99th percentile, tail share) of a training loop's waits for its batches:
    the tail share is the part of the ``wall`` time lost to waits above twice the median
    (and a millisecond), which a few slow samples cause in an in-order loader."""
    ordered = sorted(waits)
    p50, p99 = _percentile(ordered, 50), _percentile(ordered, 99)
    tail = sum(max(0.0, w - (2 * p50 + TAIL_MARGIN_S)) for w in ordered)
    return p50, p99, tail / wall if wall > 0 else 0.0


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks, as numpy's default."""
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


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

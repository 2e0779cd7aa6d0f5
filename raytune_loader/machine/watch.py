"""Watching a measurement's processes while it trains: memory, threads, CPU time.

A :class:`Watcher` runs in a thread of the measuring process beside the training segment
(:func:`raytune_loader.measuring.segment.train_segment`). Every ``interval_s`` it reads the
resident memory of the main process and of each DataLoader worker process
(``/proc/<pid>/status``: microseconds), and it follows one worker (the first) closely:
its private and proportional memory (USS and PSS, psutil's ``memory_full_info``: the
kernel walks the process's page tables, 10-20 ms of CPU for a process holding torch), no
more often than a share (:data:`BUDGET`) of the measurement's CPUs allows, counted in
the readings' CPU time; every process's once the window has ended, outside it (the other
workers read the same data the same way: they are taken to grow alike). Each reading
carries the samples the training loop had received, so that
:func:`raytune_loader.measuring.memoryfit.fit_memory` can fit the growth per sample read and
project it to an epoch of the whole dataset. At the start and end of the window it reads
each worker's threads and their CPU time, which shows a worker running more busy threads
than the CPU it was given. Thread workers are threads of the main process: no process to
watch.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

MAIN = -1  # the ``worker`` of the main process's readings
FOLLOWED = 0  # the worker whose private memory is read throughout the window
INTERVAL_S = 0.2  # between readings of resident memory (doubled every SLOWER_AFTER rounds)
SLOWER_AFTER = 250  # rounds: a long trial keeps a few hundred readings, not thousands
BUDGET = 0.01  # of the measurement's CPUs the private-memory readings may take
BUSY_SHARE = 0.1  # a thread that ran this share of the window is busy
BUSY_MIN_S = 0.02  # and at least this long (a short window's stray milliseconds are not)
TAIL_MARGIN_S = 0.001  # a wait counts in the tail above twice the median plus this


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
        """Start reading (a thread of its own, where active); returns itself."""
        self._started = time.monotonic()
        if self._active:  # created here: an inactive watcher holds no thread (nor a cycle)
            self._thread = threading.Thread(target=self._run, name="raytune-watch", daemon=True)
            self._thread.start()
        return self

    def window_started(self) -> None:
        """The measured window starts: the samples read so far, and a reading now."""
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

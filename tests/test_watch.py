"""The watcher: its readings of real processes, and the fit of growth per sample read."""

from __future__ import annotations

import math
import os
import sys
import time

import pytest
import torch
from torch.utils.data import TensorDataset

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.machine.watch import FOLLOWED, MAIN, Reading, Watch, Watcher, wait_tail
from raytune_loader.measuring.memoryfit import (
    FLOOR_BYTES,
    Scope,
    distinct_reads,
    fit_memory,
    python_objects_bytes,
)

MIB = 2**20
SAMPLE = 100_000  # bytes of one sample as the loader delivers it


def _watch(readings: list[Reading], workers: int = 2, window: tuple[int, int] = (0, 10_000)):
    return Watch(tuple(readings), workers, window, 5.0, (), 10 * 2**30, (), 0.0, 0)


def _worker(
    reads: int, shared: float, kept: float = 0.0, worker: int = FOLLOWED, pid: int = 0
) -> Reading:
    """A worker that still shares ``shared`` MiB with the main process and keeps ``kept``
    MiB of its own (its anonymous memory grows by that), with 50 MiB of libraries."""
    anon = int((400 + kept) * MIB)
    uss = anon - int(shared * MIB)
    return Reading(reads, worker, anon + 50 * MIB, anon, 50 * MIB, uss, uss + 100 * MIB, pid)


def test_a_reader_s_distinct_samples_are_every_read_in_the_first_pass_then_fewer() -> None:
    assert distinct_reads(300, 1000, 2) == 300  # the first pass: its 500 are all new
    assert distinct_reads(500, 1000, 2) == 500
    assert distinct_reads(1000, 1000, 2) == pytest.approx(750)  # a second pass: half are new
    assert distinct_reads(10**6, 1000, 2) == pytest.approx(1000)  # at most the subset
    assert distinct_reads(1500, 1000, 1) == 1000  # one reader: min(reads, subset)
    assert distinct_reads(1500, None, 4) == 1500  # a stream: every read is new


def test_copies_are_what_a_worker_shares_shrinking_projected_up_to_all_it_shares() -> None:
    """The followed worker copies 8 KiB per sample it reads; one epoch of a million
    samples over 2 workers would copy 4 GB each, but each shares only 300 MiB."""
    readings = [_worker(r, 300 - 8 * 1024 * r / 2 / MIB) for r in range(0, 10_001, 1000)]
    readings += [_worker(10_000, 300 - 40, worker=1)]
    fit = fit_memory(_watch(readings), Scope(subset=10**6, epoch=10**6, sample_bytes=SAMPLE))
    assert fit is not None
    assert fit.workers.copies == pytest.approx(8 * 1024, rel=0.01)
    assert fit.workers.kept == 0 and fit.main.kept == 0
    shared = sum(fit.shared_bytes)
    assert shared == pytest.approx((300 - 8 * 1024 * 5000 / MIB + 260) * MIB, rel=0.01)
    assert fit.epoch_growth() == pytest.approx(shared, rel=0.01)  # capped: all they share
    twice = fit.epoch_growth(20_000)  # 5,000 more samples each: within the cap
    assert twice == pytest.approx(2 * 5_000 * 8 * 1024, rel=0.01)


def test_a_new_worker_under_the_same_index_is_its_own_process_with_its_own_settling() -> None:
    """Without persistent workers the index's process changes each epoch: each copies
    8 KiB per sample from its own start (the first tenth of the window after its own
    first reading left out), not one process whose sharing jumped back up."""

    def shared(r: int, born: int) -> float:
        return 300 - 8 * 1024 * (r - born) / 2 / MIB

    readings = [_worker(r, shared(r, 0), pid=1) for r in range(0, 5000, 500)]
    readings += [_worker(r, shared(r, 5000), pid=2) for r in range(5000, 10_001, 500)]
    fit = fit_memory(_watch(readings), Scope(subset=10**6, epoch=10**6, sample_bytes=SAMPLE))
    assert fit is not None and fit.workers.copies == pytest.approx(8 * 1024, rel=0.01)
    # epochs of 800 reads: no worker lives past its settling, so none gives a rate
    short = [_worker(r, shared(r, r - r % 800) - 20, pid=r // 800) for r in range(0, 10_001, 100)]
    fit = fit_memory(_watch(short), Scope(subset=10**6, epoch=10**6, sample_bytes=SAMPLE))
    assert fit is not None and fit.workers.copies == 0


def test_copies_follow_the_curve_of_pages_read_at_random_up_to_the_objects() -> None:
    """A worker that has copied 60 of the 100 MiB of objects over its window copies 10x
    more reads' worth on the coupon collector's curve, not on a straight line."""
    objects, rate = 100 * MIB, 8 * 1024  # the truth: F (1 - exp(-x rate / F))

    def copied(x: float) -> float:
        return objects * (1 - math.exp(-x * rate / objects))

    readings = [_worker(r, 300 - copied(r / 2) / MIB) for r in range(0, 24_001, 2000)]
    scope = Scope(None, 10**6, sample_bytes=SAMPLE, objects_bytes=objects)
    fit = fit_memory(_watch(readings, window=(0, 24_000)), scope)
    assert fit is not None and fit.copies_span == (2_000, 12_000)  # the first tenth left out
    projected = fit.copied(12_000, 120_000, fit.shared_bytes[0])
    assert projected == pytest.approx(copied(120_000) - copied(12_000), rel=0.1)
    straight = fit.workers.copies * (120_000 - 12_000)
    assert straight > 3 * projected  # what the curve is for


def test_the_python_objects_of_a_dataset_are_counted_by_sampling_not_its_arrays() -> None:
    import numpy as np

    class Metadata:
        def __init__(self) -> None:
            self.paths = [f"/data/{i:09d}.JPEG" for i in range(200_000)]
            self.pixels = np.zeros((1000, 1000))  # 8 MB outside Python objects

    started = time.perf_counter()
    counted = python_objects_bytes(Metadata())
    assert time.perf_counter() - started < 1.0
    assert counted == pytest.approx(200_000 * sys.getsizeof("/data/000000000.JPEG"), rel=0.05)


def test_memory_kept_per_sample_grows_without_a_bound() -> None:
    readings = [_worker(r, 300, kept=r * 50_000 / MIB) for r in range(0, 10_001, 500)]
    fit = fit_memory(_watch(readings, workers=1), Scope(None, 10**6, sample_bytes=SAMPLE))
    assert fit is not None
    assert fit.workers.kept == pytest.approx(50_000, rel=0.01)  # per sample it reads
    assert fit.epoch_growth() == pytest.approx(50_000 * 10**6, rel=0.01)  # every one of them


@pytest.mark.parametrize(
    "shape",
    ["one jump", "a warm-up that levels off", "below the floor", "three readings too few",
     "the allocator's few KiB a sample"],
)  # fmt: skip
def test_growth_that_is_not_a_rate_counts_as_none(shape: str) -> None:
    xs = range(0, 10_001, 1000)
    if shape == "one jump":  # a garbage collection's pass touches everything at once
        readings = [_worker(r, 300 if r < 6000 else 250) for r in xs]
    elif shape == "a warm-up that levels off":
        readings = [_worker(r, 300 - 40 * min(r, 3000) / 3000) for r in xs]
    elif shape == "below the floor":
        readings = [_worker(r, 300 - (FLOOR_BYTES / MIB) * 0.5 * r / 10_000) for r in xs]
    elif shape == "three readings too few":
        readings = [_worker(r, 300 - r / 100) for r in (0, 10_000)]
    else:  # new memory well below a sample's size: an allocator settling over the window
        readings = [_worker(r, 300, kept=r * 2_000 / 2 / MIB) for r in xs]
    fit = fit_memory(_watch(readings, workers=1), Scope(10**6, 10**6, sample_bytes=SAMPLE))
    assert fit is not None and fit.per_sample == 0 and fit.epoch_growth() == 0


def test_the_tail_of_the_waits_is_what_waits_above_twice_the_median_cost() -> None:
    waits = [0.002] * 98 + [0.050, 0.102]
    p50, p99, tail = wait_tail(waits, wall=1.0)
    assert p50 == pytest.approx(0.002)
    assert 0.050 < p99 < 0.102
    assert tail == pytest.approx((0.050 - 0.005) + (0.102 - 0.005))


def test_the_watcher_reads_the_main_process_and_every_worker_of_a_real_loader() -> None:
    dataset = TensorDataset(torch.randn(256, 3, 8, 8), torch.arange(256))
    config = LoaderConfig(batch_size=8, num_workers=2, prefetch_factor=2)
    iterator = iter(build_dataloader(dataset, config, seed=0, samples_per_epoch=10**6))
    pids = [w.pid for w in iterator._workers]
    watcher = Watcher(lambda: pids, cpus=3, interval_s=0.05, budget=0.5).start()
    for _ in range(5):
        watcher.reads += len(next(iterator)[1])
    watcher.window_started()
    ended = time.monotonic() + 1.0
    while time.monotonic() < ended:
        watcher.reads += len(next(iterator)[1])
    watcher.window_ended()
    seen = watcher.stop()
    del iterator
    assert seen.workers == 2 and seen.window[0] == 40 and seen.window[1] == watcher.reads
    assert {r.worker for r in seen.readings} == {MAIN, 0, 1}
    followed = [r for r in seen.readings if r.worker == FOLLOWED and r.uss is not None]
    assert len(followed) >= 3  # followed throughout, within the budget
    last = {r.worker: r for r in seen.readings}  # each process's last reading: the end's
    assert set(last) == {MAIN, 0, 1}  # (a round just before it may share its count of reads)
    assert all(r.uss is not None and r.reads == watcher.reads for r in last.values())
    assert all(0 < r.anon <= r.rss for r in seen.readings)
    assert [t.worker for t in seen.threads] == [0, 1]
    assert all(t.threads >= 1 and t.busy <= t.threads and t.cpu_s >= 0 for t in seen.threads)
    assert 0 < seen.cost_s < seen.watched_s
    assert seen.free_bytes > 0 and os.getpid() not in pids
    fit = fit_memory(seen, Scope(256, 256, sample_bytes=3 * 8 * 8 * 4))
    assert fit is not None and fit.per_sample == 0  # tensors read: nothing copied or kept

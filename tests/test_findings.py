"""Findings: each rule on made-up runs, each pathology on a dataset built to have it, and
no finding on the datasets that have none."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.measuring.measure import run_trial
from raytune_loader.measuring.measurer import LocalMeasurer
from raytune_loader.measuring.memoryfit import Growth, MemoryFit
from raytune_loader.measuring.outcomes import SegmentMetrics, TrialOutcome
from raytune_loader.outputs import console
from raytune_loader.progress import LogProgress
from raytune_loader.sources.datasets import DatasetSpec
from raytune_loader.verdict import findings, probes, store_findings
from raytune_loader.verdict.findings import Rules, probe_configs
from raytune_loader.verdict.selection import Candidate
from raytune_loader.verdict.verify import Verified
from records_for_tests import record

GIB = 2**30
PROCESSES = LoaderConfig(16, 2, 2, False, True)


def _run(config: LoaderConfig, speed: float = 100.0, **figures) -> TrialOutcome:
    metrics = SegmentMetrics(speed, 0.1, 0.5, "step-timing", None, 600, 6.0, **figures)
    return TrialOutcome(config, 3.0, 0, metrics=metrics)


def _candidate(config: LoaderConfig, *runs: TrialOutcome, name: str = "top-1") -> Candidate:
    return Candidate(name, config, runs)


def _fit(copies: float, kept: float) -> MemoryFit:
    return MemoryFit(Growth(copies, kept), Growth(0.0, 0.0), GIB, (GIB, GIB), 1000.0, 10**6, 2, 1)


@pytest.mark.parametrize(("copies", "kept", "cause"), [(8192, 0, "numpy"), (0, 300_000, "bound")])
def test_memory_is_a_finding_past_the_share_of_free_memory_with_its_cause(
    copies: float, kept: float, cause: str
) -> None:
    run = _run(PROCESSES, projected_epoch_growth_bytes=3 * GIB, memory_free_bytes=10 * GIB,
               watched_bytes=GIB, memory=_fit(copies, kept))  # fmt: skip
    winner = _candidate(PROCESSES, run, run)
    assert findings.findings(winner, [], [], Rules(memory_share=1.0)) == []
    (found,) = findings.findings(winner, [], [], Rules(memory_share=0.25))
    assert found.kind == "memory" and cause in found.fix
    assert found.projection == {
        "epoch_samples": 10**6, "growth_bytes": 3 * GIB, "current_bytes": GIB,
        "total_bytes": 4 * GIB, "free_bytes": 10 * GIB, "memory_share": 0.25, "workers": 2,
        "ranks": 1,
    }  # fmt: skip
    assert "10.0 GiB free" in found.figure and "3.0 GiB" in found.figure


def test_oversubscribed_workers_are_a_finding_with_both_settings_measured() -> None:
    tuned = replace(PROCESSES, worker_threads=1)
    winner = _candidate(tuned, _run(tuned, worker_busy_threads=1.0))
    trial = record("t1", "ok", config=PROCESSES, worker_busy_threads=2.0)
    assert findings.findings(winner, [], [], Rules()) == []  # nothing oversubscribed
    probes = [_candidate(tuned, _run(tuned, 400.0), name=findings.TUNED),
              _candidate(PROCESSES, _run(PROCESSES, 100.0), name="worker_threads")]  # fmt: skip
    (found,) = findings.findings(winner, probes, [trial], Rules())
    assert found.kind == "threads" and "2.0 busy threads" in found.figure
    assert found.fix.startswith("worker_threads=1, tuned and applied by .dataloader()")
    assert "4.00x the samples/s of the libraries' default (400 against 100" in found.fix
    assert findings.findings(winner, probes, [trial], Rules(cpus_per_worker=2.0)) == []


def _waits(long_tail: bool, steps: int = 60) -> tuple[float, ...]:
    slow = [0.2] * (steps // 10) if long_tail else [0.004] * (steps // 10)
    return tuple([0.002] * (steps - len(slow)) + slow)


@pytest.mark.parametrize(
    ("tail", "steps", "unordered_runs", "found"),
    [(True, 60, (130.0, 128.0), True), (True, 60, (101.0, 99.0), False),
     (True, 20, (130.0, 128.0), False), (False, 60, (130.0, 128.0), False)],
    ids=["out-of-order-helps", "within-noise", "too-few-steps", "no-tail"],
)  # fmt: skip
def test_a_long_tail_is_a_straggler_finding_when_out_of_order_measurably_helps(
    tail: bool, steps: int, unordered_runs: tuple[float, float], found: bool
) -> None:
    waits = _waits(tail, steps)
    winner = _candidate(PROCESSES, *(_run(PROCESSES, waits=waits) for _ in range(2)))
    assert ("in_order" in probe_configs(winner, [], Rules())) is (tail and 2 * steps >= 50)
    unordered = replace(PROCESSES, in_order=False)
    probes = [
        _candidate(PROCESSES, _run(PROCESSES, 100.0), _run(PROCESSES, 102.0), name="tuned"),
        _candidate(unordered, *(_run(unordered, s) for s in unordered_runs), name="in_order"),
    ]
    kinds = [f.kind for f in findings.findings(winner, probes, [], Rules())]
    assert kinds == (["stragglers"] if found else [])


def test_an_epoch_start_of_minutes_without_persistent_workers_is_a_finding() -> None:
    fresh = replace(PROCESSES, persistent_workers=False)
    fit = _fit(0.0, 0.0)

    def winner(start_s: float) -> Candidate:
        return _candidate(fresh, _run(fresh, 100.0, epoch_start_s=start_s, memory=fit))

    kept = [_candidate(PROCESSES, _run(PROCESSES, epoch_start_s=0.05), name="persistent_workers")]
    (found,) = findings.findings(winner(420.0), kept, [], Rules())  # an epoch is 10,000 s
    assert found.kind == "epoch_start" and found.fix.startswith("persistent_workers=True saves")
    assert findings.findings(winner(3.0), kept, [], Rules()) == []  # seconds: no finding
    assert findings.epoch_starts(winner(3.0), {c.name: c for c in kept}) == {
        "persistent": 0.05, "fresh": 3.0,
    }  # fmt: skip


def test_an_epoch_start_longer_than_a_short_epoch_is_a_finding() -> None:
    """The default dataset: 2,000 images, an epoch of 2.5 s at 792 samples/s, started
    3.9 s after the last without persistent workers and 0.08 s with them."""
    fresh = replace(PROCESSES, persistent_workers=False)
    short = MemoryFit(Growth(0.0, 0.0), Growth(0.0, 0.0), GIB, (GIB, GIB), 1000.0, 2000, 2, 1)
    winner = _candidate(fresh, _run(fresh, 792.0, epoch_start_s=3.9, memory=short))
    kept = [_candidate(PROCESSES, _run(PROCESSES, epoch_start_s=0.08), name="persistent_workers")]
    (found,) = findings.findings(winner, kept, [], Rules())
    assert found.kind == "epoch_start" and "of an epoch of 2,000 samples" in found.figure
    assert found.fix == "persistent_workers=True saves 3.8 s an epoch (measured)"
    # 0.42 s is 17% of that epoch, but within one batch's jitter: no finding
    jitter = _candidate(fresh, _run(fresh, 792.0, epoch_start_s=0.5, memory=short))
    assert findings.findings(jitter, kept, [], Rules()) == []


def test_the_probes_flip_what_the_winner_s_runs_call_for() -> None:
    quiet = _candidate(PROCESSES, _run(PROCESSES, worker_busy_threads=1.0))
    assert probe_configs(quiet, [], Rules()) == {
        "persistent_workers": replace(PROCESSES, persistent_workers=False)
    }
    busy = _candidate(PROCESSES, _run(PROCESSES, worker_busy_threads=2.0))
    assert probe_configs(busy, [], Rules())["worker_threads"].worker_threads == 1
    threads = LoaderConfig(16, 2, 2, workers="thread")
    assert probe_configs(_candidate(threads, _run(threads)), [], Rules()) == {}


def test_the_summary_has_a_line_a_finding_then_the_epoch_start() -> None:
    best = {"findings": [{"kind": "threads", "figure": "2 busy", "fix": "worker_threads=1"}],
            "watch": {"epoch_start_s": {"persistent": 0.05, "fresh": 0.5}}}  # fmt: skip
    assert console.findings_lines(best) == [
        "finding (threads): 2 busy. fix: worker_threads=1",
        "epoch start: 0.05 s with persistent workers, 0.50 s without",
    ]
    best["findings"] = []
    assert console.findings_lines(best)[0].startswith("no findings:")
    assert console.findings_lines({}) == []  # a file written before findings


# The pathologies, measured: datasets built to have each (tests/datasets_for_tests.py)


def _job(name: str, steps: int, samples: int = 1024, root: str | None = None) -> TrialJob:
    segment = SegmentSpec(warmup_steps=3, steps=steps, report_every=steps)
    return TrialJob(dataset=DatasetSpec(name, root), model="small-cnn", segment=segment,
                    samples_per_trial=samples)  # fmt: skip


@pytest.mark.slow
def test_a_million_python_objects_read_at_random_grow_each_worker_by_copy_on_write() -> None:
    """Reference counts touch the dataset's strings and ints in every worker: what a
    worker shares with the main process shrinks with the samples it reads, projected to
    one epoch of the million samples up to all it shares (no process workers: nothing
    to copy)."""
    job = _job("datasets_for_tests:python_objects", steps=800, samples=30_000)
    outcome = run_trial(job, LoaderConfig(32, 2, 2, False, True))
    fit = outcome.metrics.memory if outcome.metrics else None
    assert fit is not None, outcome.detail
    assert 2_000 < fit.workers.copies < 50_000  # a page or so a sample
    assert fit.workers.kept == 0 and fit.epoch == 1_000_000
    assert 90 * 2**20 < fit.objects_bytes < 150 * 2**20  # the strings and the ints
    # the pages left to copy after 12,800 of each worker's 500,000 samples, on the curve
    assert 0 < fit.epoch_growth() < min(sum(fit.shared_bytes), 2 * fit.objects_bytes)
    growth = outcome.metrics.projected_epoch_growth_bytes
    free = outcome.metrics.memory_free_bytes
    winner = _candidate(outcome.config, outcome)
    (found,) = findings.findings(winner, [], [], Rules(memory_share=growth / free / 2))
    assert found.kind == "memory" and "copy-on-write" in found.figure
    assert "numpy or pyarrow" in found.fix
    alone = run_trial(_job("datasets_for_tests:python_objects", steps=50), LoaderConfig(32))
    assert alone.metrics is not None and alone.metrics.memory_growth_per_sample == 0


def _blas_runs(steps: int) -> dict[LoaderConfig, TrialOutcome]:
    job = _job("datasets_for_tests:blas_transform", steps=steps)
    default = PROCESSES.with_batch_size(8)
    return {
        config: run_trial(job, config) for config in (default, replace(default, worker_threads=1))
    }


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: BLAS runs one thread anyway")
@pytest.mark.alone
def test_a_transform_running_multithreaded_blas_keeps_two_threads_busy_in_each_worker() -> None:
    runs = _blas_runs(steps=40)
    limit = Rules().cpus_per_worker + findings.OVERSUBSCRIBED
    default, limited = (o.metrics.worker_busy_threads for o in runs.values() if o.metrics)
    assert default > limit >= limited  # the libraries' pools; worker_threads=1


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: BLAS runs one thread anyway")
@pytest.mark.alone
def test_a_multithreaded_blas_transform_is_a_threads_finding_and_one_thread_wins() -> None:
    runs = _blas_runs(steps=20)
    (default, one), (limited, limited_run) = runs.items()
    probes = [_candidate(limited, limited_run, name=findings.TUNED),
              _candidate(default, one, name="worker_threads")]  # fmt: skip
    trials = [record("t", "ok", config=default,
                          worker_busy_threads=one.metrics.worker_busy_threads)]  # fmt: skip
    (found,) = findings.findings(_candidate(limited, limited_run), probes, trials, Rules())
    assert found.kind == "threads" and "openblas" in found.figure
    assert (
        found.values["samples_per_s_one_thread"]
        > 1.5 * found.values["samples_per_s_default_threads"]
    )


def _stragglers() -> tuple[TrialJob, LoaderConfig]:
    # batches of 8: the two workers keep up with the step but for the slow samples
    return _job("datasets_for_tests:stragglers", steps=100), PROCESSES.with_batch_size(8)


@pytest.mark.slow
@pytest.mark.alone
def test_a_200_ms_sample_in_a_hundred_gives_a_step_s_wait_a_long_tail() -> None:
    job, config = _stragglers()
    winner = _candidate(config, run_trial(job, config))
    assert findings.probe_configs(winner, [], Rules())["in_order"].in_order is False
    p50, p99, tail = findings._tail(winner) or (0, 0, 0)
    assert p99 > 5 * p50 and tail > 0.1


@pytest.mark.slow
@pytest.mark.alone
def test_a_200_ms_sample_in_a_hundred_is_a_straggler_finding() -> None:
    """The search's own probe: the winner in order beside itself out of order, rotated.
    The probes run 300 steps (about 5 s): at 100, one run in two left the in-order
    and out-of-order runs overlapping on this 2-core machine."""
    job, config = _stragglers()
    winner = _candidate(config, run_trial(job, config), name="top-1")
    verified = Verified([winner], {})
    longer = replace(job, segment=replace(job.segment, steps=300, report_every=300))
    probed = probes.probe(verified, longer, "samples_per_s", [], LocalMeasurer(),
                            LogProgress(), Rules())  # fmt: skip
    assert {c.name for c in probed.probes} == {"tuned", "persistent_workers", "in_order"}
    found = findings.findings(winner, probed.probes, [], Rules())
    assert [f.kind for f in found] == ["stragglers"], [f.figure for f in found]
    assert found[0].values["samples_per_s_unordered"] > found[0].values["samples_per_s_in_order"]


NO_PATHOLOGY = [
    "synthetic-imagenet",
    "datasets_for_tests:fast",
    "datasets_for_tests:slow",
    "datasets_for_tests:dict_samples",
    "datasets_for_tests:images_with_transfer",
]


def _plain_run(name: str, root: Path, tmp_path: Path) -> tuple[TrialJob, Candidate]:
    """One of the datasets without a pathology read by two worker processes (fresh every
    epoch) for 60 steps, as a winner."""
    job = _job(name, steps=60, samples=64, root=str(root) if name == NO_PATHOLOGY[0] else None)
    if name.endswith("dict_samples"):  # dict batches: the user's step trains them
        os.environ["RECORD_TO"] = str(tmp_path / "record")
        job = replace(job, train_step="datasets_for_tests:make_step")
    config = replace(PROCESSES.with_batch_size(8), persistent_workers=False)
    outcome = run_trial(job, config)
    assert outcome.metrics is not None, outcome.detail
    return job, _candidate(config, outcome)


@pytest.fixture(scope="module")
def fresh() -> Iterator[ProcessPoolExecutor]:
    """A process with none of the test session's heap, as a search's trial process has:
    forked from a test session's heap, workers copied up to 1.7 MB a sample of it in
    some runs (a growth no trial of a search has)."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, spawn, initializer=_fork_by_default) as executor:
        yield executor


def _fork_by_default() -> None:
    """A spawned process spawns its own children too; a trial's process (Ray's) forks."""
    multiprocessing.set_start_method("fork", force=True)


@pytest.mark.parametrize("name", NO_PATHOLOGY)
def test_the_default_and_the_test_datasets_give_no_finding(
    name: str, tiny_imagenet: Path, tmp_path: Path, fresh: ProcessPoolExecutor
) -> None:
    """Nothing copied or kept, no busy threads beyond the workers' own, no slow epoch
    start (a tail, if any, needs the slow tier's probe to be judged); measured in a
    fresh process."""
    _, winner = fresh.submit(_plain_run, name, tiny_imagenet, tmp_path).result()
    tuned = replace(winner, name=findings.TUNED)
    assert findings.findings(winner, [tuned], [], Rules()) == []
    metrics = winner.outcomes[0].metrics
    fit = metrics.memory  # which processes grew, should this fail
    assert metrics.memory_growth_per_sample == 0, (fit.workers, fit.main) if fit else None


def test_a_worker_s_garbage_collection_copies_none_of_the_main_process_s_heap() -> None:
    """A million tracked objects in the measuring process (a test session holds as
    many), and a worker that runs a full collection mid-window: the objects it inherited
    stay shared (unfrozen, the collection copied all of them once: a growth the fit read
    as 1 MB a sample in 1 of 3 full fast-tier runs), and no growth is fitted."""
    from raytune_loader.machine.watch import FOLLOWED
    from raytune_loader.measuring.memoryfit import _still_shared

    heap = [[i] for i in range(1_000_000)]  # about 90 MB of objects the collector tracks
    # a window long enough for private-memory readings on both sides of the collection
    # (spaced by their cost, 1% of the CPUs): 40 steps of 8 without delay held one
    job = _job("datasets_for_tests:collects_in_worker", steps=120, samples=1024)
    outcome = run_trial(job, PROCESSES.with_batch_size(8))
    assert outcome.metrics is not None and outcome.metrics.watch is not None, outcome.detail
    shared = [_still_shared(r) for r in outcome.metrics.watch.readings
              if r.worker == FOLLOWED and r.uss is not None]  # fmt: skip
    assert len(shared) >= 2 and shared[0] - shared[-1] < 30 * 2**20, shared
    assert outcome.metrics.memory_growth_per_sample == 0
    assert len(heap) == 1_000_000  # alive through the measurement


@pytest.mark.slow
@pytest.mark.parametrize("name", NO_PATHOLOGY)
@pytest.mark.alone
def test_the_default_and_the_test_datasets_give_no_finding_after_the_probes(
    name: str, tiny_imagenet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search's own probes, in order beside out of order where a step's wait had a
    long tail: none of these datasets has stragglers, whatever the noise of a run."""
    monkeypatch.delenv("RECORD_TO", raising=False)  # _plain_run sets it
    job, winner = _plain_run(name, tiny_imagenet, tmp_path)
    verified = Verified([winner], {})
    probed = probes.probe(verified, job, "samples_per_s", [], LocalMeasurer(), LogProgress(),
                            Rules())  # fmt: skip
    assert findings.findings(winner, probed.probes, [], Rules()) == []


@pytest.mark.slow
@pytest.mark.long
def test_the_memory_projection_lands_within_2x_of_a_run_ten_times_longer() -> None:
    """One worker's copies from a short run's window end to the reads of a run ten times
    longer, projected by the short run's fit, against what the long run measured (its
    followed worker, on the same samples read)."""
    from raytune_loader.machine.watch import FOLLOWED
    from raytune_loader.measuring.memoryfit import _still_shared

    config = LoaderConfig(32, 2, 2, False, True)
    short_job = _job("datasets_for_tests:python_objects", steps=800, samples=300_000)
    long_job = replace(short_job, segment=replace(short_job.segment, steps=8000))
    short, long = run_trial(short_job, config), run_trial(long_job, config)
    fit, lfit = short.metrics.memory, long.metrics.memory
    projected = fit.copied(fit.worker_reads, lfit.worker_reads, fit.shared_bytes[0])
    followed = [(r.reads / 2, _still_shared(r)) for r in long.metrics.watch.readings
                if r.worker == FOLLOWED and r.uss is not None]  # fmt: skip
    before = min(followed, key=lambda p: abs(p[0] - fit.worker_reads))[1]
    measured = before - followed[-1][1]
    assert 0.5 < projected / measured < 2.0, (projected, measured)


def _raydata_run(**figures) -> TrialOutcome:
    from raytune_loader import raydata

    config = raydata.RayDataConfig(16, 4, 4, map_batch_size=16).candidate()
    return _run(config, **figures)


def test_ray_data_findings_say_what_spilled_what_the_actors_held_and_what_held_them_back() -> None:
    """Each Ray Data finding past its threshold, with its figure and fix; none on a
    quiet pipeline (nothing spilled, actors well within their node, no backpressure)."""
    quiet = _raydata_run(store_spilled_bytes=0, actor_rss_bytes=GIB // 2,
                         actor_free_bytes=16 * GIB, backpressure_s=0.0)  # fmt: skip
    assert findings.raydata_findings(_candidate(quiet.config, quiet, quiet)) == []
    loud = _raydata_run(store_spilled_bytes=3 * GIB, actor_rss_bytes=2 * GIB,
                        actor_free_bytes=10 * GIB, actor_uss_ray_bytes=GIB,
                        backpressure_s=3.0)  # fmt: skip
    loud = replace(loud, metrics=replace(loud.metrics, data_wait_frac=0.4))  # type: ignore[arg-type]
    found = {f.kind: f for f in findings.raydata_findings(_candidate(loud.config, loud, loud))}
    assert set(found) == {"spilled", "actor_memory", "backpressure"}
    assert "3.0 GiB" in found["spilled"].figure and "object_store_bytes" in found["spilled"].fix
    assert "4 actors would hold 8.0 GiB" in found["actor_memory"].figure
    assert "Ray Data's own figure for its tasks: 1.0 GiB" in found["actor_memory"].figure
    assert "3.0 s" in found["backpressure"].figure and "40%" in found["backpressure"].figure
    assert found["backpressure"].values["window_s"] == 6.0
    winner = _candidate(loud.config, loud, loud)
    assert {f.kind for f in findings.findings(winner, [], [], Rules())} >= set(found)
    assert findings.raydata_findings(_candidate(PROCESSES, _run(PROCESSES))) == []


def test_a_throttled_store_is_a_finding_with_the_rate_it_allowed() -> None:
    """Windows whose GETs the store answered 503 name the rate it allowed and the fix
    (fewer in flight, or shards), over all the winner's runs (one 503 in one run is
    one); none where nothing was throttled or nothing fetched."""
    config = replace(PROCESSES, fetch_threads=16)
    calm = _run(config, store_requests=100, store_throttled=0)
    assert store_findings.store_findings(_candidate(config, calm, calm)) == []
    once = _run(config, store_requests=100, store_throttled=1)  # a median of 0.5
    (seen,) = store_findings.store_findings(_candidate(config, calm, once))
    assert "answered 1 of the 201 GETs sent" in seen.figure  # 200 answered, 1 tried again
    assert store_findings.store_findings(_candidate(PROCESSES, _run(PROCESSES))) == []
    loud = _run(config, store_requests=130, store_throttled=10)
    found = store_findings.store_findings(_candidate(config, loud, loud))
    assert [f.kind for f in found] == ["throttled"]
    assert "20 of the 280 GETs sent in the 2 measured windows" in found[0].figure
    assert "about 22 requests/s to 32 in flight" in found[0].figure  # 260 answered in 12 s
    assert "(2 workers x 16 fetch threads)" in found[0].figure
    assert "shards" in found[0].fix and "(fetch_threads or workers)" in found[0].fix
    assert found[0].values["allowed_requests_per_s"] == pytest.approx(260 / 12)
    assert (found[0].values["requests"], found[0].values["sent"]) == (260, 280)
    winner = _candidate(config, loud, loud)
    assert "throttled" in {f.kind for f in findings.findings(winner, [], [], Rules())}
    # a Ray Data candidate's requests are its actors' (counted with its batches)
    actors = LoaderConfig.from_dict({"engine": "raydata", "max_actors": 2,
                                     "map_batch_size": 8}, 16)  # fmt: skip
    (rd,) = store_findings.store_findings(_candidate(actors, loud, loud))
    assert "16 in flight (2 actors x 8 objects a map call)" in rd.figure
    assert "(map_batch_size or max_actors)" in rd.fix


def test_small_objects_from_a_store_are_a_finding_when_shards_would_pay() -> None:
    """A GET a sample, 60 ms each (50 ms of it to the first byte), 2 workers x 4 in
    flight: the profile projects tar shards (a GET for 256 samples, 256 bodies long, 4
    ahead) well past it, applied to the measured rate; none for local data, for a stream,
    or where the store is fast enough that shards gain little."""
    from raytune_loader.measuring.profile import Profile
    from raytune_loader.tuning.costmodel import CostModel

    config = replace(PROCESSES, fetch_threads=4)
    profile = Profile(
        batch_size=16, cores=8, per_core={"pil/float32": 400.0}, collate_s={"pil/float32": 0.001},
        receive_s={"process/float32": 0.001}, finish_s={"pil/float32": 0.0}, fetch_s=0.06,
        store_rate=2000.0, store_latency={"ttfb_p50_s": 0.05, "ttfb_p99_s": 0.09},
    )  # fmt: skip
    model = CostModel(profile, {16: 4000.0})
    winner = _candidate(config, _run(config, 100.0), _run(config, 110.0))
    (found,) = findings.findings(winner, [], [], Rules(), model)
    single = model.predict(config).samples_per_s  # type: ignore[union-attr]
    # shards: per batch 16/256 of a GET of 50 + 256 x 10 ms, a quarter with 4 ahead,
    # fetched while the worker decodes (41 ms a batch, which covers the 10 ms)
    shard_wait = 16 / 256 * (0.05 + 256 * 0.01) / 4
    shards = 2 * 16 / max(16 / 400 + 0.001, shard_wait)
    assert found.kind == "small_objects"
    assert found.values["gain"] == pytest.approx(shards / single)
    assert found.values["projected_samples_per_s"] == pytest.approx(105.0 * shards / single)
    assert "a GET of 60 ms (50 ms of it to the first byte)" in found.figure
    assert "8 requests in flight" in found.figure and "to_shards.py" in found.fix
    assert findings.findings(winner, [], [], Rules()) == []  # no model: no projection
    local = replace(model, profile=replace(profile, fetch_s=0.0, store_latency={}))
    assert findings.findings(winner, [], [], Rules(), local) == []
    streamed = replace(config, access="stream")
    assert findings.findings(_candidate(streamed, _run(streamed)), [], [], Rules(), model) == []
    near = replace(
        model, profile=replace(profile, fetch_s=0.002, store_latency={"ttfb_p50_s": 0.001})
    )
    assert findings.findings(winner, [], [], Rules(), near) == []  # 2 ms a GET: little to gain
    # a Ray Data winner (a call a row: shards would gain): its actors read objects only
    actors = LoaderConfig.from_dict(
        {"engine": "raydata", "max_actors": 2, "map_batch_size": 1}, batch_size=16
    )
    ray_winner = _candidate(actors, _run(actors, 100.0), _run(actors, 110.0))
    assert store_findings.store_findings(ray_winner, model) == []


def test_a_cached_winner_s_slow_first_epoch_is_a_finding_with_its_warm_up() -> None:
    """A winner that caches the bucket's objects: its runs' cold passes at 60 and 70
    samples/s against warm windows of 300 and 320 make a first epoch 4.8 times a later
    one (the medians'); none where the cache gains less, or the winner does not cache."""
    config = replace(PROCESSES, fetch_threads=16, cache=True)
    runs = [
        _run(config, 300.0, cold_samples_per_s=60.0),
        _run(config, 320.0, cold_samples_per_s=70.0),
    ]
    (found,) = store_findings.store_findings(_candidate(config, *runs))
    assert found.kind == "first_epoch" and found.values["ratio"] == pytest.approx(310 / 65)
    assert "at 65 samples/s" in found.figure and "4.8 times as long" in found.figure
    assert "warm the cache before the job" in found.fix and "--cache-bytes 0" in found.fix
    assert "under $XDG_CACHE_HOME or ~/.cache" in found.fix  # where the node keeps it
    winner = _candidate(config, *runs)
    assert "first_epoch" in {f.kind for f in findings.findings(winner, [], [], Rules())}
    close = [_run(config, 100.0, cold_samples_per_s=90.0)]
    assert store_findings.store_findings(_candidate(config, *close)) == []
    plain = replace(config, cache=False)
    assert store_findings.store_findings(_candidate(plain, _run(plain, 300.0))) == []

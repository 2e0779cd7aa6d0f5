"""Several data-parallel ranks per measurement (--ranks-per-node): real processes, gloo."""

from __future__ import annotations

import multiprocessing
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.measuring.outcomes import TrialOutcome
from raytune_loader.measuring.ranks import measure_ceiling, run_trial
from raytune_loader.sources.datasets import DatasetSpec

CONFIG = LoaderConfig(8, 1, 2, False, False)


def _job(dataset: str, data_root: str | None = None, ranks: int = 2) -> TrialJob:
    return TrialJob(
        dataset=DatasetSpec(dataset, data_root),
        model="small-cnn",
        segment=SegmentSpec(warmup_steps=1, steps=4, report_every=2, time_limit_s=60),
        samples_per_trial=64,
        node_cpus=2,
        cpus_per_worker=0.5,
        ranks=ranks,
    )


@dataclass(frozen=True)
class ShardRun:
    outcome: TrialOutcome
    interim: list[dict]
    reads: list[tuple[int, int, str]]  # rank, sample index, the reader's start method


@pytest.fixture(scope="module")
def shard_run(tmp_path_factory: pytest.TempPathFactory) -> ShardRun:
    """One two-rank trial whose ranks log every sample they (or their workers) read."""
    log = tmp_path_factory.mktemp("ranks") / "reads.log"
    interim: list[dict] = []
    outcome = run_trial(_job("datasets_for_tests:shard_log", str(log)), CONFIG, interim.append)
    assert outcome.failure is None, outcome.detail
    reads = [
        (int(r), int(i), method) for r, i, method in map(str.split, log.read_text().splitlines())
    ]
    return ShardRun(outcome, interim, reads)


def test_two_ranks_train_at_once_on_their_own_shards(shard_run: ShardRun) -> None:
    outcome = shard_run.outcome
    first, second = outcome.ranks
    assert (first.rank, second.rank) == (0, 1) and first.pid != second.pid
    assert first.host == second.host  # one node
    assert max(first.started, second.started) < min(first.ended, second.ended)  # at once
    slowest = min(first.samples_per_s, second.samples_per_s)
    assert outcome.metrics.samples_per_s == pytest.approx(2 * slowest, rel=1e-6)
    assert outcome.metrics.samples == 2 * 8 * 4  # both ranks' measured batches
    assert outcome.cpus_reserved == 2  # 2 x (1 + 0.5 x 1) = 3, capped at the node
    reads: dict[int, list[int]] = {0: [], 1: []}
    for rank, index, _ in shard_run.reads:
        reads[rank].append(index)
    # the segment's first pass over the 64 samples: each rank its own half, as a trainer's
    # (after sample 0, which every rank reads first to size its batches)
    assert reads[0][0] == reads[1][0]
    first_pass = [set(reads[rank][1:33]) for rank in (0, 1)]
    assert len(first_pass[0]) == len(first_pass[1]) == 32 and not first_pass[0] & first_pass[1]
    assert shard_run.interim and shard_run.interim[0]["samples_per_s"] > 0  # reach Tune
    columns = outcome.as_report()
    assert columns["ranks"] == 2 and columns["rank_hosts"] == f"{first.host};{first.host}"


def test_a_rank_s_loader_starts_its_workers_as_a_torchrun_rank_would(shard_run: ShardRun) -> None:
    """The ranks are forkserver children, whose own default start method would be
    forkserver: every "default" worker would start a server and import torch (a first
    batch 7.5 s after the loader starts on 2 cores, against 0.2 s forked)."""
    by_rank = {rank: {m for r, _, m in shard_run.reads if r == rank} for rank in (0, 1)}
    assert by_rank == {
        0: {multiprocessing.get_start_method()},
        1: {multiprocessing.get_start_method()},
    }


def test_a_rank_that_dies_fails_the_trial_and_leaves_no_process() -> None:
    import psutil

    outcome = run_trial(_job("datasets_for_tests:rank_one_dies"), LoaderConfig(8))
    assert outcome.failure == "rank_died"
    assert "rank 1 died (exit code -9)" in outcome.detail
    children = psutil.Process().children(recursive=True)
    assert not [c for c in children if c.name().startswith("raytune-rank") or "rank" in c.name()]


def test_one_rank_s_own_failure_is_the_trial_s_reason_not_its_peer_s_broken_collective() -> None:
    started = time.monotonic()
    outcome = run_trial(_job("datasets_for_tests:rank_one_corrupt"), LoaderConfig(8))
    assert outcome.failure == "corrupt_sample"
    assert outcome.detail.startswith("rank 1: ") and "bad Huffman code" in outcome.detail
    assert time.monotonic() - started < 30  # rank 0, waiting in the all-reduce, is ended


def test_a_rank_s_failure_is_the_trial_s_with_the_rank_named() -> None:
    outcome = run_trial(_job("datasets_for_tests:broken"), LoaderConfig(8))
    assert outcome.failure == "data_loader"
    assert re.match(r"rank [01]: ", outcome.detail) and "broken" in outcome.detail  # the first


@pytest.mark.slow
@pytest.mark.alone
def test_the_ceiling_of_two_ranks_is_twice_the_slowest(tiny_imagenet: Path) -> None:
    job = _job("synthetic-imagenet", str(tiny_imagenet))
    size, node = measure_ceiling(job, 8, windows=1)
    _, alone = measure_ceiling(replace(job, ranks=1), 8, windows=1)
    assert size == 8 and node > 0
    assert node < 2.5 * alone  # two ranks at most double one, all-reduce included


def test_a_rank_out_of_memory_backs_off_every_rank_to_the_same_smaller_batch() -> None:
    """Rank 1 runs out of memory at batch 8: both ranks stop and both train at 4, where
    a rank backing off alone would leave its peer in a collective of another size."""
    job = replace(
        _job("datasets_for_tests:fast"),
        train_step="datasets_for_tests:step_oom_on_rank_one_above_4",
        min_batch_size=2, segment=SegmentSpec(warmup_steps=1, steps=4, report_every=2,
                                              time_limit_s=30),
    )  # fmt: skip
    interim: list[dict] = []
    started = time.monotonic()
    outcome = run_trial(job, LoaderConfig(8), interim.append)
    assert outcome.failure is None, outcome.detail
    assert (outcome.effective_batch_size, outcome.oom_backoffs) == (4, 1)
    assert outcome.config.batch_size == 8  # the trial is still the requested candidate
    assert outcome.metrics.samples == 2 * 4 * 4  # both ranks, 4 measured steps of 4
    assert time.monotonic() - started < 30  # no rank waited out the time limit
    assert interim and all(r["oom_backoffs"] == 1 for r in interim)

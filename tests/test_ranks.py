"""Several data-parallel ranks per measurement (--ranks-per-node): real processes, gloo."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from raytune_loader.datasets import DatasetSpec
from raytune_loader.job import SegmentSpec, TrialJob
from raytune_loader.ranks import measure_ceiling, run_trial
from raytune_loader.space import LoaderConfig

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


def test_two_ranks_train_at_once_on_their_own_shards(tmp_path: Path) -> None:
    log = tmp_path / "reads.log"
    interim: list[dict] = []
    outcome = run_trial(_job("datasets_for_tests:shard_log", str(log)), CONFIG, interim.append)
    assert outcome.failure is None, outcome.detail
    first, second = outcome.ranks
    assert (first.rank, second.rank) == (0, 1) and first.pid != second.pid
    assert first.host == second.host  # one node
    assert max(first.started, second.started) < min(first.ended, second.ended)  # at once
    slowest = min(first.samples_per_s, second.samples_per_s)
    assert outcome.metrics.samples_per_s == pytest.approx(2 * slowest, rel=1e-6)
    assert outcome.metrics.samples == 2 * 8 * 4  # both ranks' measured batches
    assert outcome.cpus_reserved == 2  # 2 x (1 + 0.5 x 1) = 3, capped at the node
    reads: dict[int, list[int]] = {0: [], 1: []}
    for rank, index in (map(int, line.split()) for line in log.read_text().splitlines()):
        reads[rank].append(index)
    # the segment's first pass over the 64 samples: each rank its own half, as a trainer's
    # (after sample 0, which every rank reads first to size its batches)
    assert reads[0][0] == reads[1][0]
    first_pass = [set(reads[rank][1:33]) for rank in (0, 1)]
    assert len(first_pass[0]) == len(first_pass[1]) == 32 and not first_pass[0] & first_pass[1]
    assert interim and interim[0]["samples_per_s"] > 0  # rank 0's reports reach Tune
    columns = outcome.as_report()
    assert columns["ranks"] == 2 and columns["rank_hosts"] == f"{first.host};{first.host}"


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


@pytest.mark.slow
def test_a_search_with_two_ranks_per_trial_end_to_end(tiny_imagenet: Path, tmp_path: Path) -> None:
    """--ranks-per-node 2 on 2 cores: both ranks of every trial on this node at once,
    no reservation above the node, the three baselines, ranks_per_node in the JSON."""
    import csv
    import json

    from conftest import TINY_SEARCH, ray_processes, run_cli

    before = ray_processes()
    result = run_cli(
        *TINY_SEARCH, "--data-root", str(tiny_imagenet), "--num-samples", "3",
        "--verify-repeats", "1", "--ranks-per-node", "2", "--cpus-per-worker", "0.5",
        "--search", "tpe",  # the cost model's profile is the fast tier's (test_api's search)
        "--out", str(tmp_path / "out"), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    folder = tmp_path / "out" / "synthetic-imagenet"
    best = json.loads((folder / "best_config.json").read_text())
    assert best["ranks_per_node"] == 2
    assert set(best["baselines"]) == {"pytorch-default", "heuristic", "heuristic-rank-share"}
    assert best["baselines"]["heuristic"]["loader"]["num_workers"] == 2  # min(cpus, 8) a rank
    assert best["baselines"]["heuristic-rank-share"]["loader"]["num_workers"] == 1
    assert "heuristic-rank-share" in result.stdout
    with open(folder / "trials.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r["rank_windows"]]
    assert rows
    for row in rows:
        assert float(row["cpus_reserved"]) <= 2  # never more than the node
        assert row["ranks"] == "2" and len(set(row["rank_hosts"].split(";"))) == 1
        (s0, e0), (s1, e1) = (map(float, w.split("-")) for w in row["rank_windows"].split(";"))
        assert max(s0, s1) < min(e0, e1)  # the two ranks ran at the same time
    assert ray_processes() <= before

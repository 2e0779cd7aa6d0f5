"""The search as a Python API: the space it builds, the data it prepares, what it writes."""

from __future__ import annotations

import csv
import json

import pytest

from conftest import Searched
from raytune_loader import SearchOptions
from raytune_loader.api import search_space
from raytune_loader.job import job_from_options, prepare_data


class _Recorder:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def stage(self, text: str) -> None:
        pass

    def count(self, what: str, done: int, total: int) -> None:
        pass


def test_max_workers_above_usable_cpus_is_clipped_with_a_warning() -> None:
    progress = _Recorder()
    space = search_space(SearchOptions(max_workers=64), usable=2, cuda=False, progress=progress)
    assert space.max_workers == 2
    assert "using 2" in progress.warnings[0]


def test_each_rank_s_workers_are_bounded_by_its_share_of_the_node() -> None:
    progress = _Recorder()
    space = search_space(SearchOptions(ranks_per_node=2), usable=16, cuda=True, progress=progress)
    assert space.max_workers == 8 and space.ranks == 2
    asked = SearchOptions(ranks_per_node=4, max_workers=8)
    assert search_space(asked, usable=16, cuda=True, progress=progress).max_workers == 4
    assert "more than the 4 usable CPUs / 4 ranks; using 4" in progress.warnings[-1]


@pytest.mark.parametrize(("cold", "samples", "warned"), [(True, 64, True), (True, 208, False),
                                                        (False, 64, False)])  # fmt: skip
def test_cold_warns_when_a_trial_would_read_its_block_twice(
    cold: bool, samples: int, warned: bool
) -> None:
    """Batches of 16 x (1 warm-up + 12 steps) = 208 samples a trial reads."""
    progress = _Recorder()
    opts = SearchOptions(dataset="datasets_for_tests:fast", cold=cold, batch_sizes=(8, 16),
                         samples_per_trial=samples, steps=12, warmup_steps=1)  # fmt: skip
    prepare_data(job_from_options(opts, "small-cnn", device="cpu", node_cpus=2), 16, progress)
    assert bool(progress.warnings) == warned
    if warned:
        assert "raise --samples-per-trial to 208" in progress.warnings[0]


def test_every_figure_is_against_one_final_ceiling(searched: Searched) -> None:
    """The ceiling is re-measured beside verification; trials.csv and the JSON use the
    highest measurement, so efficiency and CPU util are shares of the same number."""
    best = json.loads((searched.folder / "best_config.json").read_text())
    ceiling = best["metrics"]["ceiling_samples_per_s"]
    with open(searched.folder / "trials.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r["samples_per_s"]]
    assert rows and {float(r["ceiling_samples_per_s"]) for r in rows} == {ceiling}
    for row in rows:
        speed = float(row["samples_per_s"])
        assert float(row["efficiency"]) == pytest.approx(speed / ceiling)
        assert float(row["util"]) == pytest.approx(speed / ceiling)  # step-timing on a CPU


def test_the_record_says_how_the_search_ran(searched: Searched) -> None:
    search = json.loads((searched.folder / "best_config.json").read_text())["search"]
    assert search["sampler"] == "optuna TPESampler(seed=0, n_startup_trials=4)"
    assert search["scheduler"] == "ASHA(max_t=2, grace_period=1, reduction_factor=2)"
    assert search["trials"] == 4 and search["ok"] + search["stopped_early"] == 4


def test_where_the_gpu_runs_pipeline_stages_the_objective_counts_training_only() -> None:
    """On CUDA a candidate may decode and normalize on the GPU; GPU utilization would
    count that as training, so such searches maximize samples/s: the busier but slower
    one loses."""
    from dataclasses import replace

    from raytune_loader.api import _objective
    from raytune_loader.measure import SegmentMetrics, TrialOutcome
    from raytune_loader.selection import Candidate, select
    from raytune_loader.space import LoaderConfig, SearchSpace

    space = SearchSpace(max_workers=8, batch_sizes=(256,), cuda=True, usable_cpus=8)
    job = job_from_options(SearchOptions(), "resnet50", device="cuda", node_cpus=8)
    progress = _Recorder()
    assert _objective(SearchOptions(), space, job, progress).objective == "util"
    chosen = _objective(SearchOptions(), replace(space, pipeline=True), job, progress)
    assert chosen.objective == "samples_per_s"
    cpu_job = replace(job, device="cpu")
    assert (
        _objective(SearchOptions(), replace(space, pipeline=True), cpu_job, progress).objective
        == "util"
    )

    def measured(decode: str, speed: float, util: float) -> Candidate:
        config = LoaderConfig(256, 8, 2, True, True, transfer="uint8", decode=decode)
        runs = tuple(
            TrialOutcome(config, 9, 0, SegmentMetrics(speed, 0.1, util, "nvml-process", util,
                                                      256 * 60, 1.0))
            for _ in range(3)
        )  # fmt: skip
        return Candidate(decode, config, runs)

    # decoding on the GPU keeps it busier, yet trains fewer samples a second
    busy, fast = measured("device", 900.0, 0.95), measured("pil", 1000.0, 0.80)
    assert select([busy, fast], "util").winner is busy  # what raw utilization would pick
    assert select([busy, fast], chosen.objective).winner is fast

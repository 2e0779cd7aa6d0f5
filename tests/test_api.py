"""The search as a Python API: the space it builds, its objective, what it records."""

from __future__ import annotations

import csv
import json
import stat

import pytest

from conftest import Searched
from raytune_loader import SearchOptions
from raytune_loader.measuring.job import SegmentSpec
from raytune_loader.tuning.bounds import search_space, worker_bound
from raytune_loader.tuning.options import job_from_options


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
    assert worker_bound(SearchOptions(max_workers=64), 2, progress) == 2
    assert "using 2" in progress.warnings[0]
    space = search_space(SearchOptions(max_workers=64), usable=2, cuda=False, progress=progress)
    assert space.max_workers == 2 and len(progress.warnings) == 1  # said once, before Ray


def test_each_rank_s_workers_are_bounded_by_its_share_of_the_node() -> None:
    progress = _Recorder()
    space = search_space(SearchOptions(ranks_per_node=2), usable=16, cuda=True, progress=progress)
    assert space.max_workers == 8 and space.ranks == 2
    asked = SearchOptions(ranks_per_node=4, max_workers=8)
    assert search_space(asked, usable=16, cuda=True, progress=progress).max_workers == 4
    assert worker_bound(asked, 16, progress) == 4
    assert "more than the 4 usable CPUs / 4 ranks; using 4" in progress.warnings[-1]


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
    """The sampler and the scheduler of this search, ASHA's rungs counted in its reports
    (test_tuner.py checks that the scheduler Tune runs does what this text says)."""
    search = json.loads((searched.folder / "best_config.json").read_text())["search"]
    assert search["sampler"] == "cost model, then optuna TPESampler(seed=0, n_startup_trials=4)"
    assert search["method"] == "model" and search["model"]["profile"]["per_core"]
    reports = SegmentSpec(**search["segment"]).reports  # 6 steps, a report every 3
    assert reports == 2
    assert search["scheduler"] == f"ASHA(max_t={reports}, grace_period=1, reduction_factor=2)"
    assert search["trials"] == 4 and search["ok"] + search["stopped_early"] == 4


def test_every_result_file_has_the_mode_a_file_opened_there_gets(searched: Searched) -> None:
    """The folder's files are renamed from temporary files, whose mode is 0600: on a
    cluster's shared disk nobody else could read best_config.json. Each has the mode
    ``open`` gives a new file in the same folder (the umask's)."""
    fresh = searched.folder / ".mode-probe"
    fresh.write_text("")
    try:
        expected = stat.S_IMODE(fresh.stat().st_mode)
    finally:
        fresh.unlink()
    files = [p for p in searched.folder.iterdir() if p.is_file()]
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in files}
    assert {"best_config.json", "trials.csv", "report.md"} <= modes.keys()
    assert modes == dict.fromkeys(modes, expected)


def test_where_the_gpu_runs_pipeline_stages_the_objective_counts_training_only() -> None:
    """On CUDA a candidate may decode and normalize on the GPU; GPU utilization would
    count that as training, so such searches maximize samples/s (test_selection.py:
    the busier but slower candidate then loses)."""
    from dataclasses import replace

    from raytune_loader.tuning.bounds import objective_options
    from raytune_loader.tuning.space import SearchSpace

    space = SearchSpace(max_workers=8, batch_sizes=(256,), cuda=True, usable_cpus=8)
    job = job_from_options(SearchOptions(), "resnet50", device="cuda", node_cpus=8)
    progress = _Recorder()
    assert objective_options(SearchOptions(), space, job, progress).objective == "util"
    chosen = objective_options(SearchOptions(), replace(space, pipeline=True), job, progress)
    assert chosen.objective == "samples_per_s"
    cpu_job = replace(job, device="cpu")
    assert (
        objective_options(
            SearchOptions(), replace(space, pipeline=True), cpu_job, progress
        ).objective
        == "util"
    )


class _Cluster:
    def __init__(self, remote: float, node_cpus: float = 2.0) -> None:
        self.remote_cpus, self.node_cpus = remote, node_cpus


@pytest.mark.parametrize(
    ("asked", "remote", "cap", "ranks", "offered"),
    [
        (None, 0.0, None, 1, 0.0),  # one machine: only when asked
        (True, 0.0, None, 1, 1.0),  # asked: the CPU beside the trial's own
        (None, 6.0, None, 1, 6.0),  # a cluster with CPU nodes: all of them
        (None, 6.0, 4.0, 1, 4.0),  # --remote-cpus caps a trial's actors
        (False, 6.0, None, 1, 0.0),  # --no-ray-data
        (None, 6.0, None, 2, 0.0),  # several ranks: not offered
        (True, 0.0, 0.5, 1, 0.0),  # not a CPU for an actor
    ],
)
def test_ray_data_is_offered_where_the_cluster_has_cpus_for_its_actors_or_when_asked(
    asked: bool | None, remote: float, cap: float | None, ranks: int, offered: float
) -> None:
    from dataclasses import replace

    from raytune_loader.tuning.bounds import raydata_cpus

    opts = SearchOptions(ray_data=asked, remote_cpus=cap)
    job = replace(job_from_options(opts, "small-cnn", device="cpu", node_cpus=2.0), ranks=ranks)
    said = _Recorder()
    assert raydata_cpus(opts, _Cluster(remote), job, said) == offered
    if asked and not offered:
        assert said.warnings and "\n" not in said.warnings[0]


def test_no_file_the_search_or_its_ray_instance_wrote_holds_a_credential(
    searched: Searched,
) -> None:
    """The search ran with AWS credentials in its environment: none is in its output
    folder, nor in its Ray instance's session folder (Tune copies the driver's AWS keys
    into each trial's runtime_env, and Ray's runtime_env agent logs it, world-readable)."""
    from conftest import CREDENTIALS

    assert len(searched.ray_sessions) == 1, searched.ray_sessions
    files = [f for root in (searched.folder, *searched.ray_sessions) for f in root.rglob("*")
             if f.is_file() and not f.is_symlink()]  # fmt: skip
    (agent,) = [f for f in files if f.name == "runtime_env_agent.log"]
    assert "Creating runtime env" in agent.read_text()  # where Tune's trials' are logged
    found = set()
    for file in files:
        content = file.read_bytes()
        found |= {(file.name, name) for name, value in CREDENTIALS.items()
                  if value.encode() in content}  # fmt: skip
    assert found == set()

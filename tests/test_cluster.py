"""The search on an existing multi-node Ray cluster (started here with ray.cluster_utils)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from conftest import ray_processes, ray_processes_left, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.long]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    before = ray_processes()
    # its workers at the priority of the processes beside it (Ray's default is 15,
    # below them all: its trials took 3x as long beside the other tests); no dashboard:
    # test_dashboard's search may hold the port, and the search says when there is none
    nodes = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False,
                        "_system_config": {"worker_niceness": 0}},
    )  # fmt: skip
    try:
        yield nodes
    finally:
        nodes.shutdown()
    assert not ray_processes_left(before)  # no node left behind


def _search(
    cluster: Cluster, data: Path, out: Path, *extra: str, trials: int = 4
) -> list[dict[str, str]]:
    result = run_cli(
        "--address", cluster.address, "--data-root", str(data), "--synthetic-images", "96",
        "--num-samples", str(trials), "--batch-size", "8", "--steps", "6", "--warmup-steps", "1",
        "--report-every", "3", "--samples-per-trial", "64", "--verify-top", "1",
        "--verify-repeats", "1", "--search", "tpe", "--out", str(out), *extra, cwd=out.parent,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the cluster's dashboard" in result.stdout or "dashboard not available" in result.stdout
    with open(out / "synthetic-imagenet" / "trials.csv") as handle:
        return list(csv.DictReader(handle))


def _own_cpus(row: dict[str, str]) -> float:
    """The CPUs a trial reserved on its own node: a Ray Data trial's reservation also
    holds its actors' bundles, which a cluster with CPUs beyond the trial's node places
    on other nodes."""
    reserved = float(row["cpus_reserved"])
    if row["engine"] == "raydata":
        reserved -= int(row["max_actors"]) * float(row["cpus_per_actor"])
    return reserved


def test_trials_spread_over_nodes_within_their_size_and_results_per_class(
    cluster: Cluster, tiny_imagenet: Path, tmp_path: Path
) -> None:
    small = cluster.add_node(num_cpus=1, resources={"loader-node": 1})
    large = cluster.add_node(num_cpus=2, resources={"loader-node": 1})
    cluster.wait_for_nodes()
    # One CPU a trial (no workers): three at once need both nodes, 3 CPUs in all. With
    # workers, a trial may wait for the larger node while the smaller one idles.
    rows = _search(cluster, tiny_imagenet, tmp_path / "results", "--node-type", "loader-node",
                   "--max-concurrent", "3", "--max-workers", "0", trials=6)  # fmt: skip
    labelled = {small.node_id: 1.0, large.node_id: 2.0}
    assert {r["node_id"] for r in rows} <= set(labelled)  # never on the unlabelled head
    assert len({r["node_id"] for r in rows}) >= 2  # spread over more than one node
    for row in rows:
        assert _own_cpus(row) <= labelled[row["node_id"]]  # fits its node
        assert float(row["node_cpus"]) == labelled[row["node_id"]]
        assert int(row["num_workers"]) == 0
    classes = {r["hardware_class"] for r in rows}
    assert len(classes) == 2
    folder = tmp_path / "results" / "synthetic-imagenet"
    for hw_class in classes:
        per_class = json.loads((folder / hw_class / "best_config.json").read_text())
        assert per_class["hardware"]["hardware_class"] == hw_class
    top = json.loads((folder / "best_config.json").read_text())
    assert set(top["per_class"]) == classes
    # the rule of thumb follows the largest node's CPUs, not the driver's
    assert top["baselines"]["heuristic"]["note"].endswith("min(usable CPUs, 8) = 2")


def test_fractional_gpus_are_packed_two_per_logical_gpu(
    cluster: Cluster, tiny_imagenet: Path, tmp_path: Path
) -> None:
    # CPUs for four trials per node: only the GPU can hold a node to two at once
    for _ in range(2):
        cluster.add_node(num_cpus=4, num_gpus=1)
    cluster.wait_for_nodes()
    rows = _search(cluster, tiny_imagenet, tmp_path / "results", "--gpus-per-trial", "0.5",
                   "--max-workers", "0")  # fmt: skip
    assert len(rows) == 4
    assert all(r["cuda_visible_devices"] != "" for r in rows)  # Ray assigned a GPU to each
    for node in {r["node_id"] for r in rows}:
        spans = [
            (float(r["finished_at"]) - float(r["time_total_s"]), float(r["finished_at"]))
            for r in rows
            if r["node_id"] == node
        ]
        for start, _ in spans:
            running = sum(s <= start < e for s, e in spans)
            assert running <= 2  # at most two 0.5-GPU trials on a one-GPU node


def test_a_two_rank_trial_gets_two_gpus_on_one_node(
    cluster: Cluster, tiny_imagenet: Path, tmp_path: Path
) -> None:
    """One node with 2 logical GPUs, one with 1: a trial of 2 ranks, 1 GPU each, fits
    only the first, and Ray gives it both GPUs (the ranks train with gloo on the CPU)."""
    two = cluster.add_node(num_cpus=2, num_gpus=2)
    cluster.add_node(num_cpus=2, num_gpus=1)
    cluster.wait_for_nodes()
    rows = _search(cluster, tiny_imagenet, tmp_path / "results", "--ranks-per-node", "2",
                   "--gpus-per-trial", "2", "--max-workers", "0", trials=1)  # fmt: skip
    assert rows
    for row in rows:
        assert row["node_id"] == two.node_id
        assert len(row["cuda_visible_devices"].split(",")) == 2  # two GPUs for two ranks
        assert row["ranks"] == "2" and _own_cpus(row) <= 2

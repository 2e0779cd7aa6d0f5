from __future__ import annotations

import os
from pathlib import Path

import pytest

from raytune_loader.api import search_space
from raytune_loader.hardware import cgroup_cpu_limit, hardware_info, usable_cpus
from raytune_loader.options import SearchOptions


def test_cgroup_v2_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cgroup_cpu_limit(tmp_path) == 1.0
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    assert cgroup_cpu_limit(tmp_path) is None


def test_usable_cpus_is_the_smaller_of_quota_and_affinity(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text("100000 100000")
    assert usable_cpus(tmp_path) == 1
    (tmp_path / "cpu.max").write_text(f"{(affinity + 4) * 100000} 100000")
    assert usable_cpus(tmp_path) == affinity
    (tmp_path / "cpu.max").write_text("150000 100000")  # 1.5 CPUs of quota round up to 2
    assert usable_cpus(tmp_path) == min(2, affinity)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to narrow")
def test_usable_cpus_follows_the_affinity_set(tmp_path: Path) -> None:
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert usable_cpus(tmp_path) == 1
        assert hardware_info()["usable_cpus"] == 1
        space = search_space(SearchOptions(), usable_cpus(), cuda=False, progress=None)  # type: ignore[arg-type]
        assert space.max_workers == 1  # the space follows the CPUs we may use
        assert space.baselines()["heuristic"].num_workers == 1
    finally:
        os.sched_setaffinity(0, before)
    assert usable_cpus(tmp_path) == len(before)

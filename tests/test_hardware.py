from __future__ import annotations

import os
from pathlib import Path

import pytest

from raytune_loader.machine.hardware import (
    cgroup_cpu_limit,
    cpu_time_stolen,
    hardware_info,
    stolen_share,
    usable_cpus,
)
from raytune_loader.tuning.bounds import search_space
from raytune_loader.tuning.options import SearchOptions


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


def _cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 {flags}\n\n")
    return path


@pytest.mark.parametrize(
    ("flags", "bf16", "fp16"),
    [("avx2", False, False), ("avx2 avx512f avx512_bf16", True, False),
     ("amx_bf16 amx_fp16 amx_tile", True, True)],
)  # fmt: skip
def test_half_precision_instructions_are_read_from_the_cpu_flags(
    tmp_path: Path, flags: str, bf16: bool, fp16: bool
) -> None:
    from raytune_loader.machine.hardware import cpu_computes_in

    path = _cpuinfo(tmp_path, flags)
    assert (cpu_computes_in("bf16", path), cpu_computes_in("fp16", path)) == (bf16, fp16)
    assert cpu_computes_in("bf16", tmp_path / "absent") is None  # not Linux: unknown


@pytest.mark.parametrize(("precision", "flags", "address", "warned"), [
    ("bf16", "avx2", None, True), ("bf16", "avx512_bf16", None, False),
    ("fp32", "avx2", None, False), (None, "avx2", None, False),  # the CPU's default, fp32
    ("bf16", "avx2", "10.0.0.1:6379", False),  # a cluster's trials run on its nodes' CPUs
])  # fmt: skip
def test_a_half_precision_search_on_a_cpu_without_it_is_warned_before_ray_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    precision: str | None,
    flags: str,
    address: str | None,
    warned: bool,
) -> None:
    from raytune_loader.machine import hardware
    from raytune_loader.progress import LogProgress
    from raytune_loader.tuning import setup

    path = _cpuinfo(tmp_path, flags)
    real = hardware.cpu_computes_in
    monkeypatch.setattr(hardware, "cpu_computes_in", lambda p: real(p, path))
    monkeypatch.setattr(hardware, "cuda_available", lambda: False)
    opts = SearchOptions(precision=precision, address=address, out=str(tmp_path / "out"))
    with caplog.at_level("WARNING", logger="raytune_loader.progress"):
        job = setup.checked(opts, LogProgress()).job
    said = [r.getMessage() for r in caplog.records if "instructions" in r.getMessage()]
    assert bool(said) == warned, caplog.text
    if warned:
        assert said[0].startswith(f"--precision {precision} on a CPU without {precision}")
        assert job.precision == precision  # warned, not overridden: the user's choice


def test_the_stolen_share_is_of_every_cpu_s_time_in_seconds() -> None:
    """Two real readings a second apart: the CPU time between them is the wall time on
    every logical CPU (/proc/stat counts all, in seconds); the stolen share a fraction."""
    import time

    before, start = cpu_time_stolen(), time.monotonic()
    time.sleep(1.0)
    after, wall = cpu_time_stolen(), time.monotonic() - start
    assert after[1] - before[1] == pytest.approx(wall * os.cpu_count(), rel=0.25)
    share = stolen_share(before, after)
    assert share is not None and 0.0 <= share <= 1.0
    assert stolen_share((3.0, 100.0), (5.0, 120.0)) == pytest.approx(0.1)
    assert stolen_share(before, before) is None

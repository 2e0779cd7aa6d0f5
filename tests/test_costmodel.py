"""The cost model: where a candidate's time goes, from measured per-stage costs."""

from __future__ import annotations

import pytest

from raytune_loader.costmodel import CostModel, median_error, what_if
from raytune_loader.profile import Profile
from raytune_loader.space import LoaderConfig


def _model(per_core: float, cores: int = 4, ceiling: float = 400.0, cuda: bool = False,
           ranks: int = 1) -> CostModel:  # fmt: skip
    profile = Profile(
        batch_size=32, cores=cores, per_core={"pil/float32": per_core},
        collate_s={"pil/float32": 0.002}, receive_s={"process/float32": 0.004,
        "thread/float32": 0.0001}, finish_s={"pil/float32": 0.0},
    )  # fmt: skip
    return CostModel(profile, {32: ceiling, 64: 420.0}, cuda=cuda, ranks=ranks)


def _with(count: int, **fields: object) -> LoaderConfig:
    return LoaderConfig.from_dict({"num_workers": count, **fields}, batch_size=32)


def test_a_costly_decode_wants_workers_up_to_the_cores() -> None:
    """100 samples/s a core against a 400 samples/s step: each worker adds speed until
    the cores are busy."""
    model = _model(per_core=100.0)
    speeds = [model.predict(_with(w)).samples_per_s for w in range(5)]  # type: ignore[union-attr]
    assert speeds[0] < speeds[1] < speeds[2] < speeds[3]
    assert model.predict(_with(1)).bound == "workers"  # type: ignore[union-attr]
    assert model.predict(_with(4)).bound == "cores"  # type: ignore[union-attr]


def test_free_data_wants_no_workers_on_a_cpu() -> None:
    """Reading costs nothing: the step sets the pace, and workers only cost receiving."""
    model = _model(per_core=1e6)
    none, two = model.predict(_with(0)), model.predict(_with(2))
    assert none.bound == two.bound == "step"  # type: ignore[union-attr]
    assert none.samples_per_s >= two.samples_per_s  # type: ignore[union-attr]


def test_on_a_gpu_the_step_and_the_workers_do_not_share_the_cores() -> None:
    cpu, gpu = _model(per_core=100.0, cores=2), _model(per_core=100.0, cores=2, cuda=True)
    assert gpu.predict(_with(4)).samples_per_s > cpu.predict(_with(4)).samples_per_s  # type: ignore[union-attr]


def test_threads_receive_cheaper_and_ranks_share_the_node() -> None:
    model = _model(per_core=1e6)
    threads = model.predict(_with(2, workers="thread")).samples_per_s  # type: ignore[union-attr]
    processes = model.predict(_with(2)).samples_per_s  # type: ignore[union-attr]
    assert threads > processes
    node, rank_share = _model(100.0, cores=8, ranks=2), _model(100.0, cores=4)
    each = rank_share.predict(_with(3)).samples_per_s  # type: ignore[union-attr]
    assert node.predict(_with(3)).samples_per_s == pytest.approx(2 * each)  # type: ignore[union-attr]


def test_no_prediction_without_the_structure_or_the_ceiling() -> None:
    model = _model(per_core=100.0)
    assert model.predict(_with(1, transfer="uint8")) is None
    assert model.predict(LoaderConfig(16)) is None


def test_what_if_says_when_cpus_not_settings_are_the_limit() -> None:
    found = what_if(_model(per_core=100.0, cores=2), _with(2), [2, 4, 8])
    assert [f["cores"] for f in found] == [2, 4, 8] and all(f["estimate"] for f in found)
    speeds = [f["samples_per_s"] for f in found]
    assert speeds[0] < speeds[1] < speeds[2] <= 400.0


def test_median_error() -> None:
    assert median_error([(110, 100), (90, 100), (100, 100)]) == pytest.approx(0.1)
    assert median_error([]) is None

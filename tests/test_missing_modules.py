"""A module a configuration needs and the machine lacks: thread
workers import ``torchdata.nodes`` only when a loader is built. Missing, it is the
measurement's one-line failure (``missing_module``) wherever it is met: a trial, a
verification run, the profile (whose handler then searches with TPE alone); never a
traceback out of the search.

The module is hidden the way Python does it (``sys.modules[name] = None`` makes its
import raise ``ModuleNotFoundError``); the loader and the measurement are the real ones.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import pytest

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import DataPipelineError
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.measuring.measure import run_trial
from raytune_loader.sources.datasets import DatasetSpec
from raytune_loader.tuning import setup, trainable
from raytune_loader.tuning.options import SearchOptions
from raytune_loader.tuning.space import SearchSpace

JOB = TrialJob(
    DatasetSpec("datasets_for_tests:fast"), "small-cnn",
    SegmentSpec(warmup_steps=1, steps=2, report_every=2, time_limit_s=30),
    samples_per_trial=64, node_cpus=2,
)  # fmt: skip
THREADS = LoaderConfig(8, 1, 2, workers="thread")


@pytest.fixture
def no_torchdata(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("torchdata", "torchdata.nodes"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.usefixtures("no_torchdata")
def test_a_thread_worker_measurement_without_torchdata_fails_in_one_line() -> None:
    with pytest.raises(ModuleNotFoundError):  # what the measurement itself raises
        run_trial(JOB, THREADS)
    with pytest.raises(DataPipelineError) as failed:  # what a Ray task returns instead
        trainable._guarded(run_trial)(JOB, THREADS)
    assert failed.value.reason == "missing_module"
    detail = str(failed.value)
    assert "\n" not in detail and "torchdata" in detail and "pip install torchdata" in detail
    assert failed.value.__cause__ is None and failed.value.__suppress_context__


@pytest.mark.usefixtures("no_torchdata")
def test_a_trial_without_torchdata_is_reported_as_a_failed_trial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reports: list[dict] = []
    monkeypatch.setattr(trainable, "_node", dict)
    monkeypatch.setattr(trainable.tune, "report", reports.append)
    trainable.trial_fn({"num_workers": 1, "batch_size": 8, "workers": "thread"}, JOB)
    (final,) = reports
    assert final["failure"] == "missing_module" and "torchdata" in final["detail"]
    assert final["samples_per_s"] == 0.0  # the worst, for the searcher


@pytest.mark.usefixtures("no_torchdata")
def test_process_workers_do_not_need_torchdata() -> None:
    outcome = trainable._guarded(run_trial)(JOB, LoaderConfig(8, 1, 2))
    assert outcome.failure is None


@dataclass
class _Progress:
    warnings: list[str] = field(default_factory=list)

    def stage(self, text: str) -> None:
        pass

    def warn(self, text: str) -> None:
        self.warnings.append(text)


class _Measurer:
    def __init__(self, raised: Exception) -> None:
        self.raised = raised

    def profile(self, *args: object) -> None:
        raise self.raised


@pytest.mark.parametrize(
    "raised",
    [
        ModuleNotFoundError("No module named 'torchdata'", name="torchdata"),  # in-process
        DataPipelineError("missing_module", "No module named 'torchdata': install it"),  # a task
    ],
    ids=["in-process", "ray-task"],
)
def test_a_profile_that_meets_a_missing_module_is_one_warning_and_tpe(raised: Exception) -> None:
    space = SearchSpace(max_workers=2, batch_sizes=(8,), cuda=False, usable_cpus=2, pipeline=True,
                        thread_workers=True)  # fmt: skip
    progress = _Progress()
    model = setup.cost_model(SearchOptions(), JOB, space, _Measurer(raised), 2, progress)  # type: ignore[arg-type]
    assert model is None
    (warning,) = progress.warnings
    assert "torchdata" in warning and warning.endswith("searching with TPE alone")
    assert "\n" not in warning

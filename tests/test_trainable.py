"""The trial side of Ray, on the CPU without starting Ray: Tune's config dict becomes a
``LoaderConfig`` at this boundary, every report says where the trial ran and what it
reserved, and the watchdog never outlives the trial.

``run_trial`` (tested in test_ranks.py and test_measure.py), the node lookup (which
asks the running Ray) and ``tune.report`` are replaced by stand-ins.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.job import DATA_SLOT, SegmentSpec, TrialJob
from raytune_loader.measuring.outcomes import SegmentMetrics, TrialOutcome
from raytune_loader.sources.datasets import DatasetSpec
from raytune_loader.tuning import trainable

JOB = TrialJob(
    DatasetSpec("datasets_for_tests:fast"), "small-cnn",
    SegmentSpec(steps=4, report_every=2, time_limit_s=30), node_cpus=2,
)  # fmt: skip
NODE = {"node_id": "n1", "hostname": "host-1", "hardware_class": "amd-2cpu-cpu-24gb"}
METRICS = SegmentMetrics(100.0, 0.2, 0.5, "step-timing", None, 64, 0.64)


class Trial:
    """Stands in for run_trial and tune.report: what the trial function asked and said."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fails: bool = False) -> None:
        self.calls: list[tuple[LoaderConfig, int]] = []
        self.reports: list[dict[str, Any]] = []
        self.fails = fails
        monkeypatch.setattr(trainable, "_node", lambda: dict(NODE))
        monkeypatch.setattr(trainable, "run_trial", self.run_trial)
        monkeypatch.setattr(trainable.tune, "report", self.reports.append)

    def run_trial(self, job: TrialJob, config: LoaderConfig, report: Any, slot: int) -> Any:
        self.calls.append((config, slot))
        report({"samples_per_s": 90.0, "training_iteration": 1})  # an interim report
        if self.fails:
            raise RuntimeError("the trial raised")
        return TrialOutcome(config, 2.0, 1024, METRICS)


def test_tune_s_config_becomes_the_loader_config_and_the_data_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trial = Trial(monkeypatch)
    config = {"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True,
              "batch_size": 16, "transfer": "uint8", "decode": "tensor", DATA_SLOT: 3}  # fmt: skip
    trainable.trial_fn(config, JOB)
    expected = LoaderConfig(16, 2, 4, persistent_workers=True, transfer="uint8", decode="tensor")
    assert trial.calls == [(expected, 3)]


def test_a_trial_without_a_data_slot_reads_the_shared_subset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trial = Trial(monkeypatch)
    trainable.trial_fn({"num_workers": 0, "batch_size": 8}, JOB)
    assert trial.calls == [(LoaderConfig(8), 0)]


def test_every_report_says_where_the_trial_ran_and_what_it_reserved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trial = Trial(monkeypatch)
    trainable.trial_fn({"num_workers": 2, "batch_size": 8}, JOB)
    interim, final = trial.reports
    for report in (interim, final):  # early stops included: ASHA may stop after the first
        assert {k: report[k] for k in NODE} == NODE
        assert report["cpus_reserved"] == 2.0  # 1 + 2 workers, capped at the node's 2 CPUs
        assert "ranks" not in report
    assert interim["samples_per_s"] == 90.0
    assert final["final"] and final["samples_per_s"] == 100.0 and final["util"] == 0.5


def test_with_several_ranks_the_reports_say_how_many(monkeypatch: pytest.MonkeyPatch) -> None:
    trial = Trial(monkeypatch)
    trainable.trial_fn({"num_workers": 1, "batch_size": 8}, replace(JOB, ranks=2, node_cpus=8))
    assert [(r["ranks"], r["cpus_reserved"]) for r in trial.reports] == [(2, 4.0), (2, 4.0)]


class _Timer:
    made: list[_Timer] = []

    def __init__(self, interval: float, function: Any, args: tuple[Any, ...] = ()) -> None:
        self.interval, self.function, self.args = interval, function, args
        self.daemon = False
        self.started = self.cancelled = False
        _Timer.made.append(self)

    def start(self) -> None:
        self.started = True

    def cancel(self) -> None:
        self.cancelled = True


@pytest.mark.parametrize("fails", [False, True], ids=["returns", "raises"])
def test_the_watchdog_ends_a_stuck_trial_s_process_and_never_outlives_the_trial(
    fails: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample that never returns in the main process cannot be interrupted: past the
    trial's own limit, the watchdog ends the process. A trial that ends stops it."""
    Trial(monkeypatch, fails=fails)
    _Timer.made.clear()
    monkeypatch.setattr(trainable.threading, "Timer", _Timer)
    if fails:
        with pytest.raises(RuntimeError, match="the trial raised"):
            trainable.trial_fn({"num_workers": 0, "batch_size": 8}, JOB)
    else:
        trainable.trial_fn({"num_workers": 0, "batch_size": 8}, JOB)
    (watchdog,) = _Timer.made
    assert watchdog.function is os._exit and watchdog.daemon
    assert watchdog.interval > JOB.segment.time_limit_s  # the trial's own timeout comes first
    assert watchdog.started and watchdog.cancelled

"""The content of best_config.json, from verification candidates and trial records."""

from __future__ import annotations

import pytest

from raytune_loader.bestconfig import _baselines, _limit, metrics_of
from raytune_loader.console import limit_line
from raytune_loader.measure import InputRate, SegmentMetrics, TrialOutcome
from raytune_loader.selection import Candidate, fitting
from raytune_loader.space import HEURISTIC, PYTORCH_DEFAULT, LoaderConfig, SearchSpace


def _run(config: LoaderConfig, speed: float, ceiling: float | None = None, **extra) -> TrialOutcome:
    metrics = SegmentMetrics(speed, 0.1, 0.9, "step-timing", None, 320, 1.0)
    return TrialOutcome(config, 1, 0, metrics, ceiling_samples_per_s=ceiling, **extra)


def test_after_an_oom_back_off_the_json_gives_the_batch_size_that_fits() -> None:
    config = LoaderConfig(batch_size=4096)
    ran = _run(config, 100, effective_batch_size=1024, oom_backoffs=2)
    candidate = Candidate("top-1", config, (ran, ran))
    assert fitting(candidate).batch_size == 1024
    metrics = metrics_of(candidate)
    assert (metrics["requested_batch_size"], metrics["effective_batch_size"]) == (4096, 1024)
    assert metrics["oom_backoffs"] == 4


def test_a_heuristic_clipped_by_max_workers_says_so_in_the_json() -> None:
    space = SearchSpace(max_workers=3, batch_sizes=(32,), cuda=False, usable_cpus=12)
    assert space.baselines()[HEURISTIC].num_workers == 3
    by_name = {name: Candidate(name, config, ()) for name, config in space.baselines().items()}
    out = _baselines(by_name, space.heuristic_note)
    assert out[HEURISTIC]["note"] == (
        "num_workers is --max-workers 3, below the rule of thumb min(usable CPUs, 8) = 8"
    )
    assert "note" not in out[PYTORCH_DEFAULT]


def test_efficiency_is_the_median_share_of_the_ceiling() -> None:
    config = LoaderConfig(batch_size=32)
    candidate = Candidate("tuned", config, tuple(_run(config, s, 400.0) for s in (200, 300, 320)))
    metrics = metrics_of(candidate)
    assert metrics["efficiency"]["median"] == 0.75 and "ceiling_note" not in metrics


def test_an_efficiency_above_one_within_noise_is_reported_as_a_ceiling_too_low() -> None:
    config = LoaderConfig(batch_size=32)
    candidate = Candidate("tuned", config, tuple(_run(config, s, 300.0) for s in (309, 312)))
    metrics = metrics_of(candidate)
    assert metrics["efficiency"] is None
    assert "measured too low" in metrics["ceiling_note"] and "1.04" in metrics["ceiling_note"]
    assert "refused" not in metrics


def test_a_run_above_the_ceiling_beyond_noise_is_refused_and_said() -> None:
    """585 samples/s against a ceiling of 534 (grid.json's defect): not a figure to report."""
    config = LoaderConfig(batch_size=32)
    runs = (_run(config, 500, 534.0), _run(config, 585, 534.0), _run(config, 510, 534.0))
    candidate = Candidate("tuned", config, runs)
    metrics = metrics_of(candidate)
    assert metrics["samples_per_s"]["values"] == [500, 510]  # the defect left out
    assert len(metrics["refused"]) == 1 and "585" in metrics["refused"][0]
    assert "above the ceiling" in metrics["refused"][0] and "534" in metrics["refused"][0]


def test_training_faster_than_its_input_alone_is_a_defect_not_a_limit() -> None:
    config = LoaderConfig(batch_size=32)
    candidate = Candidate("tuned", config, tuple(_run(config, s) for s in (4599, 4600)))
    limit = _limit(candidate, InputRate(4203.0, 370.0))["limit"]
    assert limit["bound"] == "defect" and "input pipeline alone" in limit["defect"]
    assert "input-bound" not in (limit_line(limit) or "")
    assert limit_line(limit).startswith("defect: training measured 4600")


@pytest.mark.parametrize(
    ("alone", "bound", "headroom"), [(330.0, "input", 0.1), (600.0, "model", 1.0)]
)
def test_the_limit_is_the_input_when_it_alone_barely_outruns_training(
    alone: float, bound: str, headroom: float
) -> None:
    config = LoaderConfig(batch_size=32)
    candidate = Candidate("tuned", config, tuple(_run(config, s) for s in (290, 300, 310)))
    limit = _limit(candidate, InputRate(alone, 180.0))["limit"]
    assert limit["bound"] == bound and limit["headroom"] == pytest.approx(headroom)
    assert (limit["trained_samples_per_s"], limit["per_core_samples_per_s"]) == (300, 180.0)
    assert _limit(candidate, None) == {}

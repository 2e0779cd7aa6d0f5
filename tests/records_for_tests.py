"""Trial records for the tests: a record's own fields and its figures in one call."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from raytune_loader.measuring.outcomes import SegmentMetrics
from raytune_loader.measuring.records import TrialRecord

_FIGURES = {f.name for f in fields(SegmentMetrics)}
_BASE = {"samples_per_s": 0.0, "data_wait_frac": 0.0, "util": 0.0, "util_source": "step-timing",
         "device_util": None, "samples": 0, "wall_s": 1.0}  # fmt: skip


def record(trial_id: str, status: str, *args: Any, **values: Any) -> TrialRecord:
    """A TrialRecord; the keywords that are SegmentMetrics fields become its metrics
    (none given: no metrics)."""
    figures = {k: values.pop(k) for k in list(values) if k in _FIGURES}
    metrics = SegmentMetrics(**{**_BASE, **figures}) if figures else None
    return TrialRecord(trial_id, status, *args, metrics=metrics, **values)

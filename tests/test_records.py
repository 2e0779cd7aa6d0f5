"""Trial records: one status derivation, one typed record from Tune's dicts, one CSV schema."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.outcomes import SegmentMetrics, TrialOutcome
from raytune_loader.measuring.records import (
    TRIAL_COLUMNS,
    NodeFacts,
    TrialRecord,
    best_node,
    by_hardware_class,
    record_from_report,
    trial_status,
    write_trials_csv,
)
from raytune_loader.tuning.space import SearchSpace
from records_for_tests import record

SPACE = SearchSpace(max_workers=2, batch_sizes=(16,), cuda=False, usable_cpus=2)
SPACE_FIXED = (SPACE.constants(), SPACE.baselines())  # what the tuner hands a record


@pytest.mark.parametrize(
    ("metrics", "errored", "status"),
    [
        ({"final": True}, False, "ok"),
        ({"final": True, "failure": "shm"}, False, "failed"),
        ({"final": False, "done": True}, False, "stopped_early"),
        ({"final": False}, False, "interrupted"),
        ({}, False, "interrupted"),
        ({"final": True}, True, "error"),
    ],
)
def test_status_from_the_last_report(metrics: dict, errored: bool, status: str) -> None:
    assert trial_status(metrics, errored) == status


def _report(config: LoaderConfig, speed: float = 300.0) -> dict:
    metrics = SegmentMetrics(speed, 0.2, 0.6, "step-timing", None, 960, 3.2)
    outcome = TrialOutcome(config, 3.0, 1 << 20, metrics, effective_batch_size=16)
    node = {"node_id": "n1", "hostname": "h", "hardware_class": "cpu2", "node_cpus": 2.0}
    return {**outcome.as_report(), **node, "trial_id": "abc", "timestamp": 17.0, "done": True}


def test_a_record_from_tune_dicts_is_typed_and_names_its_baseline() -> None:
    heuristic = SPACE.baselines()["heuristic"]
    tune_config = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": True}
    record = record_from_report("fallback", tune_config, _report(heuristic), None, *SPACE_FIXED)
    assert record.config == heuristic and record.baseline == "heuristic"
    assert (record.trial_id, record.status, record.reason) == ("abc", "ok", "")
    assert (record.samples_per_s, record.cpus_reserved, record.finished_at) == (300.0, 3.0, 17.0)
    assert record.node == NodeFacts(node_id="n1", hostname="h", hardware_class="cpu2",
                                    node_cpus=2.0)  # fmt: skip
    assert record.objective("util") == 0.6


def test_an_error_and_an_interrupted_trial_keep_their_reasons() -> None:
    errored = record_from_report("t1", {"num_workers": 0}, {}, "ValueError: boom", *SPACE_FIXED)
    assert (errored.status, errored.reason) == ("error", "ValueError: boom")
    unsaved = record_from_report("t2", {}, {}, None, *SPACE_FIXED)  # before Tune saved its config
    assert unsaved.status == "interrupted" and "--resume" in unsaved.reason
    assert unsaved.config == LoaderConfig(16)  # the batch size the space fixes


def test_the_csv_has_the_schema_and_one_row_per_record(tmp_path: Path) -> None:
    config = LoaderConfig(16, 1, 4, False, True)
    records = [
        record_from_report("a", config.kwargs(), _report(config), None, *SPACE_FIXED),
        record("b", "interrupted", "the search was interrupted"),
    ]
    write_trials_csv(tmp_path / "trials.csv", records)
    with open(tmp_path / "trials.csv") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    assert reader.fieldnames == TRIAL_COLUMNS
    assert rows[0]["prefetch_factor"] == "4" and rows[0]["node_id"] == "n1"
    assert rows[1]["num_workers"] == "" and rows[1]["samples_per_s"] == ""


def test_rebased_on_the_final_ceiling() -> None:
    found = record("a", "ok", samples_per_s=300.0, util=0.9, util_source="step-timing")
    rebased = found.rebased(400.0)
    assert (rebased.metrics.util, rebased.efficiency, rebased.ceiling_samples_per_s) == (
        0.75,
        0.75,
        400,
    )
    gpu = record("b", "ok", samples_per_s=300.0, util=0.5, util_source="nvml-process")
    assert gpu.rebased(400.0).metrics.util == 0.5  # NVML's reading is not a share of it
    assert record("c", "failed").rebased(400.0).efficiency is None


def test_trials_without_a_node_join_the_largest_class() -> None:
    def on(hw_class: str | None, node: str | None = None, util: float = 0.5) -> TrialRecord:
        facts = NodeFacts(node_id=node, hardware_class=hw_class)
        return record(hw_class or "-", "ok", util=util, node=facts)

    groups = by_hardware_class([on("a"), on("b", "n1", 0.4), on("b", "n2", 0.7), on(None)])
    assert list(groups) == ["b", "a"] and len(groups["b"]) == 3
    assert best_node(groups["b"], "util") == "n2"

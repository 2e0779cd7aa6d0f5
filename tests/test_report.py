"""Tests for raytune_loader.outputs.report on a tiny hand-written result folder.

The fixture is six trials (four finished, one stopped early, one failed) and a
best_config.json whose numbers make the speedups easy to check by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from raytune_loader.outputs import console, plots, report
from records_for_tests import record

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
COLUMNS = [
    "trial_id", "status", "reason", "baseline", "num_workers", "prefetch_factor", "pin_memory",
    "persistent_workers", "batch_size", "samples_per_s", "data_wait_frac", "util",
    "ceiling_samples_per_s", "efficiency", "finished_at", "hostname",
]  # fmt: skip
# Rows are written out of completion order; finished_at puts them back.
TRIALS = [
    ["t2", "ok", "", "heuristic", 2, 2, False, True, 32, 240.0, 0.3, 0.7, 400.0, 0.6, 102, "a"],
    ["t1", "ok", "", "pytorch-default", 0, None, False, False, 32, 200.0, 0.6, 0.4, 400.0, 0.5,
     101, "a"],
    ["t3", "ok", "", "", 4, 4, True, False, 32, 300.0, 0.1, 0.9, 400.0, 0.75, 103, "a"],
    ["t4", "stopped_early", "ASHA", "", 1, 1, False, False, 32, 150.0, 0.7, 0.3, None, None, 104,
     "a"],
    ["t5", "failed", "worker killed | out of memory", "", 8, 8, True, True, 256, 0.0, None, 0.0,
     None, None, 105, "a"],
    ["t6", "ok", "", "", 2, 8, True, False, 32, 290.0, 0.15, 0.85, 400.0, 0.72, 106, "a"],
]  # fmt: skip


def _loader(workers: int, prefetch: int | None, pin: bool, persistent: bool) -> dict[str, Any]:
    return {
        "batch_size": 32, "num_workers": workers, "prefetch_factor": prefetch,
        "pin_memory": pin, "persistent_workers": persistent,
    }  # fmt: skip


def _metrics(speed: float, util: float, efficiency: float | None) -> dict[str, Any]:
    def spread(value: float) -> dict[str, Any]:
        return {"median": value, "min": value * 0.9, "max": value * 1.1, "values": [value]}

    return {
        "samples_per_s": spread(speed), "util": spread(util), "data_wait_frac": spread(1 - util),
        "ceiling_samples_per_s": 400.0 if efficiency else None,
        "efficiency": spread(efficiency) if efficiency else None,
    }  # fmt: skip


def _best() -> dict[str, Any]:
    tuned = _loader(4, 4, True, False)
    return {
        "schema_version": 1, "dataset": "tiny", "model": "mlp", "objective": "util",
        "loader": tuned, "metrics": _metrics(300.0, 0.9, 0.75),
        "baselines": {
            "pytorch-default": {"loader": _loader(0, None, False, False),
                                "metrics": _metrics(200.0, 0.4, 0.5)},
            "heuristic": {"loader": _loader(2, 2, False, True),
                          "metrics": _metrics(240.0, 0.7, 0.6)},
        },
        "speedup": {"vs_pytorch_default": 1.5, "vs_heuristic": 1.25},
        "selection": {
            "chosen": "top-1", "rule": "cheapest within noise of the best",
            "decided_by_cost": False, "best_by_objective": "top-1",
            "runners_up": [{"name": "top-2", "loader": _loader(2, 8, True, False),
                            "objective": {"median": 0.85, "min": 0.84, "max": 0.86}}],
        },
        "hardware": {"cpu_model": "Test CPU", "usable_cpus": 8, "gpu_name": None, "gpu_count": 0},
        "search": {"trials": 6, "ok": 4, "stopped_early": 1, "errored": 1, "wall_time_s": 60.0},
        "created": "2025-01-01T00:00:00+00:00",
    }  # fmt: skip


def _write(folder: Path, best: dict[str, Any], rows: list[list[Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "best_config.json").write_text(json.dumps(best))
    pd.DataFrame(rows, columns=COLUMNS).to_csv(folder / "trials.csv", index=False)
    return folder


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return _write(tmp_path / "results" / "tiny", _best(), TRIALS)


def _with_status(status: dict[str, str]) -> list[list[Any]]:
    return [[row[0], status.get(row[0], row[1]), *row[2:]] for row in TRIALS]


def test_rebuild_is_byte_identical_with_valid_pngs(results: Path) -> None:
    path = report.write_report(results)
    first = path.read_bytes()
    first_plots = {p.name: p.read_bytes() for p in (results / "plots").iterdir()}
    report.write_report(results)

    assert path.read_bytes() == first
    assert set(first_plots) == set(plots.PLOTS)  # no temporary files left behind either
    assert {p.name for p in (results / "plots").iterdir()} == set(first_plots)
    for name, data in first_plots.items():
        assert data.startswith(PNG_MAGIC) and len(data) > 1000, name
        assert f"](plots/{name})" in first.decode()


def test_summary_rows_compare_tuned_with_both_baselines() -> None:
    best = _best()
    best["metrics"]["samples_per_s"]["values"] = [270.0, 300.0, 330.0]  # three runs
    rows = console.summary_rows(best)

    assert [r["config"] for r in rows] == ["tuned", "pytorch-default", "heuristic"]
    assert [r["tuned_speedup"] for r in rows] == pytest.approx([1.0, 1.5, 1.25])
    assert rows[1]["prefetch_factor"] is None and rows[0]["samples_per_s_range"] == "270-330"
    assert rows[1]["samples_per_s_range"] == "1 run"  # one value: no range to give


def test_report_shows_speedups_selection_and_efficiency(results: Path) -> None:
    text = report.write_report(results).read_text()

    row = "| pytorch-default | 32 | 0 | - | no | no | yes | - | float32 | pil | process | map |"
    assert row in text  # every field of the configuration, the pipeline's included
    assert "| heuristic |" in text and "1.25x |" in text
    assert "cheapest within noise of the best" in text and "- top-2:" in text
    assert "reaches 75% of the speed of a perfect loader (ceiling 400 samples/s" in text
    assert "4 finished, 1 stopped early, 1 failed" in text


def test_efficiency_unknown_without_a_ceiling(tmp_path: Path) -> None:
    best = _best()
    best["metrics"].update(efficiency=None, ceiling_samples_per_s=None)
    text = report.write_report(_write(tmp_path / "r", best, TRIALS)).read_text()

    assert "efficiency is unknown" in text


@pytest.mark.parametrize("status", ["failed", "error"])
def test_failed_trials_are_left_out_of_the_plots(results: Path, status: str) -> None:
    _write(results, _best(), _with_status({"t5": status}))
    points = plots.plot_points(report.load_trials(results / "trials.csv"))

    assert set(points["trial_id"]) == {"t1", "t2", "t3", "t4", "t6"}
    assert points.set_index("trial_id")["hollow"].to_dict() == {
        "t1": False, "t2": False, "t3": False, "t4": True, "t6": False,
    }  # fmt: skip


def test_the_report_says_when_the_machine_s_hypervisor_took_its_cpus(tmp_path: Path) -> None:
    best = _best()
    best["metrics"]["steady_rule"] = "halves within 20%"
    best["hardware"]["cpu_steal_frac"] = 0.18
    text = report.write_report(_write(tmp_path / "r", best, TRIALS)).read_text()
    measured = text.split("## How it was measured")[1].split("\n## ")[0]
    assert "- Noisy machine: its hypervisor gave 18% of this machine's CPU time" in measured
    best["hardware"]["cpu_steal_frac"] = 0.01
    text = report.write_report(_write(tmp_path / "q", best, TRIALS)).read_text()
    assert "Noisy machine" not in text


def test_the_worker_axis_says_what_num_workers_counted(results: Path) -> None:
    """Processes, threads, or either: the x label follows the plotted trials' kinds."""
    points = plots.plot_points(report.load_trials(results / "trials.csv"))
    assert plots.workers_word(points) == "loader processes"  # no column: before threads
    points["workers"] = "thread"
    assert plots.workers_word(points) == "loader threads"
    points.loc[points.index[0], "workers"] = "process"
    assert plots.workers_word(points) == "loader processes or threads"


def test_what_if_says_which_ceiling_its_estimates_start_from_and_what_was_measured(
    tmp_path: Path,
) -> None:
    """The estimates use the ceiling measured before the search; where verification
    measured it higher, both are said, and this node's row gives the measured rate."""
    best = _best()
    best["search"] = {**best["search"], "method": "model", "model": {"profile": {}}}
    best["what_if"] = {"note": "estimates", "ceiling_samples_per_s": 360.0, "nodes": [
        {"cores": 8, "workers_per_rank": 4, "samples_per_s": 270.0, "bound": "cores",
         "measured_samples_per_s": 300.0},
        {"cores": 16, "workers_per_rank": 16, "samples_per_s": 350.0,
         "bound": "step"}]}  # fmt: skip
    text = report.write_report(_write(tmp_path / "r", best, TRIALS)).read_text()
    assert (
        "they start from the ceiling measured before the search, 360 samples/s; "
        "verification measured it at 400, the ceiling of every figure above"
    ) in text
    assert "| 8 | 4 | 270 (measured 300) | cores |" in text and "| 16 | 16 | 350 | step |" in text
    best["what_if"]["ceiling_samples_per_s"] = 400.0
    text = report.write_report(_write(tmp_path / "s", best, TRIALS)).read_text()
    assert "search, 400 samples/s):" in text and "verification measured it" not in text


def test_trials_follow_completion_order_and_hide_a_single_host(results: Path) -> None:
    trials = report.load_trials(results / "trials.csv")
    text = report.write_report(results).read_text()

    assert list(trials["trial_id"]) == ["t1", "t2", "t3", "t4", "t5", "t6"]
    assert text.index("| 1 | t1 | ok |") < text.index("| 2 | t2 | ok |")
    assert "worker killed \\| out of memory" in text  # a pipe in a reason cannot break the table
    assert "host" not in text.split("## All trials")[1].splitlines()[2]


def test_importance_ranks_only_parameters_that_vary(results: Path) -> None:
    trials = report.load_trials(results / "trials.csv")
    found = report.param_importances(trials, "util")

    # batch_size differs only in the failed trial, so among finished trials it is fixed.
    assert found is not None
    assert set(found) == {"num_workers", "prefetch_factor", "pin_memory", "persistent_workers"}
    assert sum(found.values()) == pytest.approx(1.0)
    table = report.write_report(results).read_text().split("## Which parameters mattered")[1]
    assert "| batch_size |" not in table.split("## All trials")[0]


def test_importance_needs_two_finished_trials(tmp_path: Path) -> None:
    rows = _with_status({"t1": "failed", "t2": "failed", "t6": "stopped_early"})
    folder = _write(tmp_path / "r", _best(), rows)

    assert report.param_importances(report.load_trials(folder / "trials.csv"), "util") is None
    assert "Not enough finished trials" in report.write_report(folder).read_text()


def test_main_exit_status(results: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()

    assert report.main([str(empty)]) == 2
    assert "run the search first" in capsys.readouterr().err
    assert report.main([str(results)]) == 0
    assert capsys.readouterr().out.strip() == str(results / "report.md")


def test_the_results_root_is_told_apart_and_its_dataset_folders_named(
    results: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``report results/`` (the --out root): one line naming the dataset folders under it,
    each of which the report then takes."""
    import shutil

    root = tmp_path / "out"
    for name in ("cifar10", "imagefolder"):
        shutil.copytree(results, root / name)
    (root / "half-run").mkdir()  # a search that ended before it wrote anything

    assert report.main([str(root)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {root} holds the results of each dataset; pass one of those "
                   f"folders: {root / 'cifar10'}, {root / 'imagefolder'}\n")  # fmt: skip
    assert report.main([str(root / "cifar10")]) == 0


def test_a_folder_this_tool_did_not_write_is_one_line_and_exit_2(
    results: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A file for the folder, a best_config.json that is not JSON or not this tool's, a
    trials.csv that is not text or lacks the columns: each one line that says what to
    pass, exit status 2, no traceback."""
    import shutil

    assert report.main([str(results / "best_config.json")]) == 2
    said = capsys.readouterr().err
    file = results / "best_config.json"
    assert said == f"error: {file} is a file; pass the results folder that holds it ({results})\n"
    bad = {
        ("best_config.json", b"{oops"): "is not valid JSON",
        ("best_config.json", b'{"name": "another tool"}'): "it is not a raytune_loader result",
        ("trials.csv", b"garbage\x00\xff\n1,2\n"): "cannot be read (UnicodeDecodeError",
        ("trials.csv", b"a,b\n1,2\n"): "lacks trial_id, status, pin_memory",
    }
    for i, ((name, content), why) in enumerate(bad.items()):
        folder = tmp_path / f"bad{i}"
        shutil.copytree(results, folder)
        (folder / name).write_bytes(content)
        assert report.main([str(folder)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"error: {folder / name}") and why in err, err
        assert err.count("\n") == 1 and "Traceback" not in err


def test_an_interrupted_search_s_trials_never_break_the_report(tmp_path: Path) -> None:
    """Trials an interrupt ended before their first report have no metrics (and maybe no
    configuration): they are listed, never plotted, and the report is whole."""
    from raytune_loader.candidates.config import LoaderConfig
    from raytune_loader.measuring.records import write_trials_csv

    folder = tmp_path / "interrupted"
    folder.mkdir()
    best = _best()
    best["metrics"].update(efficiency=None, ceiling_note="the ceiling measured too low")
    (folder / "best_config.json").write_text(json.dumps(best))
    config = LoaderConfig(32, 2, 2, False, True)
    write_trials_csv(folder / "trials.csv", [
        record("t1", "ok", config=config, samples_per_s=240.0, util=0.7, finished_at=1.0),
        record("t2", "interrupted", "the search was interrupted", config=config),
        record("t3", "interrupted", "the search was interrupted"),
    ])  # fmt: skip
    text = report.write_report(folder).read_text()

    assert set(plots.plot_points(report.load_trials(folder / "trials.csv"))["trial_id"]) == {"t1"}
    assert text.count("| interrupted |") == 2
    assert "the ceiling measured too low" in text
    assert {p.name for p in (folder / "plots").iterdir()} == set(plots.PLOTS)


def test_a_ray_data_winner_s_report_shows_its_pipeline_its_baseline_and_bigger_pools(
    tmp_path: Path,
) -> None:
    """The tuned row is the Ray Data pipeline (its knobs' columns appear only then), Ray's
    documented one is a row of its own, the runner-up DataLoader is listed by its
    settings, and the what-if grows the pool of actors."""
    from raytune_loader import raydata

    tuned = raydata.RayDataConfig(32, 2, 2, map_batch_size=32, crosses="uint8").values()
    docs = raydata.ray_docs_default(32, max_actors=2).values()
    best = {
        **_best(),
        "engine": "raydata",
        "raydata": {
            "chosen": True,
            "name": "top-1",
            "config": tuned,
            "metrics": _metrics(300.0, 0.9, 0.75),
        },
        "what_if": {
            "note": "estimates",
            "ceiling_samples_per_s": 400.0,
            "nodes": [
                {"actors": 2, "remote_cpus": 2.0, "samples_per_s": 300.0, "bound": "actors"},
                {"actors": 4, "remote_cpus": 4.0, "samples_per_s": 390.0, "bound": "step"},
            ],
        },
    }
    best["baselines"]["ray-docs-default"] = {"raydata": docs, "metrics": _metrics(150, 0.4, 0.4)}
    best["search"] = {**best["search"], "method": "model", "model": {"profile": {}}}  # fmt: skip
    rows = console.summary_rows(best)
    assert [(r["config"], r["engine"]) for r in rows] == [
        ("tuned", "raydata"), ("pytorch-default", "dataloader"), ("heuristic", "dataloader"),
        ("ray-docs-default", "raydata")]  # fmt: skip
    assert rows[0]["max_actors"] == 2 and rows[3]["min_actors"] == 1
    text = report.write_report(_write(tmp_path / "r", best, TRIALS)).read_text()
    assert "| actors |" in text and "| ray-docs-default |" in text
    assert "What if the pool of actors were bigger" in text and "| 4 | 4 | 390 | step |" in text
    plain = report.write_report(_write(tmp_path / "p", _best(), TRIALS)).read_text()
    assert "| actors |" not in plain  # a DataLoader search's tables as they were


@pytest.mark.parametrize(
    "calibration",
    [{"cores": 0.85, "workers": 1.0}, {"cores": 1.0}, None, 0.85],
    ids=["biased", "unbiased", "before-it", "one-factor"],
)
def test_the_report_says_how_the_model_was_calibrated(tmp_path: Path, calibration) -> None:
    """A model search's report gives the model's error and, where the trials measured
    other than the profile predicted, each part's factor and the profile's own error; a
    folder from before the calibration (no key) reads as before."""
    best = _best()
    best["search"].update(method="model", model={
        "model_median_error": 0.04, "predictions": 5, "skipped": 2, "margin": 0.05,
        "skip_rule": "below its best", "profile": {"seconds": 12.0},
        **({} if calibration is None else {"calibration": calibration,
                                           "uncalibrated_median_error": 0.15}),
    })  # fmt: skip
    text = report.write_report(_write(tmp_path / "results" / "tiny", best, TRIALS)).read_text()
    assert "median error over 5 finished trials: 4% (" in text
    biased = isinstance(calibration, dict) and calibration["cores"] == 0.85
    assert ("the profile's: cores 0.85, workers 1.00; the profile's alone 15%" in text) == biased
    assert ("the predictions scaled by 0.85" in text) == (calibration == 0.85)

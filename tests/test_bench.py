"""The bench re-measures the tuned config and both baselines from a best_config.json."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import REPO, TESTS
from raytune_loader import LoaderConfig, load_best_config
from raytune_loader.bench import main, plan_from_config
from raytune_loader.measuring.job import SegmentSpec
from raytune_loader.sources.datasets import DatasetSpec

TINY_SEGMENT = {"warmup_steps": 1, "steps": 4, "report_every": 2, "compute_threads": 1}
NAMES = ("tuned", "pytorch-default", "heuristic")


def _metrics(speed: float) -> dict[str, Any]:
    stats = {"median": speed, "min": speed, "max": speed, "values": [speed]}
    return {"samples_per_s": stats, "util": None, "data_wait_frac": None}


def best_config(data_root: Path, model: str = "small-cnn") -> dict[str, Any]:
    """A small valid best_config.json, tuned on a machine unlike this one."""
    heuristic = {"batch_size": 8, "num_workers": 1, "prefetch_factor": 2,
                 "pin_memory": False, "persistent_workers": True}  # fmt: skip
    return {
        "schema_version": 1,
        "dataset": "synthetic-imagenet",
        "model": model,
        "objective": "util",
        "loader": {**heuristic, "prefetch_factor": 4, "persistent_workers": False},
        "metrics": _metrics(300.0),
        "baselines": {
            "pytorch-default": {"loader": {"batch_size": 8, "num_workers": 0}, "metrics": {}},
            "heuristic": {"loader": heuristic, "metrics": {}},
        },
        "speedup": {"vs_pytorch_default": 1.5, "vs_heuristic": 1.0},
        "hardware": {"cpu_model": "Imaginary CPU 9000", "usable_cpus": 64, "gpu_count": 0},
        "search": {
            "dataset_spec": {
                "name": "synthetic-imagenet",
                "data_root": str(data_root),
                "download": False,
                "synthetic_images": 96,
            },  # fmt: skip
            "segment": TINY_SEGMENT,
            "samples_per_trial": 64,
            "seed": 0,
            "device": "cpu",
        },
        "created": "2025-01-01T00:00:00+00:00",
    }


def run_bench(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}"}
    return subprocess.run(
        [sys.executable, "-m", "raytune_loader.bench", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


def write_config(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "best_config.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.slow  # three real measurements, end to end: the fast tier keeps the bench's others
def test_bench_measures_tuned_and_both_baselines(tiny_imagenet: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, best_config(tiny_imagenet))
    out_json = tmp_path / "bench.json"
    result = run_bench("--config", str(config), "--repeats", "2", "--json", str(out_json),
                       cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "note: tuned on another machine: cpu_model: tuned on 'Imaginary CPU 9000'" in out
    progress = re.findall(r"^\[(\d+)/6\] (\S+) run (\d):", out, re.M)
    assert [int(done) for done, _, _ in progress] == list(range(1, 7))
    first_round = [name for _, name, run in progress if run == "1"]
    second_round = [name for _, name, run in progress if run == "2"]
    assert first_round == list(NAMES) and second_round == [*NAMES[1:], NAMES[0]]  # rotated

    table = out[out.index("\nconfig ") :].splitlines()
    rows = {line.split()[0]: line.split() for line in table[2:5]}
    assert set(rows) == set(NAMES)
    # config workers prefetch pin persist batch samples/s range util wait eff tuned-x
    assert rows["tuned"][1:6] == ["1", "4", "n", "n", "8"]
    assert rows["pytorch-default"][1:6] == ["0", "-", "n", "n", "8"]
    assert rows["heuristic"][1:6] == ["1", "2", "n", "y", "8"]
    for name in NAMES:
        assert float(rows[name][6]) > 0 and re.fullmatch(r"\d+-\d+", rows[name][7])
        assert 0 <= float(rows[name][8]) <= 1 and float(rows[name][10]) > 0  # util, efficiency
    assert rows["tuned"][-1] == "1.00" and float(rows["heuristic"][-1]) > 0

    figures = json.loads(out_json.read_text())
    sections = {"tuned": figures, **figures["baselines"]}
    assert set(sections) == set(NAMES)
    for section in sections.values():
        speeds = section["metrics"]["samples_per_s"]["values"]
        assert len(speeds) == 2 and all(v > 0 for v in speeds)
    assert figures["loader"]["prefetch_factor"] == 4
    assert figures["speedup"]["vs_pytorch_default"] > 0


def test_bad_config_path_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # in this process: the command line's exit status is main's (the bench above)
    assert main(["--config", str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {tmp_path / 'missing.json'} does not exist; run the search first"
    )


def _old_search(tmp: Path, data: dict[str, Any]) -> Path:
    return write_config(tmp, {**data, "search": {"seed": 0}})


def _unknown_model(tmp: Path, data: dict[str, Any]) -> Path:
    return write_config(tmp, {**data, "model": "resnet9000"})


def _bad_segment(tmp: Path, data: dict[str, Any]) -> Path:
    data["search"]["segment"] = {**TINY_SEGMENT, "stepz": 3}
    return write_config(tmp, data)


def _bad_baseline(tmp: Path, data: dict[str, Any]) -> Path:
    data["baselines"]["heuristic"]["loader"] = {"batch_size": 8, "num_workers": -1}
    return write_config(tmp, data)


def _bad_device(tmp: Path, data: dict[str, Any]) -> Path:
    data["search"]["device"] = "tpu"
    return write_config(tmp, data)


def _missing_data(tmp: Path, data: dict[str, Any]) -> Path:
    data["search"]["dataset_spec"].update(name="imagenet")
    return write_config(tmp, data)


BAD = [
    (lambda tmp, data: write_config(tmp, {"schema_version": 1}), "it is not a raytune_loader"),
    (lambda tmp, data: (tmp / "bad.json", (tmp / "bad.json").write_text("{"))[0], "valid JSON"),
    (_old_search, "the search section lacks dataset_spec, segment"),
    (_unknown_model, "unknown model 'resnet9000'"),
    (_bad_segment, "invalid search section"),
    (_bad_baseline, "invalid baselines.heuristic.loader"),
    (_bad_device, "search.device must be cpu or cuda, not 'tpu'"),
    (_missing_data, "imagenet: folder"),
]


@pytest.mark.parametrize(
    ("make", "message"),
    BAD,
    ids=["not result", "not JSON", "old file", "model", "segment", "baseline", "device", "no data"],
)
def test_bad_input_is_one_line_and_exit_2(
    make: Any, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make(tmp_path, best_config(tmp_path / "nowhere"))
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and message in err


def test_a_data_root_left_with_one_slash_names_the_url_it_meant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, best_config(tmp_path / "nowhere"))
    assert main(["--config", str(path), "--data-root", "s3:/bucket/imagenet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: --data-root s3:/bucket/imagenet is no folder here: for a bucket, "
                   "write s3://bucket/imagenet (two slashes after the scheme)")  # fmt: skip


def test_the_job_is_rebuilt_from_the_file_with_the_overrides(tmp_path: Path) -> None:
    data = best_config(tmp_path / "there")
    data["search"]["device"] = "cuda"
    plan = plan_from_config(load_best_config(write_config(tmp_path, data)), 9, str(tmp_path))
    job = plan.job
    assert job.dataset == DatasetSpec("synthetic-imagenet", str(tmp_path), False, 96)
    assert job.segment == SegmentSpec(warmup_steps=1, steps=9, report_every=2, compute_threads=1)
    assert (job.model, job.samples_per_trial, job.seed) == ("small-cnn", 64, 0)
    assert list(plan.configs) == ["tuned", "pytorch-default", "heuristic"]
    assert plan.configs["heuristic"] == LoaderConfig(8, 1, 2, False, True)
    if not torch.cuda.is_available():
        assert job.device == "cpu" and "measuring on the CPU" in plan.notes[0]


def test_the_bench_replays_the_job_s_precision_and_memory_format(
    tiny_imagenet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = best_config(tiny_imagenet, model="datasets_for_tests:recording_model")
    data["job"] = {"model": data["model"], "train_step": None, "precision": "bf16",
                   "channels_last": True, "compile": False}  # fmt: skip
    monkeypatch.setenv("RECORD_TO", str(tmp_path / "record"))
    assert main(["--config", str(write_config(tmp_path, data)), "--repeats", "1"]) == 0
    steps = [s for s in (tmp_path / "record").read_text().splitlines() if s.startswith("batch")]
    assert steps and all(s.endswith(" torch.bfloat16 (True, True)") for s in steps)


def test_a_file_without_a_job_section_is_replayed_in_pytorch_s_default_precision(
    tmp_path: Path,
) -> None:
    plan = plan_from_config(load_best_config(write_config(tmp_path, best_config(tmp_path))))
    assert (plan.job.precision, plan.job.channels_last) == (None, False)  # flags untouched


def test_tuned_only_measures_the_tuned_configuration_and_the_ceiling(
    tiny_imagenet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a device's minutes afford: the winner re-measured standalone, no baselines."""
    config = write_config(tmp_path, best_config(tiny_imagenet))
    out_json = tmp_path / "bench.json"
    args = ["--config", str(config), "--repeats", "1", "--steps", "4", "--tuned-only"]
    assert main([*args, "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"^\[(\d+)/(\d+)\] (\S+) run", out, re.M) == [("1", "1", "tuned")]
    figures = json.loads(out_json.read_text())
    assert figures["baselines"] == {} and figures["metrics"]["samples_per_s"]["median"] > 0
    assert figures["metrics"]["ceiling_samples_per_s"] > 0

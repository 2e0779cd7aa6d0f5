"""The search picks what an expert would: no workers for free samples, workers for costly ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ray_processes, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # real searches, timed: pytest -m slow

COMMON = (
    "--num-samples", "4", "--batch-size", "16", "--steps", "12", "--warmup-steps", "2",
    "--report-every", "6", "--samples-per-trial", "256", "--verify-top", "1",
    "--verify-repeats", "3", "--max-workers", "2",
)  # fmt: skip


def _search(dataset: str, out: Path, *extra: str) -> dict:
    result = run_cli("--dataset", dataset, *COMMON, *extra, "--out", str(out), cwd=out.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / dataset.replace(":", "-") / "best_config.json").read_text())


def test_nearly_free_samples_need_no_workers(tmp_path: Path) -> None:
    before = ray_processes()
    # A model whose step dwarfs a sample's loading (small-cnn's 2.5 ms steps left the
    # in-process loader 8% of the time, which one worker could win back: CI once picked it).
    model = ("--model", "datasets_for_tests:dense_cnn")
    # Workers only add IPC for samples that cost nothing: the cheapest config within
    # noise of the best is the one without workers. This 2-vCPU machine now and then
    # holds a state for a whole search in which one process alone computes ~15% slower
    # than beside worker processes (2 searches in 20 here: the in-process loader at 0.87
    # of the ceiling, two workers at 1.0 in every round); the selection then follows what
    # it measured. Such a state twice in a row is rare: one of two searches must agree.
    picks = []
    for attempt in range(2):
        best = _search("datasets_for_tests:fast", tmp_path / f"results-{attempt}", *model)
        picks.append((best["loader"]["num_workers"], best["cost"]["cpus_reserved"]))
        if picks[-1][0] == 0:
            break
    assert picks[-1] == (0, 1), picks
    assert ray_processes() <= before


def test_costly_samples_get_workers_that_clearly_beat_the_default(tmp_path: Path) -> None:
    best = _search("datasets_for_tests:slow", tmp_path / "results")
    assert best["loader"]["num_workers"] >= 1
    assert best["speedup"]["vs_pytorch_default"] > 1.5
    default = best["baselines"]["pytorch-default"]["metrics"]["samples_per_s"]
    assert best["metrics"]["samples_per_s"]["min"] > default["max"]  # beyond the noise

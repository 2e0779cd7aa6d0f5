"""Tuned for the Hugging Face Trainer: ``--trainer hf`` searches only what its
TrainingArguments can set, ``training_arguments()`` gives them (and refuses what they
cannot), and the report says, from the profile, what the rest would have gained. The
real Trainer trains on them in tests/test_trainers.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import ConfigError
from raytune_loader.measuring.profile import Profile
from raytune_loader.outputs.trainers import hf_arguments, hf_section
from raytune_loader.tuning.costmodel import CostModel
from raytune_loader.tuning.space import SearchSpace

SPACE = SearchSpace(4, (16,), False, 4, pipeline=True, decodes=("pil", "tensor"),
                    thread_workers=True)  # fmt: skip


def test_the_trainer_s_space_holds_only_what_its_arguments_set() -> None:
    hf = replace(SPACE, trainer="hf")
    grid = hf.grid()
    assert {c.workers for c in grid} == {"process"} and {c.engine for c in grid} == {"dataloader"}
    assert {c.worker_threads for c in grid} == {None} and {c.in_order for c in grid} == {True}
    assert {c.multiprocessing_context for c in grid} == {None}
    assert {c.decode for c in grid} == {"pil", "tensor"}  # the dataset's, which the user builds
    assert {c.num_workers for c in grid} == set(range(5))
    for config in grid:  # every candidate is one the Trainer can build
        hf_arguments(config)
    full = hf.unrestricted()  # what the profile measures: the left-out structures too
    assert {c.workers for c in full.grid()} == {"process", "thread"}
    assert set(hf.structures()) < set(full.structures())
    with pytest.raises(ConfigError, match="--trainer must be one of hf"):
        replace(SPACE, trainer="keras")


def test_training_arguments_set_the_trainer_s_loader_and_refuse_what_it_cannot_take() -> None:
    config = LoaderConfig.from_dict({"num_workers": 3, "prefetch_factor": 4, "pin_memory": True,
                                     "persistent_workers": True}, batch_size=64)  # fmt: skip
    assert hf_arguments(config) == {
        "per_device_train_batch_size": 64, "dataloader_num_workers": 3,
        "dataloader_prefetch_factor": 4, "dataloader_pin_memory": True,
        "dataloader_persistent_workers": True,
    }  # fmt: skip
    none = hf_arguments(LoaderConfig(batch_size=8))  # what DataLoader takes without workers
    assert none["dataloader_prefetch_factor"] is None
    assert none["dataloader_persistent_workers"] is False
    threads = LoaderConfig.from_dict({"num_workers": 2, "workers": "thread"}, batch_size=8)
    with pytest.raises(ConfigError, match=r"cannot take workers='thread'.*--trainer hf"):
        hf_arguments(threads)
    unordered = replace(config, in_order=False, worker_threads=1)
    with pytest.raises(ConfigError, match="worker_threads=1, in_order=False"):
        hf_arguments(unordered)


def test_training_arguments_are_what_transformers_takes(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from raytune_loader import load_best_config
    from raytune_loader.machine.hardware import cpu_and_gpu_summary

    path = tmp_path / "best_config.json"
    path.write_text(json.dumps({
        "schema_version": 1, "dataset": "imagenet", "model": "tiny", "objective": "util",
        "loader": {"batch_size": 32, "num_workers": 2, "prefetch_factor": 3, "pin_memory": False,
                   "persistent_workers": True, "in_order": True,
                   "multiprocessing_context": None},
        "pipeline": {"transfer": "float32", "decode": "tensor", "workers": "process"},
        "metrics": {}, "baselines": {}, "speedup": {}, "hardware": cpu_and_gpu_summary(),
        "search": {}, "created": "now",
    }))  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True,
        **load_best_config(path).training_arguments(),
    )  # fmt: skip
    assert (args.per_device_train_batch_size, args.dataloader_num_workers) == (32, 2)
    assert (args.dataloader_prefetch_factor, args.dataloader_persistent_workers) == (3, True)
    assert args.dataloader_pin_memory is False


def test_the_report_says_what_the_left_out_structures_would_gain() -> None:
    """A profile in which thread workers hand batches over far more cheaply than processes:
    the best configuration outside the Trainer's space uses them, and its predicted gain
    over the tuned one is the model's ratio; none where nothing outside would be faster."""
    profile = Profile(
        batch_size=16, cores=4,
        per_core={"pil/float32": 300.0, "tensor/float32": 300.0},
        collate_s={"pil/float32": 0.001, "tensor/float32": 0.001},
        receive_s={"process/float32": 0.03, "thread/float32": 0.0005},
        hand_over_s={"process/float32": 0.03, "thread/float32": 0.0005},
        finish_s={"pil/float32": 0.0, "tensor/float32": 0.0},
    )  # fmt: skip
    model = CostModel(profile, {16: 2000.0})
    hf = replace(SPACE, trainer="hf")
    tuned = max(hf.grid(), key=lambda c: model.predict(c).samples_per_s)  # type: ignore[union-attr]
    found = hf_section(tuned, hf, model)
    assert found["training_arguments"] == hf_arguments(tuned)
    assert any("thread workers" in words for words in found["left_out"])
    best = found["best_left_out"]
    assert "thread" in best["settings"] and best["predicted_gain"] > 1.2
    assert best["predicted_samples_per_s"] == pytest.approx(
        best["predicted_gain"] * model.predict(tuned).samples_per_s  # type: ignore[union-attr]
    )
    even = replace(model, profile=replace(profile, receive_s={
        "process/float32": 0.0005, "thread/float32": 0.0005}, hand_over_s={
        "process/float32": 0.0005, "thread/float32": 0.0005}))  # fmt: skip
    best_even = max(hf.grid(), key=lambda c: even.predict(c).samples_per_s)  # type: ignore[union-attr]
    assert hf_section(best_even, hf, even)["best_left_out"] is None
    assert hf_section(tuned, hf, None)["best_left_out"] is None  # no profile: no estimate


@pytest.mark.slow
def test_a_search_for_the_trainer_runs_only_what_it_can_build_and_hands_it_over(
    tiny_imagenet: Path, tmp_path: Path
) -> None:
    """``--trainer hf`` on the command line: every trial is a configuration the Trainer's
    DataLoader can take, the profile measured the left-out structures too, and
    best_config.json's ``trainer`` section (and report.md) holds the arguments that
    ``training_arguments()`` returns, which transformers takes."""
    import csv

    from conftest import TINY_SEARCH, ray_processes, run_cli
    from raytune_loader import load_best_config

    transformers = pytest.importorskip("transformers")
    before = ray_processes()
    result = run_cli(
        *TINY_SEARCH, "--data-root", str(tiny_imagenet), "--num-samples", "4",
        "--verify-repeats", "1", "--trainer", "hf", "--out", str(tmp_path / "out"),
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    folder = tmp_path / "out" / "synthetic-imagenet"
    best = json.loads((folder / "best_config.json").read_text())
    with open(folder / "trials.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and {r["workers"] for r in rows} == {"process"}
    assert {r["in_order"] for r in rows} == {"True"} and not any(r["worker_threads"] for r in rows)
    profiled = best["search"]["model"]["profile"]["receive_s"]
    assert any(kind.startswith("thread") for kind in profiled)  # measured, not offered
    section = best["trainer"]
    tuned = load_best_config(folder / "best_config.json")
    assert section["training_arguments"] == tuned.training_arguments()
    assert (
        section["training_arguments"]["per_device_train_batch_size"] == best["loader"]["batch_size"]
        and section["training_arguments"]["dataloader_num_workers"] == best["loader"]["num_workers"]
    )
    assert "Tuned for the Hugging Face Trainer" in (folder / "report.md").read_text()
    transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), report_to="none",
                                   use_cpu=True, **tuned.training_arguments())  # fmt: skip
    assert ray_processes() <= before

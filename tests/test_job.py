"""The job every measurement repeats, and the data it reads."""

from __future__ import annotations

import os
from dataclasses import Field, fields, is_dataclass
from typing import Any

import pytest

from raytune_loader.measuring.job import SegmentSpec, reserved_cpus
from raytune_loader.measuring.prepare import prepare_data
from raytune_loader.progress import LogProgress
from raytune_loader.sources.datasets import subset_indices
from raytune_loader.tuning.options import SearchOptions, job_from_options


def test_cold_slots_read_disjoint_samples_warm_ones_the_same() -> None:
    blocks = [set(subset_indices(1000, 100, seed=3, slot=k)) for k in range(10)]
    assert all(len(b) == 100 for b in blocks)
    assert len(set().union(*blocks)) == 1000  # ten trials, no sample read twice
    assert subset_indices(1000, 100, 3) == subset_indices(1000, 100, 3, 0)
    assert subset_indices(1000, 100, 3) != subset_indices(1000, 100, 4)


def test_reports_cover_a_last_partial_interval() -> None:
    assert SegmentSpec(steps=50, report_every=20).reports == 3  # at 20, 40 and the final
    assert SegmentSpec(steps=60, report_every=20).reports == 3


# TrialJob fields named otherwise in SearchOptions (and in DatasetSpec, SegmentSpec)
OPTION_OF = {"name": "dataset", "time_limit_s": "trial_timeout_s", "ranks": "ranks_per_node"}
# TrialJob fields that are not options: job_from_options' arguments, measured later, fixed
NOT_OPTIONS = {"model", "device", "node_cpus", "gpu_memory_share", "ceilings",
               "loader_timeout_s", "stream_shards", "stream_workers", "stream_note",
               "watch", "listing", "shared_cache"}  # fmt: skip  # watch: off only in the
# benchmark of its cost; listing: an object store's listing, made by data preparation;
# shared_cache: the search's folder, made as it runs


def _unlike_the_default(option: Field[Any]) -> Any:
    """A value of ``option``'s type that no default gives."""
    chosen = {"dataset": "imagefolder", "precision": "fp16", "batch_sizes": (8, 16)}
    if option.name in chosen:
        return chosen[option.name]
    kind = str(option.type)
    if kind.startswith("bool"):
        return not option.default
    if kind.startswith(("int", "float")):
        return (option.default or 0) + 7
    return f"{option.name}-value"  # str, str | None


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """The job's fields, with its dataset's and segment's fields in their place."""
    if not is_dataclass(value):
        return {prefix: value}
    out: dict[str, Any] = {}
    for f in fields(value):
        out.update(_leaves(getattr(value, f.name), f.name))
    return out


def test_the_job_takes_every_knob_from_the_options() -> None:
    """Every field of the job (its dataset and segment too) is its option's value,
    however many fields there are: a new field of TrialJob without its line in
    job_from_options fails here."""
    unlike = {f.name: _unlike_the_default(f) for f in fields(SearchOptions)}
    # the job's constructor checks the step it trains: one that imports
    opts = SearchOptions(**{**unlike, "train_step": "datasets_for_tests:make_step"})
    job = job_from_options(opts, "resnet18", device="cuda", node_cpus=16, gpu_memory_share=0.5)
    taken = {
        name: value for name, value in _leaves(job).items() if name not in NOT_OPTIONS
    }  # fmt: skip
    given = {name: getattr(opts, OPTION_OF.get(name, name)) for name in taken}
    # a local --data-root reaches the trials absolute (test_options)
    assert taken == {**given, "data_root": os.path.abspath(str(opts.data_root))}
    # what the job trains is the user's step, where there is one, not the model
    assert (job.model, job.device, job.node_cpus, job.gpu_memory_share, job.ceilings) == (
        "datasets_for_tests:make_step", "cuda", 16, 0.5, {})  # fmt: skip


def test_the_step_s_defaults_follow_the_device() -> None:
    opts = SearchOptions()
    gpu = job_from_options(opts, "resnet50", device="cuda", node_cpus=16)
    cpu = job_from_options(opts, "small-cnn", device="cpu", node_cpus=2)
    assert (gpu.precision, gpu.channels_last, cpu.precision, cpu.channels_last) == (
        "bf16", True, "fp32", False)  # fmt: skip
    asked = SearchOptions(precision="fp16", channels_last=False, compile=True)
    job = job_from_options(asked, "resnet50", device="cuda", node_cpus=16)
    assert (job.precision, job.channels_last, job.compile) == ("fp16", False, True)


def test_a_user_step_keeps_its_own_settings_unless_asked() -> None:
    """No precision and no memory format is forced on the user's own step."""
    step = "datasets_for_tests:make_step"
    own = SearchOptions(train_step=step)
    job = job_from_options(own, step, device="cuda", node_cpus=16)
    assert (job.train_step, job.precision, job.channels_last) == (step, None, False)
    asked = SearchOptions(train_step=step, precision="tf32", channels_last=True)
    job = job_from_options(asked, step, device="cuda", node_cpus=16)
    assert (job.precision, job.channels_last) == ("tf32", True)


class _Warnings(LogProgress):
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warn(self, text: str) -> None:
        self.warnings.append(text)


@pytest.mark.parametrize(("cold", "samples", "warned"), [(True, 64, True), (True, 208, False),
                                                        (False, 64, False)])  # fmt: skip
def test_cold_warns_when_a_trial_would_read_its_block_twice(
    cold: bool, samples: int, warned: bool
) -> None:
    """Batches of 16 x (1 warm-up + 12 steps) = 208 samples a trial reads."""
    progress = _Warnings()
    opts = SearchOptions(dataset="datasets_for_tests:fast", cold=cold, batch_sizes=(8, 16),
                         samples_per_trial=samples, steps=12, warmup_steps=1)  # fmt: skip
    prepare_data(job_from_options(opts, "small-cnn", device="cpu", node_cpus=2), 16, progress)
    assert bool(progress.warnings) == warned
    if warned:
        assert "raise --samples-per-trial to 208" in progress.warnings[0]


@pytest.mark.parametrize(
    ("workers", "per_worker", "node", "ranks", "expected"),
    [(0, 1.0, 2, 1, 1.0), (1, 1.0, 2, 1, 2.0), (2, 1.0, 2, 1, 2.0), (3, 0.5, 4, 1, 2.5),
     (8, 1.0, 16, 1, 9.0), (0, 0.5, 2, 2, 2.0), (1, 0.5, 4, 2, 3.0), (7, 1.0, 32, 4, 32.0)],
)  # fmt: skip
def test_reservation_is_each_rank_plus_its_workers_capped_at_the_node(
    workers: int, per_worker: float, node: float, ranks: int, expected: float
) -> None:
    assert reserved_cpus(workers, per_worker, node, ranks) == expected

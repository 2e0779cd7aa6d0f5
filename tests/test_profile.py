"""The profile phase: each structure's stages measured once, on real JPEG files."""

from __future__ import annotations

from pathlib import Path

import pytest

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.measuring.profile import Profile, profile
from raytune_loader.sources.datasets import DatasetSpec

pytestmark = pytest.mark.alone  # each stage's cost, timed


def test_every_structure_s_stages_are_measured(tiny_imagenet: Path) -> None:
    job = TrialJob(
        dataset=DatasetSpec("synthetic-imagenet", str(tiny_imagenet)), model="small-cnn",
        segment=SegmentSpec(1, 4, 2), samples_per_trial=32, node_cpus=2, ceilings={8: 500.0},
    )  # fmt: skip
    structures = [
        LoaderConfig(8, 1, 2),
        LoaderConfig(8, 1, 2, workers="thread"),
        LoaderConfig(8, 1, 2, workers="thread", decode="tensor", transfer="uint8"),
    ]
    found = profile(job, structures, cores=2)
    assert set(found.per_core) == {"pil/float32", "tensor/uint8"}
    assert set(found.receive_s) == {"process/float32", "thread/float32", "thread/uint8"}
    assert all(rate > 10 for rate in found.per_core.values())  # samples/s of one core
    # the same batches: a thread hands its over through a queue, a process through
    # pickling and shared memory, which the training process pays for
    assert found.receive_s["thread/float32"] < found.receive_s["process/float32"]
    assert set(found.hand_over_s) == set(found.receive_s)
    # and the worker side pays too: a process collates into new shared-memory pages
    assert found.hand_over_s["process/float32"] > found.collate_s["pil/float32"]
    # uint8 images are converted and normalized by the training process
    assert found.finish_s["tensor/uint8"] > found.finish_s["pil/float32"]
    assert found.batch_size == 8 and found.seconds > 0
    assert Profile.from_dict(found.as_dict()) == found  # it travels in best_config.json

"""The profile runs at the smallest batch the trials train at: its
every cost grows with the batch, and the cost model scales it to the larger ones. At
the largest batch (1024 on the H200) the profile took 82 s of the device's minutes."""

from __future__ import annotations

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.measuring.profile import profile
from raytune_loader.sources.datasets import DatasetSpec
from raytune_loader.tuning.costmodel import CostModel


def test_the_profile_measures_at_the_smallest_batch_and_the_model_scales_it() -> None:
    job = TrialJob(
        DatasetSpec("datasets_for_tests:fast"), "small-cnn", SegmentSpec(1, 4, 2),
        samples_per_trial=64, node_cpus=2, ceilings={32: 900.0, 4: 500.0, 16: 800.0},
    )  # fmt: skip
    found = profile(job, [LoaderConfig(32, 1, 2)], cores=2)
    assert found.batch_size == 4
    model = CostModel(found, job.ceilings)
    small, large = (model.predict(LoaderConfig(b, 1, 2)) for b in (4, 32))
    assert small is not None and large is not None  # both predicted from the one profile

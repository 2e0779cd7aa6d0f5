"""Streams (IterableDatasets) in the search: the shards every trial reads, the bound on
workers they set, a user's stream that does not split, what is refused up front."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import torch

from conftest import write_shards
from raytune_loader.api import search_space
from raytune_loader.datasets import DatasetSpec
from raytune_loader.errors import DatasetError
from raytune_loader.job import SegmentSpec, TrialJob, prepare_data
from raytune_loader.measure import run_trial
from raytune_loader.options import SearchOptions
from raytune_loader.progress import LogProgress
from raytune_loader.space import LoaderConfig
from raytune_loader.streams import splits_across_workers, trial_shards

SEGMENT = SegmentSpec(warmup_steps=1, steps=4, report_every=2)


def _job(name: str, root: str | None = None, **fields: object) -> TrialJob:
    values = dict(dataset=DatasetSpec(name, root), model="small-cnn", segment=SEGMENT,
                  samples_per_trial=48, node_cpus=2)  # fmt: skip
    return TrialJob(**{**values, **fields})  # type: ignore[arg-type]


def test_every_trial_reads_the_same_shards_and_cold_ones_read_others(tiny_shards: Path) -> None:
    job = prepare_data(_job("webdataset", str(tiny_shards)), 8)
    assert job.stream_shards == 2  # 48 samples, and a shard per worker of the node
    assert trial_shards(job, 0) == trial_shards(job, 5)
    cold = TrialJob(**{**vars(job), "cold": True})
    first, second = trial_shards(cold, 0), trial_shards(cold, 1)
    assert len(first) == len(second) == 2 and not set(first) & set(second)


def test_workers_per_rank_are_bounded_by_the_shards_a_rank_reads(
    tiny_imagenet: Path, tmp_path: Path
) -> None:
    write_shards(tiny_imagenet / "train", tmp_path, 3)
    job = prepare_data(_job("webdataset", str(tmp_path), node_cpus=4, ranks=2), 8)
    assert (job.stream_shards, job.stream_workers) == (3, 1)  # 3 shards, 2 ranks: 1 each
    assert "at most 1 loader workers per rank" in (job.stream_note or "")
    warned: list[str] = []
    progress = LogProgress()
    progress.warn = warned.append  # type: ignore[method-assign]
    space = search_space(SearchOptions(ranks_per_node=2), 4, False, progress, job=job)
    assert space.stream_workers == 1 and warned == [job.stream_note]
    assert {config.num_workers for config in space.grid()} == {0, 1}
    assert space.accesses == ("stream",) and space.batchings == ("loader", "workers")


@pytest.mark.parametrize(
    "config",
    [
        LoaderConfig(8, 2, 2, access="stream", batching="workers"),
        LoaderConfig(8, 2, 2, access="stream", workers="thread", decode="tensor"),
        LoaderConfig(8, 1, 2, access="stream", decode="device", transfer="uint8"),
    ],
    ids=["processes-batched-in-workers", "threads", "device-decode"],
)
def test_a_stream_trial_trains_and_times_its_first_batch(
    tiny_shards: Path, config: LoaderConfig
) -> None:
    job = prepare_data(_job("webdataset", str(tiny_shards)), 8)
    outcome = run_trial(job, config)
    assert outcome.failure is None, outcome.detail
    assert outcome.metrics.samples == 4 * 8 and outcome.metrics.first_batch_s > 0


def test_threads_and_processes_each_read_their_own_shards_of_a_stream(tiny_shards: Path) -> None:
    from raytune_loader.loader import build_dataloader
    from raytune_loader.sources.base import StreamVariant

    spec = DatasetSpec("webdataset", str(tiny_shards))
    for workers in ("process", "thread"):
        stream = spec.source.build_stream(spec, [], StreamVariant(shuffle_buffer=0))
        config = LoaderConfig(8, 2, 2, access="stream", workers=workers, in_order=False)
        labels = [int(x) for _, batch in build_dataloader(stream, config, drop_last=False)
                  for x in batch]  # fmt: skip
        assert len(labels) == 96, workers  # every sample once: no worker read another's shard


def test_a_user_stream_that_does_not_split_is_found_and_kept_to_one_worker() -> None:
    from raytune_loader.sources import source_for
    from raytune_loader.sources.base import StreamVariant

    spec = DatasetSpec("datasets_for_tests:stream_that_repeats")
    repeats = source_for(spec.name).build_stream(spec, [], StreamVariant())
    assert not splits_across_workers(repeats)
    job = prepare_data(_job(spec.name), 8)
    assert job.stream_workers == 1 and "yields the same samples in every loader worker" in (
        job.stream_note or ""
    )
    splits = DatasetSpec("datasets_for_tests:stream_that_splits")
    assert prepare_data(_job(splits.name), 8).stream_workers is None
    assert splits_across_workers(source_for(splits.name).build_stream(splits, [], StreamVariant()))


def _rewrite(shard: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(shard, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_broken_shards_are_refused_before_any_trial_naming_shard_and_sample(
    tiny_imagenet: Path, tmp_path: Path
) -> None:
    shards = write_shards(tiny_imagenet / "train", tmp_path / "s", 2)
    job = _job("webdataset", str(tmp_path / "s"), node_cpus=1, samples_per_trial=96)
    _rewrite(shards[1], {"a.jpg": b"\xff\xd8\xff", "a.cls": b"1", "b.jpg": b"\xff\xd8\xff"})
    with pytest.raises(DatasetError, match=r"shard-0001.tar, sample b, has no cls"):
        prepare_data(job, 8)
    _rewrite(shards[1], {"a.txt": b"hello", "a.cls": b"1"})
    with pytest.raises(DatasetError, match=r"sample a, has no jpg/jpeg/png/webp"):
        prepare_data(job, 8)
    whole = shards[0].read_bytes()
    shards[1].write_bytes(whole[: len(whole) // 2])  # truncated mid-member
    with pytest.raises(DatasetError, match=r"shard-0001.tar is truncated or not a tar file"):
        prepare_data(job, 8)


@pytest.mark.parametrize(
    ("name", "root", "ranks", "message"),
    [
        ("webdataset", "/nowhere/shards-{0000..0003}.tar", 1, "matches no .tar shard"),
        ("webdataset", "TINY", 8, "4 shards under .*, fewer than the 8 ranks"),
        ("datasets_for_tests:empty_stream", None, 1, "yielded no sample"),
    ],
)
def test_what_can_be_checked_up_front_is_one_line(
    tiny_shards: Path, name: str, root: str | None, ranks: int, message: str
) -> None:
    root = str(tiny_shards) if root == "TINY" else root
    with pytest.raises(DatasetError, match=message) as caught:
        prepare_data(_job(name, root, ranks=ranks), 8)
    assert "\n" not in str(caught.value)


def test_the_tuned_stream_trains_in_the_readme_s_loop(tiny_shards: Path, tmp_path: Path) -> None:
    """load_best_config(...).dataset(): the tuned webdataset over every shard; its
    dataloader(): no sampler, batch_size=None where the workers batch."""
    import json

    from raytune_loader import load_best_config
    from raytune_loader.hardware import cpu_and_gpu_summary

    best = {
        "schema_version": 1, "dataset": "webdataset", "model": "small-cnn",
        "objective": "util", "metrics": {}, "baselines": {}, "speedup": {},
        "hardware": cpu_and_gpu_summary(), "created": "",
        "loader": {"batch_size": 8, "num_workers": 2, "prefetch_factor": 2},
        "pipeline": {"transfer": "uint8", "decode": "tensor", "workers": "process",
                     "access": "stream", "batching": "workers"},
        "source": {"kind": "webdataset", "shuffle_buffer": 16},
        "search": {"dataset_spec": {"name": "webdataset", "data_root": "/elsewhere"}},
    }  # fmt: skip
    (tmp_path / "best_config.json").write_text(json.dumps(best))
    tuned = load_best_config(tmp_path / "best_config.json")
    loader = tuned.dataloader(tuned.dataset(tiny_shards))
    seen = 0
    for batch in loader:
        images, labels = tuned.to_device(batch, "cpu")
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 224, 224)
        seen += len(labels)
    assert seen == 96  # one epoch: all 4 shards, every sample once


@pytest.mark.slow
@pytest.mark.long
def test_a_webdataset_search_end_to_end(tiny_shards: Path, tmp_path: Path) -> None:
    """The command line on tar shards: the space searches batching in the workers,
    every trial's first batch is timed, the JSON says how the stream is read."""
    import csv
    import json

    from conftest import TINY_SEARCH, ray_processes, run_cli

    before = ray_processes()
    args = [a for a in TINY_SEARCH if a not in ("--dataset", "synthetic-imagenet",
                                                "--synthetic-images", "96")]  # fmt: skip
    result = run_cli(
        *args, "--dataset", "webdataset", "--data-root", str(tiny_shards), "--num-samples",
        "3", "--verify-repeats", "1", "--shuffle-buffer", "64", "--samples-per-trial", "48",
        "--out", str(tmp_path / "out"), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    folder = tmp_path / "out" / "webdataset"
    best = json.loads((folder / "best_config.json").read_text())
    assert best["source"]["kind"] == "webdataset" and best["source"]["shuffle_buffer"] == 64
    assert best["source"]["shards"] == 4 and best["pipeline"]["access"] == "stream"
    assert best["metrics"]["first_batch_s"]["median"] > 0
    with open(folder / "trials.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert all(r["access"] == "stream" for r in rows)
    assert all(float(r["first_batch_s"]) > 0 for r in rows if r["status"] == "ok")
    assert "1st s" in result.stdout and "read as a stream" in result.stdout
    assert ray_processes() <= before


@pytest.mark.slow
def test_a_user_iterable_dataset_search_end_to_end(tmp_path: Path) -> None:
    """A factory returning a stream that does not split across workers: the search
    warns, measures at most one worker, and records why."""
    import json

    from conftest import ray_processes, run_cli

    before = ray_processes()
    result = run_cli(
        "--dataset", "datasets_for_tests:stream_that_repeats", "--batch-size", "8",
        "--steps", "6", "--warmup-steps", "1", "--report-every", "3", "--num-samples", "2",
        "--verify-top", "1", "--verify-repeats", "1", "--out", str(tmp_path / "out"),
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "yields the same samples in every loader worker" in result.stderr + result.stdout
    best = json.loads(next((tmp_path / "out").glob("*/best_config.json")).read_text())
    assert best["loader"]["num_workers"] <= 1 and best["source"]["kind"] == "factory"
    assert "same samples in every loader worker" in best["source"]["note"]
    assert ray_processes() <= before

"""The Ray Data candidate: its configuration, the reservation, Ray's documented
defaults, the same training image as the DataLoader path (fast tier, no Ray started);
and on a real two-node Ray cluster on this machine, the actors on the CPU-only node,
every sample of an epoch once, the split parts, a steady rate and Ctrl-C (slow tier)."""

from __future__ import annotations

import ast
import csv
import hashlib
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from env_for_tests import environment, free_port
from torch.utils.data import Subset, default_collate

from raytune_loader import raydata
from raytune_loader.engines import engine_of
from raytune_loader.errors import ConfigError, DatasetError
from raytune_loader.loaders.batches import Stamped
from raytune_loader.measuring.job import SegmentSpec
from raytune_loader.pipeline.device import collate_encoded, to_device
from raytune_loader.raydata.config import RayDataConfig
from raytune_loader.sources.datasets import DatasetSpec, build_dataset

# -- the configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
        ({"batch_size": True}, "batch_size must be an integer >= 1, got True"),
        ({"min_actors": 0}, "min_actors must be an integer >= 1, got 0"),
        ({"min_actors": 3, "max_actors": 2}, "max_actors (2) must be >= min_actors (3)"),
        ({"cpus_per_actor": 0}, "cpus_per_actor must be a number > 0, got 0"),
        ({"cpus_per_actor": "1"}, "cpus_per_actor must be a number > 0, got '1'"),
        ({"map_batch_size": 0}, "map_batch_size must be an integer >= 1 or null"),
        ({"object_store_bytes": 2.5}, "object_store_bytes must be an integer >= 1 or null"),
        ({"block_bytes": -1}, "block_bytes must be an integer >= 1 or null"),
        ({"prefetch_batches": -1}, "prefetch_batches must be an integer >= 0, got -1"),
        ({"crosses": "bf16"}, "crosses must be one of float32, uint8, encoded, got 'bf16'"),
        ({"decoder": "device"}, "decoder must be one of pil, tensor, got 'device'"),
        ({"crosses": "encoded", "decoder": "tensor"}, "crosses=encoded decodes on the device"),
        ({"locality_with_output": 1}, "locality_with_output must be true or false, got 1"),
    ],
)
def test_an_impossible_candidate_is_refused_in_one_line(change: dict[str, Any], says: str) -> None:
    values = {"batch_size": 32, **change}
    with pytest.raises(ConfigError) as refused:
        RayDataConfig(**values)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_a_candidate_round_trips_through_its_dict_and_unknown_keys_are_refused() -> None:
    config = RayDataConfig(64, 2, 6, 0.5, 32, 4, "uint8", "tensor", 2**28, 2**24)
    assert RayDataConfig.from_dict(config.values()) == config
    with pytest.raises(ConfigError, match=r"unknown Ray Data keys \['num_workers'\]"):
        RayDataConfig.from_dict({**config.values(), "num_workers": 2})
    with pytest.raises(ConfigError, match="no batch_size"):
        RayDataConfig.from_dict({"max_actors": 2})
    assert config.with_batch_size(16) == replace(config, batch_size=16)


@pytest.mark.parametrize(
    ("crosses", "decoder", "transfer", "decode"),
    [
        ("float32", "pil", "float32", "pil"),
        ("uint8", "pil", "uint8", "pil"),
        ("float32", "tensor", "float32", "tensor"),
        ("uint8", "tensor", "uint8", "tensor"),
        ("encoded", "pil", "uint8", "device"),
    ],
)
def test_what_crosses_the_object_store_is_a_pipeline_variant(
    crosses: str, decoder: str, transfer: str, decode: str
) -> None:
    """The variant's names are LoaderConfig's, so the device side (to_device, the trial's
    Trainer.to_device) finishes a Ray Data batch as it finishes a DataLoader one."""
    config = RayDataConfig(32, crosses=crosses, decoder=decoder)
    assert (config.transfer, config.decode) == (transfer, decode)


def test_the_label_says_the_pool_and_what_differs_from_the_defaults() -> None:
    assert RayDataConfig(32, 2, 2).label() == "raydata actors=2x1cpu bs=32 map=block prefetch=1"
    tuned = RayDataConfig(32, 1, 4, 2, 64, 8, "encoded", object_store_bytes=2**29)
    assert tuned.label() == ("raydata actors=1-4x2cpu bs=32 map=64 prefetch=8 encoded store=512MiB")


def test_the_pipeline_watch_keeps_the_largest_actor_and_the_least_free_memory() -> None:
    """What the actors said of themselves in their rows, and Ray Data's figures of an
    execution; no spill reading without Ray (none is started)."""
    import numpy as np

    watch = raydata.PipelineWatch()
    for rss, free in ((100, 900), (300, 700), (200, 800)):
        watch.saw({"_rss": np.full(4, rss), "_free": np.full(4, free)})
    watch.window_started()
    watch.window_ended()

    class Ran:
        def get_stats_summary(self) -> Any:
            class Summary:
                extra_metrics = {"max_uss_bytes": {"max": 250.0},
                                 "task_submission_backpressure_time": 1.5,
                                 "task_output_backpressure_time_s": 0.5}  # fmt: skip

            return Summary()

    watch.executed(Ran())
    assert watch.figures() == {"store_spilled_bytes": None, "actor_rss_bytes": 300,
                               "actor_free_bytes": 700, "actor_uss_ray_bytes": 250,
                               "backpressure_s": 2.0}  # fmt: skip


def test_the_configuration_and_the_reservation_need_neither_ray_nor_torch() -> None:
    """A best_config.json reader or the search's space can hold Ray Data candidates
    without importing Ray Data (a process that never builds one pays nothing): the
    pipeline and its bundles need neither Ray nor torch, its engine no Ray."""
    bundles = ("from raytune_loader.raydata.config import RayDataConfig; "
               "from raytune_loader.raydata.reservation import actor_bundles; "
               "actor_bundles(RayDataConfig(32, 2, 4), 'cpu_node')")  # fmt: skip
    assert _imported_by(bundles) == []
    engine = ("from raytune_loader.engines import engine_of; "
              "from raytune_loader.raydata.config import RayDataConfig; "
              "engine_of(RayDataConfig(32, 2, 4).candidate()).bundles('cpu_node')")  # fmt: skip
    assert "ray" not in _imported_by(engine)


def _imported_by(code: str) -> list[str]:
    """Which of Ray and torch a fresh process imported to run ``code``."""
    show = "; import sys; print([m for m in ('ray', 'torch') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code + show], capture_output=True, text=True,
                         check=True)  # fmt: skip
    return ast.literal_eval(out.stdout.strip())


# -- the reservation -----------------------------------------------------------------------


def test_remote_cpus_are_those_of_the_nodes_beyond_the_trials() -> None:
    nodes = [
        {"CPU": 8.0, "GPU": 1.0, "gpu_node": 1.0},
        {"CPU": 16.0, "cpu_node": 1.0},
        {"CPU": 4.0},
    ]
    assert raydata.remote_cpus(nodes, "gpu_node") == 20.0
    assert raydata.remote_cpus(nodes, "gpu_node", pin="cpu_node") == 16.0
    assert raydata.remote_cpus(nodes, None) == 0.0  # nothing tells the trials' node apart


# -- Ray's documented defaults ---------------------------------------------------------------


def test_the_docs_default_is_ray_s_own_defaults() -> None:
    """The baseline is what map_batches and iter_torch_batches do when a user passes only
    the function and the batch size: checked against the installed Ray, not restated."""
    from ray.data import ActorPoolStrategy, DataContext, Dataset

    baseline = raydata.ray_docs_default(64, max_actors=6)
    pool = ActorPoolStrategy()  # a callable class's pool when compute is not given
    assert (baseline.min_actors, pool.min_size, pool.max_size) == (1, 1, float("inf"))
    assert baseline.max_actors == 6 and not baseline.fixed
    iterate = inspect.signature(Dataset.iter_torch_batches).parameters
    assert baseline.prefetch_batches == iterate["prefetch_batches"].default == 1
    assert (
        baseline.map_batch_size
        is inspect.signature(Dataset.map_batches).parameters["batch_size"].default
        is None
    )
    assert baseline.cpus_per_actor == 1.0  # map workers' num_cpus when not given (Ray 2.60)
    assert (baseline.block_bytes, baseline.object_store_bytes) == (None, None)
    assert (baseline.crosses, baseline.decoder, baseline.locality_with_output) == (
        "float32",
        "pil",
        False,
    )
    context, fresh = raydata.data_context(baseline), DataContext()
    assert context.target_max_block_size == fresh.target_max_block_size == 128 * 2**20
    assert context.execution_options.resource_limits == fresh.execution_options.resource_limits


def test_the_context_carries_the_candidate_s_knobs_and_leaves_the_current_one_alone() -> None:
    from ray.data import DataContext

    before = DataContext.get_current().target_max_block_size
    context = raydata.data_context(
        RayDataConfig(32, block_bytes=2**22, object_store_bytes=3 * 2**28)
    )
    assert context.target_max_block_size == 2**22
    assert context.execution_options.resource_limits.object_store_memory == 3 * 2**28
    assert not context.enable_progress_bars
    assert DataContext.get_current().target_max_block_size == before


def test_locality_with_output_is_refused_where_ray_ignores_it() -> None:
    """Ray 2.60 keeps ExecutionOptions.locality_with_output as a no-op that warns: a
    candidate that sets it would measure the same pipeline twice under two names."""
    import ray

    assert not raydata.locality_with_output_works(), f"Ray {ray.__version__} honours it again"
    with pytest.raises(ConfigError, match=rf"no-op in Ray {ray.__version__}.*leave it off"):
        raydata.data_context(RayDataConfig(32, locality_with_output=True))


# -- the same training image -----------------------------------------------------------------

VARIANTS = [("float32", "pil"), ("uint8", "pil"), ("float32", "tensor"), ("uint8", "tensor"),
            ("encoded", "pil")]  # fmt: skip


def _one_row_batch(rows: list[tuple[str, int]], index: int) -> dict[str, Any]:
    import numpy as np

    path, label = rows[index]
    return {"path": np.array([path], dtype=object), "label": np.array([label])}


@pytest.mark.parametrize(("crosses", "decoder"), VARIANTS)
def test_the_actors_make_the_training_image_the_dataloader_workers_make(
    tiny_imagenet: Path, crosses: str, decoder: str
) -> None:
    """With the same random draws (the crop box and the flip), a sample an actor makes
    and the training process collates is the DataLoader path's, bit for bit, before and
    after the variant's device side."""
    config = RayDataConfig(1, crosses=crosses, decoder=decoder)
    spec = DatasetSpec("synthetic-imagenet", str(tiny_imagenet))
    workers = build_dataset(spec, config.transfer, config.decode)  # what a DataLoader worker reads
    rows = raydata.image_rows(workers)
    collate_dl = collate_encoded if config.decode == "device" else default_collate
    collate_rd = raydata.batch_collate(config.decode)
    for index in range(0, 96, 12):
        torch.manual_seed(index)
        expected = collate_dl([workers[index]])
        torch.manual_seed(index)
        made = collate_rd(
            raydata.make_samples(_one_row_batch(rows, index), config.transfer, config.decode)
        )
        assert type(made[0]) is type(expected[0]) and torch.equal(made[1], expected[1])
        if config.decode == "device":
            assert torch.equal(made[0].data, expected[0].data)
            assert torch.equal(made[0].lengths, expected[0].lengths)
        else:
            assert made[0].dtype == expected[0].dtype and torch.equal(made[0], expected[0])
        finished = []
        for batch in (expected, made):
            torch.manual_seed(1000 + index)  # decode on the device crops there
            finished.append(to_device(batch, torch.device("cpu"), transfer=config.transfer,
                                      decode=config.decode)[0])  # fmt: skip
        assert finished[0].shape == (1, 3, 224, 224) and torch.equal(*finished)


def test_a_batch_carries_the_actors_own_time_for_its_rows(tiny_imagenet: Path) -> None:
    import numpy as np

    spec = DatasetSpec("synthetic-imagenet", str(tiny_imagenet))
    rows = raydata.image_rows(build_dataset(spec))
    first, second = (raydata.make_samples({"path": np.array([r[0] for r in rows[i:i + 3]]),
                                           "label": np.array([r[1] for r in rows[i:i + 3]])},
                                          "uint8", "pil") for i in (0, 3))  # fmt: skip
    assert (first["_made"] > first["_started"]).all() and (
        first["_started"][1:] >= first["_made"][:-1]
    ).all()
    joined = {k: np.concatenate([first[k], second[k]]) for k in first}  # rows of two calls
    stamped = raydata.batch_collate("pil", stamp=True)(joined)
    assert isinstance(stamped, Stamped) and stamped.batch[0].shape == (6, 3, 224, 224)
    own = sum(float((c["_made"] - c["_started"]).sum()) for c in (first, second))
    assert stamped.made - stamped.started == pytest.approx(own)
    assert stamped.made == pytest.approx(float(second["_made"][-1]))
    assert own < second["_made"][-1] - first["_started"][0] + 1e-9  # not the gap between calls


def test_a_file_that_does_not_decode_is_named(tmp_path: Path) -> None:
    from raytune_loader.errors import CorruptSampleError

    bad = tmp_path / "bad.JPEG"
    bad.write_bytes(b"not a jpeg")
    with pytest.raises(CorruptSampleError, match=f"corrupt sample {bad}"):
        raydata.make_samples({"path": [str(bad)], "label": [0]}, "float32", "pil")


def test_the_rows_are_the_trial_s_subset_in_its_order(tiny_imagenet: Path) -> None:
    full = build_dataset(DatasetSpec("synthetic-imagenet", str(tiny_imagenet)))
    subset = Subset(Subset(full, [5, 9, 2, 40]), [3, 0])
    assert raydata.image_rows(subset) == [full.samples[40], full.samples[5]]  # type: ignore[attr-defined]
    assert len(raydata.image_rows(full)) == 96
    with pytest.raises(DatasetError, match="not an image folder"):
        raydata.image_rows(torch.utils.data.TensorDataset(torch.zeros(4)))


def test_an_epoch_reads_each_row_once_and_a_longer_one_reshuffles() -> None:
    once = raydata.epoch_order(10, None, seed=3)
    assert sorted(once) == list(range(10)) and once == raydata.epoch_order(10, None, seed=3)
    assert once != raydata.epoch_order(10, None, seed=4)
    longer = raydata.epoch_order(10, 25, seed=3)
    assert longer[:10] == once and sorted(longer[10:20]) == list(range(10)) and len(longer) == 25
    assert longer[10:20] != once


# -- other sources: shards through Ray's own readers, a map-style dataset by index -----------


@pytest.fixture
def local_ray() -> Iterator[None]:
    """A one-node Ray of two CPUs for one test's reads, shut down after it (per test: the
    slow tier's cluster of this module connects this process to another Ray)."""
    import ray

    from conftest import ray_processes, ray_processes_left

    before = ray_processes()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
    assert not ray_processes_left(before)


def _folder_samples(tiny_imagenet: Path) -> dict[str, tuple[int, int]]:
    """Each JPEG file of tiny_imagenet by its bytes' digest: (its index in the image
    folder dataset, its class), as write_shards and _write_parquet label them."""
    dataset = build_dataset(DatasetSpec("synthetic-imagenet", str(tiny_imagenet)))
    return {hashlib.sha1(Path(path).read_bytes()).hexdigest(): (index, label)
            for index, (path, label) in enumerate(dataset.samples)}  # type: ignore[attr-defined]  # fmt: skip


def _encoded_epochs(rows: Any, epochs: int = 2, **build: Any) -> list[list[tuple[str, int]]]:
    """Each epoch's (file digest, class), in order, of the encoded files the actors hand
    over: one execution of the pipeline an epoch."""
    config = RayDataConfig(8, crosses="encoded", map_batch_size=8)
    loader = raydata.RayDataLoader(raydata.build_dataset(rows, config, **build), config)
    read = []
    for _ in range(epochs):
        read.append([(hashlib.sha1(file.numpy().tobytes()).hexdigest(), int(label))
                     for images, labels in loader
                     for file, label in zip(images.files(), labels, strict=True)])  # fmt: skip
    return read


def _same_as_the_folder(
    read: Any, folder: dict[str, tuple[int, int]], tiny_imagenet: Path, transfer: str, decode: str
) -> None:
    """Rows as Ray's reader hands them (undecoded), each made by the actors' code with
    ``read``'s decoder, are the image folder's DataLoader sample of the same file, bit for
    bit with the same random draws, with the same class."""
    workers = build_dataset(DatasetSpec("synthetic-imagenet", str(tiny_imagenet)), transfer, decode)
    raw = raydata._read_shards(read, seed=0, samples=None, placement={})
    batch = next(iter(raw.iter_batches(batch_size=3, batch_format="numpy")))
    for row in range(3):
        one = {name: values[row : row + 1] for name, values in batch.items()}
        torch.manual_seed(row)
        made = raydata.make_samples(one, transfer, decode, read.decoded)
        image = one["jpg"][0] if "jpg" in one else one["image"][0]["bytes"]
        index, label = folder[hashlib.sha1(image).hexdigest()]
        torch.manual_seed(row)
        expected, expected_label = workers[index]
        assert made["label"].tolist() == [label] == [expected_label]
        assert made["image"].dtype == expected.numpy().dtype
        assert torch.equal(torch.from_numpy(made["image"][0]), expected)


def test_a_segment_longer_than_the_shards_lists_them_pass_after_pass() -> None:
    paths = [f"shard-{i}.tar" for i in range(5)]
    listed = raydata.shard_passes(paths, 3, seed=1)
    passes = [listed[i : i + 5] for i in range(0, 15, 5)]
    assert len(listed) == 15 and all(sorted(p) == paths for p in passes)
    assert passes[0] != passes[1] and listed == raydata.shard_passes(paths, 3, seed=1)


def test_webdataset_shards_become_ray_s_webdataset_read_of_the_same_files(
    tiny_shards: Path,
) -> None:
    """The seam, without Ray: a stream over shards is read by ``read_webdataset`` of its
    own files, with its sample count and the stream's own decoder (the slow tier reads
    them through Ray Data, every sample once an epoch)."""
    from raytune_loader.loaders.shard_stream import StreamVariant
    from raytune_loader.sources import webdataset_shards

    spec = DatasetSpec("webdataset", str(tiny_shards))
    stream = webdataset_shards.SOURCE.build_stream(spec, [], StreamVariant("uint8", "device"))
    read = raydata.rows_of(stream)
    assert (read.reader, read.rows, read.paths) == ("webdataset", 96, stream.shards)  # type: ignore[union-attr]
    assert read.decoded is stream.decode  # type: ignore[union-attr]


@pytest.mark.slow
def test_webdataset_shards_are_read_by_ray_s_reader_every_sample_once_an_epoch(
    local_ray: None, tiny_shards: Path, tiny_imagenet: Path
) -> None:
    """The trial's stream over the shards becomes ``read_webdataset`` of its shards: an
    epoch is every sample once with its class, the next ones in other orders; a segment longer
    than the shards is cut to length; a row is the DataLoader path's sample."""
    from raytune_loader.loaders.shard_stream import StreamVariant
    from raytune_loader.sources import webdataset_shards

    spec = DatasetSpec("webdataset", str(tiny_shards))
    source = webdataset_shards.SOURCE
    read = raydata.rows_of(source.build_stream(spec, [], StreamVariant("uint8", "device")))
    assert (read.reader, read.rows, len(read.paths)) == ("webdataset", 96, 4)  # type: ignore[union-attr]
    folder = _folder_samples(tiny_imagenet)
    everything = sorted((digest, label) for digest, (_, label) in folder.items())
    epochs = _encoded_epochs(read, epochs=3, seed=5)
    assert all(sorted(epoch) == everything for epoch in epochs)
    # each execution draws its files' order anew, but Ray's read tasks finish in any
    # order: two epochs of 4 shards come out the same 1 time in 24, three 1 in 576
    assert len({tuple(epoch) for epoch in epochs}) > 1
    (segment,) = _encoded_epochs(read, epochs=1, seed=5, samples=120)  # 96 and a part
    assert len(segment) == 120 and set(segment) <= set(everything)
    assert max(segment.count(row) for row in segment) == 2
    variant = StreamVariant("float32", "tensor")
    _same_as_the_folder(raydata.rows_of(source.build_stream(spec, [], variant)), folder,
                        tiny_imagenet, "float32", "tensor")  # fmt: skip


def _write_parquet(images: Path, out: Path, files: int) -> None:
    """The image folder as Parquet files of HF's Image storage ({bytes, path}) and
    integer classes, in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    classes = sorted(p.name for p in images.iterdir() if p.is_dir())
    paths = sorted(images.rglob("*.JPEG"))
    out.mkdir(parents=True)
    for part in range(files):
        chosen = paths[part::files]
        pq.write_table(pa.table({
            "image": [{"bytes": f.read_bytes(), "path": f.name} for f in chosen],
            "label": [classes.index(f.parent.name) for f in chosen],
        }), out / f"part-{part}.parquet")  # fmt: skip


@pytest.mark.slow
def test_best_config_s_ray_data_pipeline_reads_the_searched_shards_every_sample_once(
    local_ray: None, tiny_shards: Path, tiny_imagenet: Path, tmp_path: Path
) -> None:
    """A Ray Data winner of a search on webdataset shards, loaded from best_config.json:
    ``raydata_dataset()`` reads the shards the search read (with Ray's reader), and an
    epoch iterated with the tuned arguments is every file once with its class."""
    from raytune_loader import load_best_config

    section = RayDataConfig(8, crosses="encoded", map_batch_size=8)
    spec = {"name": "webdataset", "data_root": str(tiny_shards)}
    best = {"schema_version": 1, "dataset": "webdataset", "model": "small-cnn",
            "objective": "util", "engine": "raydata",
            "loader": {"batch_size": 8, "num_workers": 1, "access": "stream"},
            "metrics": {}, "baselines": {}, "speedup": {}, "hardware": {},
            "search": {"dataset_spec": spec}, "created": "now",
            "raydata": {"chosen": True, "config": section.values()}}  # fmt: skip
    (tmp_path / "best_config.json").write_text(json.dumps(best))
    tuned = load_best_config(tmp_path / "best_config.json")
    epoch = [(hashlib.sha1(file.numpy().tobytes()).hexdigest(), int(label))
             for images, labels in tuned.raydata_dataset().iter_torch_batches(
                 **tuned.iteration_arguments())
             for file, label in zip(images.files(), labels, strict=True)]  # fmt: skip
    folder = _folder_samples(tiny_imagenet)
    assert sorted(epoch) == sorted((digest, label) for digest, (_, label) in folder.items())


def _parquet_table(images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``--dataset hf`` on three Parquet files of ``images``, as its spec."""
    from raytune_loader.sources import hf_tables

    _write_parquet(images, tmp_path / "parquet", 3)
    monkeypatch.setattr(hf_tables._datasets().config, "HF_DATASETS_CACHE", str(tmp_path / "c"))
    return DatasetSpec("hf", str(tmp_path / "parquet"))


def test_hf_parquet_files_become_ray_s_read_parquet_of_the_same_files(
    tiny_imagenet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seam, without Ray: the map-style table a trial builds and its stream both say
    ``read_parquet`` of its files, its rows and its columns (the whole table:
    ``read_parquet`` reads files, not rows by index)."""
    from raytune_loader.loaders.shard_stream import StreamVariant
    from raytune_loader.sources import hf_tables

    spec = _parquet_table(tiny_imagenet / "train", tmp_path, monkeypatch)
    table = hf_tables.SOURCE.build(spec, "uint8", "device")  # the encoded files cross
    read = raydata.rows_of(Subset(table, [4, 1]))
    stream = raydata.rows_of(hf_tables.SOURCE.build_stream(spec, [], StreamVariant()))
    for each in (read, stream):
        assert (each.reader, each.rows, each.columns) == ("parquet", 96, ("image", "label"))  # type: ignore[union-attr]
        assert each.paths == tuple(
            str(tmp_path / "parquet" / f"part-{i}.parquet") for i in range(3)
        )  # type: ignore[union-attr]


@pytest.mark.slow
def test_hf_parquet_files_are_read_by_read_parquet_every_row_once_an_epoch(
    local_ray: None, tiny_imagenet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An epoch of ``read_parquet`` is every row once with its class; a row is the
    DataLoader path's sample of the same image."""
    from raytune_loader.sources import hf_tables

    spec = _parquet_table(tiny_imagenet / "train", tmp_path, monkeypatch)
    read = raydata.rows_of(hf_tables.SOURCE.build(spec, "uint8", "device"))
    folder = _folder_samples(tiny_imagenet)
    (epoch,) = _encoded_epochs(read, epochs=1, seed=2)
    assert sorted(epoch) == sorted((digest, label) for digest, (_, label) in folder.items())
    decoded = raydata.rows_of(hf_tables.SOURCE.build(spec, "uint8", "pil"))
    _same_as_the_folder(decoded, folder, tiny_imagenet, "uint8", "pil")


def _indexed() -> tuple[Any, torch.Tensor]:
    """A dataset that is neither files nor shards: a subset of tensors, labels i % 7."""
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (40, 3, 8, 8), dtype=torch.uint8, generator=generator)
    return Subset(TensorDataset(images, torch.arange(40) % 7), list(range(3, 27))), images


def test_a_map_style_dataset_of_the_user_s_becomes_rows_of_its_indices() -> None:
    """The seam, without Ray: the rows are the dataset's indices, which each actor reads
    with ``dataset[i]`` (the slow tier runs the actors)."""
    dataset, _ = _indexed()
    rows = raydata.rows_of(dataset)
    assert isinstance(rows, raydata.ByIndex) and rows.dataset is dataset
    assert raydata.Indexed(dataset)({"index": 5})[1] == (3 + 5) % 7


@pytest.mark.slow
def test_a_map_style_dataset_of_the_user_s_is_read_by_index_each_sample_once(
    local_ray: None,
) -> None:
    """Each actor holds the dataset and calls ``dataset[i]``; the trial's subset is read,
    each sample once an epoch with its label, and another order the next."""
    dataset, images = _indexed()
    rows = raydata.rows_of(dataset)
    config = RayDataConfig(8, crosses="uint8")
    loader = raydata.RayDataLoader(raydata.build_dataset(rows, config, seed=1), config)
    epochs = [[(bytes(image.numpy()), int(label)) for batch in loader
               for image, label in zip(*batch, strict=True)] for _ in range(2)]  # fmt: skip
    expected = sorted((bytes(images[i].numpy()), i % 7) for i in range(3, 27))
    assert sorted(epochs[0]) == sorted(epochs[1]) == expected and epochs[0] != epochs[1]


def test_what_ray_data_cannot_read_is_refused_in_one_line_saying_what_to_do() -> None:
    from torch.utils.data import IterableDataset

    from raytune_loader.loaders.shard_stream import ShardStream
    from raytune_loader.sources import table_files

    class HubStream(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Iterator[Any]:
            yield from ()

    arrow = ShardStream(["train/data-00000.arrow"], [4], table_files.TableShards(("i", "l")), str)
    for dataset, says in ((HubStream(), "HubStream is a stream: Ray Data's actors read a "
                           "map-style dataset by index (a Hugging Face streaming dataset"),
                          (arrow, "Ray Data has no reader of these shards")):  # fmt: skip
        with pytest.raises(DatasetError) as refused:
            raydata.rows_of(dataset)
        assert says in str(refused.value) and "--no-ray-data" in str(refused.value)
        assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("dataset", "offered"),
    [
        ("webdataset", 1.0),
        ("hf", 1.0),
        ("datasets_for_tests:fast", 1.0),
        ("datasets_for_tests:stream_that_repeats", 0.0),
    ],  # fmt: skip
)
def test_ray_data_is_offered_for_shards_tables_and_map_style_datasets_not_user_streams(
    dataset: str, offered: float
) -> None:
    from conftest import OneNode, Said
    from raytune_loader.tuning.bounds import raydata_cpus
    from raytune_loader.tuning.options import SearchOptions, job_from_options

    opts = SearchOptions(ray_data=True)
    job = replace(job_from_options(opts, "small-cnn", device="cpu", node_cpus=2.0),
                  dataset=DatasetSpec(dataset, "/nowhere"))  # fmt: skip
    said = Said()
    assert raydata_cpus(opts, OneNode(), job, said) == offered  # type: ignore[arg-type]
    if not offered:
        assert (
            said.warnings
            and "not offered with datasets_for_tests:stream_that_repeats" in (said.warnings[0])
        )


@pytest.mark.slow
def test_a_search_with_ray_data_on_webdataset_shards_measures_ray_data_trials(
    tiny_shards: Path, tmp_path: Path
) -> None:
    """``--ray-data`` on one machine and ``--dataset webdataset``: Ray's documented
    pipeline and tuned Ray Data candidates run as trials over the shards (read by
    ``read_webdataset``) beside the DataLoader's stream, with a rate; no Ray daemon is
    left."""
    from conftest import TINY_SEARCH, ray_processes, run_cli

    before = ray_processes()
    args = [a for a in TINY_SEARCH if a not in ("--dataset", "synthetic-imagenet",
                                                "--synthetic-images", "96")]  # fmt: skip
    result = run_cli(
        *args, "--dataset", "webdataset", "--data-root", str(tiny_shards), "--ray-data",
        "--num-samples", "4", "--verify-repeats", "1", "--samples-per-trial", "48",
        "--out", str(tmp_path / "out"), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Ray Data candidates: actors on up to" in result.stdout
    folder = tmp_path / "out" / "webdataset"
    rows = list(csv.DictReader((folder / "trials.csv").open()))
    measured = [r for r in rows if r["engine"] == "raydata" and r["samples_per_s"]]
    assert {r["baseline"] for r in measured} >= {"ray-docs-default", ""}, rows  # and a tuned one
    assert all(float(r["samples_per_s"]) > 0 for r in measured)
    docs = json.loads((folder / "best_config.json").read_text())["baselines"]["ray-docs-default"]
    assert docs["metrics"]["samples_per_s"]["median"] > 0  # verified beside the DataLoader's
    assert any(r["engine"] == "dataloader" and r["access"] == "stream" for r in rows)
    assert ray_processes() <= before


# -- on a real cluster (slow) ---------------------------------------------------------------

TRAINER = "raydata_trainer"  # the custom resource that pins the trial's process
CPU_NODE = "raydata_cpu_node"  # the CPU-only node's
MAKER = "MapWorker(MapBatches(SampleMaker))"  # Ray Data's name for our actors


class TwoNodes:
    """A head node for the trials (2 CPUs, ``TRAINER``) and a CPU-only node (2 CPUs,
    ``CPU_NODE``), with the dashboard on a free port for the state API."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        store = 200 * 2**20
        port = free_port()
        # its workers ask this cluster's state API, not whichever /tmp/ray names last
        # (Ray Train's placement-group cleaner asks it whether its controller lives)
        api = {"RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{port}"}
        with environment(api):
            self.cluster = Cluster(
                initialize_head=True,
                head_node_args={"num_cpus": 2, "resources": {TRAINER: 1},
                                "include_dashboard": True, "dashboard_port": port,
                                "object_store_memory": store,
                                "_system_config": {"worker_niceness": 0}},
            )  # fmt: skip
            self.cpu_node = self.cluster.add_node(
                num_cpus=2, resources={CPU_NODE: 1}, object_store_memory=store
            )
        self.cluster.wait_for_nodes()

    def makers(self) -> list[Any]:
        """Our pipeline's live actors, from Ray's state API."""
        from ray.util.state import list_actors

        live = list_actors(address=self.cluster.address, filters=[("state", "=", "ALIVE")])
        return [actor for actor in live if actor.class_name == MAKER]

    def no_makers_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.makers():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodes]:
    import ray

    from conftest import ray_processes, ray_processes_left

    before = ray_processes()
    # the trial and rank functions below reach the workers by value: tests/ is not on
    # their path
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    nodes = TwoNodes()
    try:
        ray.init(address=nodes.cluster.address)
        yield nodes
    finally:
        ray.shutdown()
        nodes.cluster.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert not ray_processes_left(before)  # no node left behind


@pytest.fixture(scope="module")
def rows(tiny_imagenet: Path) -> list[tuple[str, int]]:
    return raydata.image_rows(build_dataset(DatasetSpec("synthetic-imagenet", str(tiny_imagenet))))


def _digests(batch: Any) -> list[str]:
    return [hashlib.sha1(f.numpy().tobytes()).hexdigest() for f in batch[0].files()]


def _file_digests(rows: list[tuple[str, int]]) -> list[str]:
    return sorted(hashlib.sha1(Path(path).read_bytes()).hexdigest() for path, _ in rows)


def _trial(rows: list[tuple[str, int]], config: RayDataConfig) -> dict[str, Any]:
    """A trial's process: build the candidate's dataset where it runs (its placement
    group's head bundle) and read one epoch, asking mid-epoch where the actors are."""
    import ray
    from ray.util.state import list_actors

    loader = raydata.RayDataLoader(raydata.build_dataset(rows, config, seed=7), config)
    seen: list[str] = []
    nodes: set[str] = set()
    for batch in loader:
        seen += _digests(batch)
        if not nodes:
            live = list_actors(filters=[("state", "=", "ALIVE")])
            nodes = {a.node_id for a in live if a.class_name == MAKER}
    return {"seen": seen, "actor_nodes": nodes, "own_node": ray.get_runtime_context().get_node_id()}


@pytest.mark.slow
def test_the_actors_run_in_the_trial_s_bundles_on_the_cpu_node_and_an_epoch_reads_each_sample_once(
    two_nodes: TwoNodes, rows: list[tuple[str, int]]
) -> None:
    """The trial's head bundle pins it to the trainer node, which keeps a CPU free: an
    actor scheduled outside the trial's bundles could take it. Pinned to the CPU node,
    the actor bundles hold the pipeline; every file crosses once (encoded: its bytes)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    config = RayDataConfig(8, max_actors=2, map_batch_size=8, crosses="encoded")
    head = {"CPU": 1.0, TRAINER: raydata.PIN_SHARE}
    bundles = [head, *engine_of(config.candidate()).bundles(CPU_NODE)]
    group = placement_group(bundles, strategy="PACK")
    ray.get(group.ready(), timeout=60)
    try:
        trial = ray.remote(_trial).options(
            num_cpus=1, resources={TRAINER: raydata.PIN_SHARE},
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True),
        )  # fmt: skip
        result = ray.get(trial.remote(rows, config), timeout=240)
    finally:
        remove_placement_group(group)
    head = next(n["NodeID"] for n in ray.nodes() if n["Resources"].get(TRAINER))
    assert result["own_node"] == head
    assert result["actor_nodes"] == {two_nodes.cpu_node.node_id}
    assert sorted(result["seen"]) == _file_digests(rows)  # each once, none missing
    assert two_nodes.no_makers_within(30)  # the epoch's end ends its actors


def _read_part(part: raydata.RayDataLoader) -> list[str]:
    """A rank's process: its part of the epoch, each file's digest."""
    return [digest for batch in part for digest in _digests(batch)]


@pytest.mark.slow
def test_two_split_parts_read_disjoint_samples_that_cover_the_data(
    two_nodes: TwoNodes, rows: list[tuple[str, int]]
) -> None:
    """One ``streaming_split`` part per rank, each read by its own process on the
    trainer node at the same time (an epoch starts when every part asks)."""
    import ray

    config = RayDataConfig(8, max_actors=1, map_batch_size=8, crosses="encoded")
    parts = raydata.split_loaders(raydata.build_dataset(rows, config, seed=3), config, 2)
    rank = ray.remote(_read_part).options(num_cpus=0, resources={TRAINER: raydata.PIN_SHARE})
    first, second = ray.get([rank.remote(part) for part in parts], timeout=240)
    assert len(first) == len(second) == len(rows) // 2
    assert not set(first) & set(second)
    assert sorted(first + second) == _file_digests(rows)


@pytest.mark.slow
def test_the_training_segment_s_steady_window_over_the_pipeline_stays_within_its_actor(
    two_nodes: TwoNodes, tiny_imagenet: Path
) -> None:
    """The segment every candidate trains (``measure.train_segment``: warm-up, drain,
    window over stamped batches) with a step that takes no time: the loop is served as
    fast as the one actor makes batches, which cannot beat one core's worker side of
    the variant (a deep prefetch would show a stock's speed if the stamps or the drain
    were wrong); the actors said their memory, and Ray Data its own figures."""
    from raytune_loader.measuring.measure import worker_side_rate
    from raytune_loader.measuring.segment import train_segment
    from raytune_loader.measuring.step import Trainer

    spec = DatasetSpec("synthetic-imagenet", str(tiny_imagenet))
    config = RayDataConfig(8, max_actors=1, map_batch_size=8, prefetch_batches=8, crosses="uint8")
    subset = Subset(build_dataset(spec, config.transfer, config.decode), list(range(64)))
    segment = SegmentSpec(warmup_steps=1, steps=24, compute_threads=1)
    trainer = Trainer(lambda batch: None, torch.device("cpu"), name="no step")
    # one core's rate, before and after the segment: each reading can share the cores
    # with the cluster's start-up or the executor still filling its buffers and come out
    # low (134.5 against a window of 218.4 on one CI machine), never high; the bound is
    # the best of them
    before = worker_side_rate(subset, samples=64)
    held = train_segment(subset, trainer, config.candidate(), segment)
    one_core = max(before, *(worker_side_rate(subset, samples=64) for _ in range(2)))
    assert held.samples == 24 * 8 and held.steady_ratio is not None
    assert 0 < held.samples_per_s <= 1.25 * one_core, (held, before, one_core)
    assert held.actor_rss_bytes and held.actor_rss_bytes > 50 * 2**20  # torch is loaded
    assert held.actor_free_bytes and held.actor_uss_ray_bytes and held.store_spilled_bytes == 0
    assert held.backpressure_s is not None and held.epoch_start_s is not None
    assert two_nodes.no_makers_within(30)


def _read_on(rows: list[tuple[str, int]], config: RayDataConfig) -> int:
    """A trial's process reading a long epoch, until it is stopped."""
    loader = raydata.RayDataLoader(raydata.build_dataset(rows, config, samples=100_000), config)
    return sum(1 for _ in loader)


@pytest.mark.slow
def test_ctrl_c_a_stopped_trial_or_an_abandoned_epoch_leaves_no_actor(
    two_nodes: TwoNodes, rows: list[tuple[str, int]]
) -> None:
    """Ctrl-C in the loop, the trial's process killed as Tune stops a trial, and an
    epoch closed half-read (as the trial's epochs close a segment)."""
    import ray

    config = RayDataConfig(8, max_actors=1, map_batch_size=8, crosses="uint8")
    loader = raydata.RayDataLoader(raydata.build_dataset(rows, config, seed=5), config)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            for count, _ in enumerate(loader):
                assert two_nodes.makers()
                if count == 1:  # while the loop trains or waits for the next batch
                    threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
                    time.sleep(0.1)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert two_nodes.no_makers_within(30)

    trial = ray.remote(_read_on).options(num_cpus=1, resources={TRAINER: raydata.PIN_SHARE})
    running = trial.remote(rows, config)
    deadline = time.monotonic() + 60
    while not two_nodes.makers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert two_nodes.makers()
    ray.cancel(running, force=True)  # the process ends, as a stopped trial's actor does
    assert two_nodes.no_makers_within(30)

    batches = iter(raydata.RayDataLoader(raydata.build_dataset(rows, config, seed=6), config))
    next(batches)
    assert two_nodes.makers()
    batches.close()  # what the trial's epochs do when a segment ends or fails
    assert two_nodes.no_makers_within(30)


def _read_failing(rows: list[tuple[str, int]], config: RayDataConfig) -> tuple[str, bool]:
    """A trial's process reading an epoch with a bad file: what it raised, and whether the
    pipeline's actors were gone within 30 s after (asked here, with no test harness
    holding the error)."""
    from ray.util.state import list_actors

    from raytune_loader.errors import CorruptSampleError

    said = ""
    try:
        for _ in raydata.RayDataLoader(raydata.build_dataset(rows, config), config):
            pass
    except CorruptSampleError as exc:
        said = str(exc)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        live = list_actors(filters=[("state", "=", "ALIVE")])
        if not [a for a in live if a.class_name == MAKER]:
            return said, True
        time.sleep(0.5)
    return said, False


@pytest.mark.slow
def test_a_file_that_does_not_decode_fails_the_epoch_naming_it_and_ends_its_actors(
    two_nodes: TwoNodes, rows: list[tuple[str, int]], tmp_path: Path
) -> None:
    """The actor's CorruptSampleError reaches the loop as itself, in one line naming the
    file (a trial's ``corrupt_sample``), not as Ray Data's wrapper of user code; and the
    failed execution's actors end with it (Ray Data shuts a failed execution down
    unforced and leaves its actors' handles in reference cycles)."""
    import ray

    bad = tmp_path / "bad.JPEG"
    bad.write_bytes(b"not a jpeg")
    config = RayDataConfig(8, max_actors=1, map_batch_size=8)
    trial = ray.remote(_read_failing).options(num_cpus=1, resources={TRAINER: raydata.PIN_SHARE})
    said, ended = ray.get(trial.remote([*rows[:15], (str(bad), 0)], config), timeout=240)
    assert said.startswith(f"corrupt sample {bad}: ") and "\n" not in said
    assert ended


# -- the search with Ray Data candidates, on the cluster (slow) ------------------------------


def _searching(two_nodes: TwoNodes, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The real command line, joined to the cluster: trials on the trainer node (its
    resource), Ray Data's actors on the CPU node (its resource)."""
    from conftest import TINY_SEARCH, run_cli

    return run_cli(
        *TINY_SEARCH, "--num-samples", "5", "--address", two_nodes.cluster.address,
        "--node-type", TRAINER, "--cpu-node-type", CPU_NODE, "--out", str(out / "results"),
        *extra, cwd=out, timeout=600,
    )  # fmt: skip


@pytest.mark.slow
def test_a_search_on_the_cluster_verifies_tuned_ray_data_beside_ray_s_docs_and_writes_it(
    two_nodes: TwoNodes, tiny_imagenet: Path, tmp_path: Path
) -> None:
    """``python -m raytune_loader.search`` on a cluster with a CPU-only node offers Ray
    Data candidates: each Ray Data trial's actors run in the placement group Tune made
    for it (its bundles on the CPU node: Tune's group captures the trial's actors), the
    best tuned one is verified beside Ray's documented pipeline and the DataLoader
    baselines, and best_config.json has it, read back by load_best_config; no actor
    and no placement group outlives the search."""
    import ray

    from raytune_loader import load_best_config

    actor_nodes: set[str] = set()
    done = threading.Event()

    def watch() -> None:  # where the pipeline's actors run, while the search runs
        while not done.wait(0.5):
            actor_nodes.update(actor.node_id for actor in two_nodes.makers())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        # one report a trial, at its end: ASHA cannot stop a Ray Data trial before the
        # figures only a whole segment has (an actor's memory, backpressure)
        result = _searching(two_nodes, tmp_path, "--data-root", str(tiny_imagenet),
                            "--report-every", "6")  # fmt: skip
    finally:
        done.set()
        watcher.join()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Ray Data candidates: actors on up to" in result.stdout
    folder = tmp_path / "results" / "synthetic-imagenet"
    best = json.loads((folder / "best_config.json").read_text())
    section = best["raydata"]
    assert section["name"] != "ray-docs-default" and section["metrics"]["samples_per_s"]
    assert len(section["metrics"]["samples_per_s"]["values"]) == 2  # verified, two rounds
    docs = best["baselines"]["ray-docs-default"]
    assert docs["raydata"]["min_actors"] == 1 and docs["metrics"]["samples_per_s"]["median"] > 0
    assert best["speedup"]["vs_ray_docs_default"] and best["search"]["space"]["raydata_cpus"] >= 1
    assert load_best_config(folder / "best_config.json").raydata == RayDataConfig.from_dict(
        section["config"]
    )
    rows = list(csv.DictReader((folder / "trials.csv").open()))
    ran = [r for r in rows if r["engine"] == "raydata" and r["status"] == "ok"]
    assert ran and all(
        float(r["cpus_reserved"]) == 1 + int(r["max_actors"]) * float(r["cpus_per_actor"])
        for r in ran
    )
    assert all(r["actor_rss_bytes"] and r["backpressure_s"] for r in ran)
    assert actor_nodes == {two_nodes.cpu_node.node_id}
    assert two_nodes.no_makers_within(30)
    groups = ray.util.placement_group_table().values()
    assert all(group["state"] == "REMOVED" for group in groups), groups


@pytest.mark.slow
def test_a_cpu_node_that_cannot_import_the_pipeline_is_named_in_one_line_before_any_trial(
    two_nodes: TwoNodes, tiny_imagenet: Path, tmp_path: Path
) -> None:
    """A third node for the actors whose Python lacks torchvision: the search stops
    before its first trial, exit status 2, one line naming that node."""
    broken = tmp_path / "site" / "torchvision"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torchvision'\")\n"
    )
    node = two_nodes.cluster.add_node(
        num_cpus=1, resources={CPU_NODE: 1}, object_store_memory=100 * 2**20,
        env_vars={"PYTHONPATH": str(broken.parent)},
    )  # fmt: skip
    try:
        two_nodes.cluster.wait_for_nodes()
        result = _searching(two_nodes, tmp_path, "--data-root", str(tiny_imagenet))
    finally:
        two_nodes.cluster.remove_node(node)
    said = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert said[-1].startswith("error: the CPU node ") and node.node_id[:12] in said[-1]
    assert "torchvision" in said[-1] and not (tmp_path / "results" / "synthetic-imagenet" /
                                               "trials.csv").exists()  # fmt: skip


def _train_on_parts(config: dict[str, Any]) -> None:
    """A Ray Train worker: the tuned Ray Data pipeline's part for this rank, as the docs
    show it (get_dataset_shard, iteration_arguments, raydata_to_device), two epochs,
    each file's digest written down."""
    import ray.train

    from raytune_loader import load_best_config

    tuned = load_best_config(config["path"])
    shard = ray.train.get_dataset_shard("train")
    rank = ray.train.get_context().get_world_rank()
    model = torch.nn.Linear(3, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: dict[int, list[str]] = {}
    for epoch in range(2):
        seen[epoch] = []
        for batch in shard.iter_torch_batches(**tuned.iteration_arguments()):
            seen[epoch] += _digests(batch)
            images, labels = tuned.raydata_to_device(batch, "cpu")
            loss = torch.nn.functional.cross_entropy(model(images.mean(dim=(2, 3))), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps(seen))


@pytest.mark.slow
def test_ray_train_s_two_workers_each_read_a_disjoint_part_that_covers_the_data_every_epoch(
    two_nodes: TwoNodes, tiny_imagenet: Path, rows: list[tuple[str, int]], tmp_path: Path
) -> None:
    """best_config.json's raydata section in Ray Train's TorchTrainer with two workers:
    ``datasets={"train": tuned.raydata_dataset()}``, each worker reading its shard with
    the tuned iteration arguments (the encoded files cross, so each is known by its
    digest): in each epoch the two parts are disjoint and together every file once."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from raytune_loader import load_best_config

    section = RayDataConfig(8, 1, 1, map_batch_size=8, prefetch_batches=2, crosses="encoded")
    spec = {"name": "synthetic-imagenet", "data_root": str(tiny_imagenet), "download": False,
            "synthetic_images": 96, "image_column": "image", "label_column": "label",
            "shuffle_buffer": None}  # fmt: skip
    best = {"schema_version": 1, "dataset": "synthetic-imagenet", "model": "small-cnn",
            "objective": "util", "engine": "raydata", "loader": {"batch_size": 8},
            "metrics": {}, "baselines": {}, "speedup": {}, "hardware": {},
            "search": {"dataset_spec": spec},
            "raydata": {"chosen": True, "config": section.values()}}  # fmt: skip
    path = tmp_path / "best_config.json"
    path.write_text(json.dumps({**best, "created": "now"}))
    tuned = load_best_config(path)
    trainer = TorchTrainer(
        _train_on_parts,
        train_loop_config={"path": str(path), "out": str(tmp_path)},
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=ray.train.RunConfig(storage_path=str(tmp_path / "ray"), name="raydata"),
        datasets={"train": tuned.raydata_dataset()},
    )
    trainer.fit()
    parts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for epoch in ("0", "1"):
        zero, one = (part[epoch] for part in parts)
        assert len(zero) == len(one) == len(rows) // 2
        assert not set(zero) & set(one)
        assert sorted(zero + one) == _file_digests(rows)
    assert parts[0]["0"] != parts[0]["1"]  # another order, or another part, each epoch
    assert two_nodes.no_makers_within(30)


@pytest.mark.slow
def test_a_cpu_node_lost_during_a_measurement_fails_it_in_one_line_and_the_next_runs(
    two_nodes: TwoNodes, tiny_imagenet: Path
) -> None:
    """The node holding a Ray Data candidate's actor leaves mid-measurement: its actor's
    bundle has nowhere to go, the measurement ends within its time limit as a one-line
    failure (a trial's process ends the same way: Tune records the error), the
    measurement after it runs, and no actor is left."""
    from raytune_loader.candidates.config import LoaderConfig
    from raytune_loader.measuring.job import TrialJob
    from raytune_loader.tuning.tuner import RayCluster, RayMeasurer

    lost = "raydata_lost_node"
    node = two_nodes.cluster.add_node(num_cpus=1, resources={lost: 1},
                                      object_store_memory=100 * 2**20)  # fmt: skip
    two_nodes.cluster.wait_for_nodes()
    cluster = RayCluster(None, 2.0, 0.0, 0.0, 1, True, TRAINER, remote_cpus=1.0,
                         cpu_node_type=lost)  # fmt: skip
    spec = DatasetSpec("synthetic-imagenet", str(tiny_imagenet), synthetic_images=96)
    long = SegmentSpec(warmup_steps=1, steps=2000, report_every=2000, time_limit_s=15.0)
    job = TrialJob(spec, "small-cnn", long, node_cpus=2.0, samples_per_trial=64)

    def leave() -> None:  # once the actor runs there
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            actor.node_id == node.node_id for actor in two_nodes.makers()
        ):
            time.sleep(0.5)
        two_nodes.cluster.remove_node(node)

    leaving = threading.Thread(target=leave, daemon=True)
    leaving.start()
    measurer = RayMeasurer(cluster, 0.0)
    started = time.monotonic()
    outcome = measurer.measure(job, RayDataConfig(8, map_batch_size=8).candidate())
    took = time.monotonic() - started
    leaving.join()
    assert outcome.failure == "timeout" and "\n" not in (outcome.detail or ""), outcome
    assert (outcome.detail or "").endswith("a node holding its actors' bundles left the cluster")
    assert took < long.give_up_s + 30
    short = replace(job, segment=replace(long, steps=6, report_every=3))
    after = measurer.measure(short, LoaderConfig(8))
    assert after.failure is None and after.metrics is not None
    assert two_nodes.no_makers_within(30)

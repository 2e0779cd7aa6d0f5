"""Hugging Face tables (``--dataset hf``): a save_to_disk folder and a Parquet folder,
read map-style and as a stream, split across workers, in trials, refused up front
when broken, offline."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import Tables
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import DatasetError
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.loaders.shard_stream import StreamVariant
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.measuring.measure import run_trial
from raytune_loader.measuring.prepare import prepare_data
from raytune_loader.sources import hf_tables, source_for
from raytune_loader.sources.datasets import DatasetSpec

SOURCE = hf_tables.SOURCE
SEGMENT = SegmentSpec(warmup_steps=1, steps=4, report_every=2)
RAW = StreamVariant(transfer="uint8", decode="device", shuffle_buffer=16)  # encoded bytes


def _job(root: Path, **fields: object) -> TrialJob:
    values = dict(dataset=DatasetSpec("hf", str(root)), model="small-cnn", segment=SEGMENT,
                  samples_per_trial=48, node_cpus=2)  # fmt: skip
    return TrialJob(**{**values, **fields})  # type: ignore[arg-type]


def _read(samples: object) -> Counter[tuple[bytes, int]]:
    return Counter((bytes(image.numpy()), label) for image, label in samples)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("layout", "buffer"),
    # HF 5 sleeps 5 s at the end of a shuffled Parquet stream: the search's trials read
    # one endless pass; the slow tier's Parquet search shuffles
    [("saved", 16), ("parquet", 0)],
)
def test_map_style_and_stream_read_the_same_images_and_labels(
    tables: Tables, layout: str, buffer: int
) -> None:
    spec = DatasetSpec("hf", str(getattr(tables, layout)))
    rows = SOURCE.build(spec, "uint8", "device")
    stream = SOURCE.build_stream(spec, [], replace(RAW, shuffle_buffer=buffer))
    assert _read(rows[i] for i in range(len(rows))) == _read(stream) == tables.samples
    assert rows.classes == stream.classes == tables.classes  # type: ignore[attr-defined]
    image, label = SOURCE.build(spec)[0]  # the ImageNet training transforms
    assert tuple(image.shape) == (3, 224, 224) and isinstance(label, int)


@pytest.mark.parametrize("workers", ["process", "thread"])
def test_two_loader_workers_read_each_sample_once_a_pass(tables: Tables, workers: str) -> None:
    stream = SOURCE.build_stream(DatasetSpec("hf", str(tables.saved)), [], RAW)
    stream = pickle.loads(pickle.dumps(stream))  # as a worker started by spawn gets it
    config = LoaderConfig(8, 2, 2, access="stream", workers=workers, transfer="uint8",
                          decode="device", in_order=False)  # fmt: skip
    loader = build_dataloader(stream, config, drop_last=False, collate_fn=list)
    assert _read(sample for batch in loader for sample in batch) == tables.samples


@pytest.mark.parametrize("seed", [0, None], ids=["the-search-s-seed", "training-s-no-seed"])
def test_two_ranks_of_two_threads_read_each_sample_once_a_pass(
    tables: Tables, seed: int | None
) -> None:
    """The rank a thread loader carries to its threads, then each thread its whole
    batches of the rank's rows; without a seed (the tuned dataset in training) the
    ranks still draw one shard order, so their shares do not overlap."""
    from raytune_loader.loaders.sharding import as_thread_worker

    spec = DatasetSpec("hf", str(tables.saved))
    read: Counter[tuple[bytes, int]] = Counter()
    for rank in (0, 1):
        stream = SOURCE.build_stream(spec, [], replace(RAW, seed=seed))
        for thread in (0, 1):
            with as_thread_worker(thread, 2, placement=(rank, 2)):
                read += _read(stream)
    assert read == tables.samples


class _Counts:
    """A Progress that keeps what its counts said."""

    def __init__(self) -> None:
        self.counts: list[tuple[int, int]] = []

    def stage(self, text: str) -> None:
        pass

    def count(self, what: str, done: int, total: int) -> None:
        self.counts.append((done, total))

    def trial(self, event: object) -> None:
        pass

    def warn(self, text: str) -> None:
        pass


def test_prepare_data_reads_the_shards_every_trial_reads(tables: Tables) -> None:
    for folder in (tables.saved, tables.parquet):
        progress = _Counts()
        job = prepare_data(_job(folder), 8, progress)  # type: ignore[arg-type]
        # 32 rows a file: 2 hold a trial's 48 samples and give the node's 2 workers one each
        assert (job.stream_shards, job.stream_workers) == (2, 2)
        assert progress.counts[-1] == (2, 2)  # the count ends at the shards read
    progress = _Counts()
    job = prepare_data(_job(tables.parquet, samples_per_trial=80), 8, progress)  # type: ignore[arg-type]
    assert job.stream_shards == 3  # more than the 2 workers need: 80 samples
    assert all(done <= total for done, total in progress.counts) and progress.counts[-1] == (3, 3)


@pytest.mark.parametrize(
    ("layout", "config"),
    [
        ("parquet", LoaderConfig(8, 2, 2, access="map")),
        ("saved", LoaderConfig(8, 2, 2, access="map", workers="thread", decode="tensor")),
        ("saved", LoaderConfig(8, 2, 2, access="stream", transfer="uint8")),
        ("saved", LoaderConfig(8, 2, 2, access="stream", workers="thread", decode="tensor")),
    ],
    ids=["map-processes", "map-threads", "stream-processes", "stream-threads"],
)
def test_a_trial_trains_on_the_table_read_either_way(
    tables: Tables, layout: str, config: LoaderConfig
) -> None:
    prepared = prepare_data(_job(getattr(tables, layout)), 8)
    outcome = run_trial(prepared, config)
    assert outcome.failure is None, outcome.detail
    assert outcome.metrics.samples == 4 * 8 and outcome.metrics.first_batch_s > 0


@pytest.mark.parametrize("access", ["map", "stream"])
def test_the_tuned_dataset_reads_every_row_in_a_training_loop(
    tables: Tables, tmp_path: Path, access: str
) -> None:
    """load_best_config(...).dataset(root): the table, by index or as a stream over every
    shard (shuffled, no repeat), with the tuned pipeline; dataloader(): one epoch."""
    import json

    from raytune_loader import load_best_config
    from raytune_loader.machine.hardware import cpu_and_gpu_summary

    best = {
        "schema_version": 1, "dataset": "hf", "model": "small-cnn", "objective": "util",
        "metrics": {}, "baselines": {}, "speedup": {}, "hardware": cpu_and_gpu_summary(),
        "created": "", "loader": {"batch_size": 8, "num_workers": 2, "prefetch_factor": 2},
        "pipeline": {"transfer": "uint8", "decode": "tensor", "workers": "process",
                     "access": access, "batching": "loader"},
        "source": {"kind": "hf", "shuffle_buffer": 16},
        "search": {"dataset_spec": {"name": "hf", "data_root": "/elsewhere"}},
    }  # fmt: skip
    (tmp_path / "best_config.json").write_text(json.dumps(best))
    tuned = load_best_config(tmp_path / "best_config.json")
    labels = Counter()
    for batch in tuned.dataloader(tuned.dataset(tables.saved)):
        images, targets = tuned.to_device(batch, "cpu")
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 224, 224)
        labels.update(targets.tolist())
    assert labels == Counter(label for _, label in tables.samples.elements())


def test_what_the_source_says_about_itself(tables: Tables) -> None:
    spec = DatasetSpec("hf", str(tables.parquet))
    assert source_for("hf") is SOURCE and SOURCE.accesses(spec) == ("map", "stream")
    assert SOURCE.describe(spec) == {"kind": "hf", "format": "parquet", "shards": 3,
                                     "image_column": "image", "label_column": "label"}  # fmt: skip
    assert SOURCE.describe(DatasetSpec("hf", str(tables.saved)))["format"] == "arrow"
    assert SOURCE.decoders(spec, cuda=False) == ("pil", "tensor")
    assert SOURCE.decoders(spec, cuda=True) == ("pil", "tensor", "device")  # the cells are JPEGs


def _break(tables: Tables, folder: Path, how: str) -> Path:
    import shutil

    import pyarrow.parquet as pq

    shutil.copytree(tables.parquet, folder)
    broken = folder / "part-1.parquet"
    table = pq.read_table(broken)
    if how == "truncated":
        whole = broken.read_bytes()
        broken.write_bytes(whole[: len(whole) // 2])
    elif how == "no image column":
        pq.write_table(table.rename_columns(["img", "label"]), broken)
    elif how == "no label column":
        pq.write_table(table.drop_columns(["label"]), broken)
    else:  # labels as text
        pq.write_table(table.set_column(1, "label", table["label"].cast("string")), broken)
    return folder


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("truncated", r"part-1.parquet is truncated or not a Parquet file \(.*magic bytes"),
        ("no image column", r"part-1.parquet has no column 'image' \(it has img, label\)"),
        ("no label column", r"part-1.parquet has no column 'label' \(it has image\)"),
        ("labels as text", r"column 'label' of .*part-1.parquet holds string, not class indices"),
    ],
)
def test_a_broken_parquet_file_is_named_in_one_line_before_any_trial(
    tables: Tables, tmp_path: Path, how: str, message: str
) -> None:
    folder = _break(tables, tmp_path / "broken", how)
    job = _job(folder, samples_per_trial=96)  # every shard is read
    shard = str(folder / "part-1.parquet")
    for check in (
        lambda: prepare_data(job, 8),
        lambda: SOURCE.build(job.dataset),  # map-style, as a trial or the tuned dataset builds it
        lambda: SOURCE.read_shard(job.dataset, shard),  # a stream's shard, as prepared
    ):
        with pytest.raises(DatasetError, match=message) as caught:
            check()
        assert "\n" not in str(caught.value)


def test_a_truncated_arrow_file_of_a_saved_dataset_is_named_in_one_line(
    tables: Tables, tmp_path: Path
) -> None:
    import shutil

    shutil.copytree(tables.saved, tmp_path / "saved")
    broken = tmp_path / "saved" / "train" / "data-00001-of-00003.arrow"
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 2])
    message = r"data-00001-of-00003.arrow is truncated or not an Arrow file"
    with pytest.raises(DatasetError, match=message) as caught:
        prepare_data(_job(tmp_path / "saved", samples_per_trial=96), 8)
    assert "\n" not in str(caught.value)


def test_a_folder_with_neither_a_saved_dataset_nor_parquet_files_is_one_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "notes.txt").write_text("no table here")
    with pytest.raises(DatasetError, match=r"holds neither a dataset written by save_to_disk"):
        prepare_data(_job(tmp_path), 8)
    with pytest.raises(DatasetError, match=r"a DatasetDict without a train split \(it has test\)"):
        (tmp_path / "dataset_dict.json").write_text('{"splits": ["test"]}')
        prepare_data(_job(tmp_path), 8)


def test_an_image_that_does_not_decode_fails_the_trial_naming_its_row(
    hf_cache: object, tmp_path: Path
) -> None:
    hf = hf_cache
    rows = hf.Dataset.from_dict(  # type: ignore[attr-defined]
        {"image": [{"bytes": b"not a JPEG", "path": f"bad-{i}.jpg"} for i in range(16)],
         "label": [0] * 16},
        features=hf.Features(image=hf.Image(), label=hf.Value("int64")),  # type: ignore[attr-defined]
    )  # fmt: skip
    with hf_tables._quiet(hf):
        rows.save_to_disk(tmp_path / "bad", num_shards=2)
    job = prepare_data(_job(tmp_path / "bad", samples_per_trial=16), 8)  # readable rows
    by_index = run_trial(job, LoaderConfig(8, access="map"))
    assert by_index.failure == "corrupt_sample"
    assert re.search(r"data-0000[01]-of-00002.arrow, row \d+: .*cannot identify", by_index.detail)
    streamed = run_trial(job, LoaderConfig(8, access="stream"))
    assert streamed.failure == "corrupt_sample"
    assert re.search(r"corrupt sample in .*bad \(image bad-\d+.jpg\)", streamed.detail)


def test_the_package_leaves_datasets_alone_and_the_source_reads_offline() -> None:
    """The default command does not import datasets; a process that reads the source
    (a Ray worker too) is offline, whatever its environment said."""
    code = (
        "import os, sys; import raytune_loader.search; assert 'datasets' not in sys.modules; "
        "from raytune_loader.sources import hf_tables; hf = hf_tables._datasets(); "
        "import huggingface_hub.constants as hub; "
        "print(os.environ['HF_HUB_OFFLINE'], os.environ['HF_DATASETS_OFFLINE'], "
        "hf.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE)"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.stdout.split() == ["1", "1", "True", "True"], out.stderr[-2000:]


def test_without_the_datasets_package_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets: ImportError
    with pytest.raises(DatasetError, match=r"needs the datasets package: pip install datasets"):
        SOURCE.build(DatasetSpec("hf", str(tmp_path)))


@pytest.mark.slow
def test_a_ray_worker_reads_the_source_offline(tables: Tables) -> None:
    """A Ray worker started without the offline variables (or with them off) is offline
    once it reads the source, as every trial does."""
    import ray

    from conftest import ray_processes

    def offline_in_a_worker(root: str) -> tuple[str | None, str, bool]:
        import os

        from raytune_loader.sources import hf_tables
        from raytune_loader.sources.datasets import DatasetSpec

        before = os.environ.get("HF_HUB_OFFLINE")
        hf_tables.SOURCE.build(DatasetSpec("hf", root))
        return before, os.environ["HF_HUB_OFFLINE"], sys.modules["datasets"].config.HF_HUB_OFFLINE

    before = ray_processes()
    off = {"HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"}
    ray.init(address="local", num_cpus=1, include_dashboard=False, runtime_env={"env_vars": off})
    try:
        task = ray.remote(offline_in_a_worker).remote(str(tables.saved))
        assert ray.get(task, timeout=120) == ("0", "1", True)
    finally:
        ray.shutdown()
    assert ray_processes() <= before


@pytest.mark.slow
@pytest.mark.long
def test_a_search_on_a_parquet_folder_end_to_end(tables: Tables, tmp_path: Path) -> None:
    """The command line on Parquet files: map-style and stream both candidates, the
    JSON's source says what the table is and the pipeline how the winner reads it."""
    import csv
    import json

    from conftest import TINY_SEARCH, ray_processes, run_cli

    before = ray_processes()
    args = [a for a in TINY_SEARCH if a not in ("--dataset", "synthetic-imagenet",
                                                "--synthetic-images", "96")]  # fmt: skip
    result = run_cli(
        *args, "--dataset", "hf", "--data-root", str(tables.parquet), "--num-samples", "4",
        "--verify-repeats", "1", "--samples-per-trial", "48", "--out", str(tmp_path / "out"),
        "--shuffle-buffer", "0",  # a shuffled Parquet stream sleeps 5 s at each pass's end
        cwd=tmp_path, env={"HF_DATASETS_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    folder = tmp_path / "out" / "hf"
    best = json.loads((folder / "best_config.json").read_text())
    assert best["source"]["kind"] == "hf" and best["source"]["format"] == "parquet"
    assert best["source"]["shards"] == 3 and best["source"]["image_column"] == "image"
    assert best["pipeline"]["access"] in ("map", "stream")
    with open(folder / "trials.csv") as handle:
        rows = list(csv.DictReader(handle))
    proposed = {r["access"] for r in rows}
    assert proposed <= {"map", "stream"} and "map" in proposed  # the baselines read by index
    assert all(r["status"] in ("ok", "stopped_early") for r in rows), [r["reason"] for r in rows]
    assert ray_processes() <= before

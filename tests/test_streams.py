"""Streams (IterableDatasets) in the search: the shards every trial reads, the bound on
workers they set, a user's stream that does not split, what is refused up front."""

from __future__ import annotations

import io
import itertools
import tarfile
from pathlib import Path

import pytest
import torch

from conftest import write_shards
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import DatasetError
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.measuring.measure import run_trial
from raytune_loader.measuring.prepare import prepare_data
from raytune_loader.measuring.shards import splits_across_workers, trial_shards
from raytune_loader.progress import LogProgress
from raytune_loader.sources.datasets import DatasetSpec
from raytune_loader.tuning.bounds import search_space
from raytune_loader.tuning.options import SearchOptions

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


def test_the_input_alone_times_one_core_on_the_stream_without_its_buffer(
    tiny_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The input pipeline alone ends with one core's worker side: read through the
    stream's shuffle buffer, that filled it first (a single reader fetching every shard
    of a bucket's, seconds of the phase); what a sample costs does not depend on it.
    The windows before it read the stream as the trial does, buffer and all."""
    from raytune_loader.measuring import measure

    timed: list[int] = []
    real = measure.worker_side_rate

    def spied(dataset: object, *args: object) -> float:
        timed.append(getattr(dataset, "shuffle_buffer", -1))
        return real(dataset, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(measure, "worker_side_rate", spied)
    job = prepare_data(_job("webdataset", str(tiny_shards)), 8)
    config = LoaderConfig(8, 0, access="stream")
    found = measure.measure_input(job, config, windows=1)
    assert timed == [0] and found.per_core > 0 and found.samples_per_s > 0
    assert measure.prepare(job, 0, config)[0].shuffle_buffer > 0  # the windows' stream


def test_threads_and_processes_each_read_their_own_shards_of_a_stream(tiny_shards: Path) -> None:
    from raytune_loader.loaders.loader import build_dataloader
    from raytune_loader.loaders.shard_stream import StreamVariant

    spec = DatasetSpec("webdataset", str(tiny_shards))
    for workers in ("process", "thread"):
        stream = spec.source.build_stream(spec, [], StreamVariant(shuffle_buffer=0))
        config = LoaderConfig(8, 2, 2, access="stream", workers=workers, in_order=False)
        labels = [int(x) for _, batch in build_dataloader(stream, config, drop_last=False)
                  for x in batch]  # fmt: skip
        assert len(labels) == 96, workers  # every sample once: no worker read another's shard


def test_a_user_stream_that_does_not_split_is_found_and_kept_to_one_worker() -> None:
    from raytune_loader.loaders.shard_stream import StreamVariant
    from raytune_loader.sources import source_for

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
    from raytune_loader.machine.hardware import cpu_and_gpu_summary

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


# The tuned loader over a stream: overrides honoured or refused, state, accelerate.
# The shards: conftest's uneven_shards (20, 20 and 4 samples; a sample's class is its
# index), read with tensor decoding, a buffer of 8.

RAW = "uint8"


def _stream(root: Path, fmt: str = "wds", batch_size: int | None = None) -> object:
    from raytune_loader.loaders.shard_stream import StreamVariant

    spec = DatasetSpec("webdataset" if fmt == "wds" else "hf", str(root / fmt))
    variant = StreamVariant(transfer=RAW, decode="tensor", shuffle_buffer=8, batch_size=batch_size)
    return spec.source.build_stream(spec, [], variant)


def _config(workers: str = "process", batching: str = "loader", **fields: object) -> LoaderConfig:
    values = dict(batch_size=4, num_workers=2, prefetch_factor=2, access="stream",
                  batching=batching, workers=workers, transfer=RAW, decode="tensor",
                  in_order=False)  # fmt: skip
    return LoaderConfig(**{**values, **fields})  # type: ignore[arg-type]


def _labels(loader: object) -> list[list[int]]:
    return [[int(x) for x in batch[1]] for batch in loader]  # type: ignore[attr-defined]


def _tagged(samples: list) -> tuple:
    return ("mine", torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples]))


_INIT: list[int] = []


def _mine(worker_id: int) -> None:
    _INIT.append(worker_id)


def _reports_init(samples: list) -> tuple:
    from raytune_loader.loaders import sharding

    return list(_INIT), sharding._carried, torch.tensor([s[1] for s in samples])


@pytest.mark.parametrize("fmt", ["wds", "parquet"])
def test_a_stream_takes_the_loader_s_overrides(uneven_shards: Path, fmt: str) -> None:
    from raytune_loader.loaders.loader import build_dataloader

    every = list(range(44))
    in_workers = _stream(uneven_shards, fmt, batch_size=4)
    batches = _labels(build_dataloader(in_workers, _config(batching="workers"), drop_last=False,
                                       batch_size=3))  # fmt: skip
    assert sorted(map(len, batches)) == [2] + [3] * 14  # batched in the workers, by 3
    assert sorted(x for b in batches for x in b) == every
    plain = _stream(uneven_shards, fmt)
    for stream, config in ((in_workers, _config(batching="workers")), (plain, _config())):
        made = list(build_dataloader(stream, config, drop_last=False, collate_fn=_tagged))
        assert {batch[0] for batch in made} == {"mine"}  # in the workers, or by the loader
    cut = _labels(build_dataloader(plain, _config(), drop_last=True, batch_size=5))
    assert len(cut) == 8 and {len(b) for b in cut} == {5}  # 40 of 44: less than one batch
    for workers in (0, 3):
        read = _labels(build_dataloader(plain, _config(num_workers=workers, prefetch_factor=None
                                                       if workers == 0 else 2,
                                                       in_order=workers == 0)))  # fmt: skip
        assert sorted(x for b in read for x in b) == every, workers
    threads = build_dataloader(plain, _config("thread", num_workers=2), drop_last=False)
    assert sorted(x for b in _labels(threads) for x in b) == every
    timed_out = build_dataloader(plain, _config(), drop_last=False, timeout=60)  # a TypeError
    assert sorted(x for b in _labels(timed_out) for x in b) == every  # before: passed twice
    fixed = build_dataloader(plain, _config(in_order=True), drop_last=False, shuffle=False)
    assert _labels(fixed) == _labels(fixed) == [[0, 1, 2, 3], [24, 25, 26, 27], *_labels(fixed)[2:]]
    # the same seed draws the same batches every run (a stream each: loaders over one
    # stream share its epoch); another seed, others
    seeded = [
        sorted(_labels(build_dataloader(_stream(uneven_shards, fmt), _config(), seed=seed)))
        for seed in (1, 1, 2)
    ]
    assert seeded[0] == seeded[1] != seeded[2]


def test_worker_init_fn_runs_after_the_tool_s_own_where_lightning_sets_it(
    uneven_shards: Path,
) -> None:
    """The user's worker_init_fn, or Lightning's seeding (set on the loader as
    Lightning does when it finds none), runs in every worker after the tool's own
    (the rank carried, the thread pools of worker_threads held)."""
    from raytune_loader.loaders.loader import build_dataloader

    config = _config(worker_threads=1)
    loader = build_dataloader(_stream(uneven_shards), config, collate_fn=_reports_init)
    assert loader.worker_init_fn is None  # so Lightning adds its rank-aware seeding
    loader.worker_init_fn = _mine  # what Lightning's _auto_add_worker_init_fn does
    seen = {(tuple(init), carried) for init, carried, _ in loader}
    assert seen == {((0,), (0, 1)), ((1,), (0, 1))}  # each worker its own, after the rank


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda s: dict(config=_config("thread"), worker_init_fn=_mine),
         "thread workers run in the training process and take no worker_init_fn"),
        (lambda s: dict(config=_config("thread"), generator=torch.Generator()),
         "take no generator"),
        (lambda s: dict(config=_config(), sampler=[0, 1]), "it takes no sampler"),
    ],
    ids=["threads-worker-init", "threads-generator", "sampler"],
)  # fmt: skip
def test_what_a_stream_loader_cannot_take_is_refused_in_one_line(
    uneven_shards: Path, build: object, message: str
) -> None:
    from raytune_loader.errors import ConfigError
    from raytune_loader.loaders.loader import build_dataloader

    stream = _stream(uneven_shards)
    kwargs = build(stream)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=message) as caught:
        build_dataloader(stream, kwargs.pop("config"), **kwargs)
    assert "\n" not in str(caught.value)


def test_a_stream_of_the_user_s_that_batches_itself_refuses_the_loader_s_batching() -> None:
    from raytune_loader.errors import ConfigError
    from raytune_loader.loaders.loader import build_dataloader
    from raytune_loader.loaders.shard_stream import StreamVariant
    from raytune_loader.sources import source_for

    spec = DatasetSpec("datasets_for_tests:stream_that_splits")
    stream = source_for(spec.name).build_stream(spec, [], StreamVariant())
    config = LoaderConfig(4, 2, 2, access="stream", batching="workers")
    with pytest.raises(ConfigError, match="makes its batches itself: .* batch_size") as caught:
        build_dataloader(stream, config, batch_size=8)
    assert "\n" not in str(caught.value)


def test_a_tuned_stream_read_by_a_loader_the_tool_did_not_build_says_so(
    uneven_shards: Path,
) -> None:
    """A worker cannot know its rank unless the tuned loader carried it: a DataLoader
    of one's own (or accelerate's skip_first_batches, which builds one) is refused."""
    from raytune_loader.errors import ConfigError

    own = torch.utils.data.DataLoader(_stream(uneven_shards), batch_size=4, num_workers=1)
    with pytest.raises(ConfigError, match=r"iterate tuned.dataloader\(stream\) itself"):
        next(iter(own))


@pytest.mark.parametrize("workers", ["process", "thread"])
def test_a_resumed_stream_epoch_reads_what_the_stopped_run_did_not(
    uneven_shards: Path, workers: str
) -> None:
    from raytune_loader.errors import ConfigError
    from raytune_loader.loaders.loader import build_dataloader

    config = _config(workers)
    loader = build_dataloader(_stream(uneven_shards, "parquet"), config, drop_last=False)
    loader.sampler.set_epoch(3)
    batches = iter(loader)
    before = [int(x) for _ in range(5) for x in next(batches)[1]]
    state = loader.state_dict()
    del batches
    assert state["epoch"] == 3 and sum(state["batches"]) == 5 and state["workers"] == 2
    again = build_dataloader(_stream(uneven_shards, "parquet"), config, drop_last=False)
    again.load_state_dict(state)
    after = [int(x) for batch in again for x in batch[1]]
    assert sorted(before + after) == list(range(44)) and not set(before) & set(after)
    other = build_dataloader(_stream(uneven_shards, "parquet"), config, num_workers=3)
    with pytest.raises(ConfigError, match="saved mid-epoch .*workers 2 then, 3 now") as caught:
        other.load_state_dict(state)
    assert "\n" not in str(caught.value)


def test_accelerate_passes_a_stream_loader_through_and_refuses_to_skip_into_it(
    uneven_shards: Path,
) -> None:
    """accelerator.prepare would split the stream's batches across ranks again (or read
    them on rank 0 only): the tuned loader is not a DataLoader, so it passes through.
    skip_first_batches builds a DataLoader of its own over the stream: refused; resume
    with the loader's load_state_dict."""
    from accelerate import Accelerator

    from raytune_loader.errors import ConfigError
    from raytune_loader.loaders.loader import build_dataloader

    accelerator = Accelerator(cpu=True)
    for workers in ("process", "thread"):
        loader = build_dataloader(_stream(uneven_shards), _config(workers), drop_last=False)
        assert accelerator.prepare(loader) is loader
    skipping = accelerator.skip_first_batches(loader, 2)
    with pytest.raises(ConfigError, match="tuned.dataloader"):
        list(skipping)


def _user_streams_in_a_group(rank: int, store: str, shards: str, results: object) -> None:
    import os

    from conftest import gloo_group
    from datasets_for_tests import RankStream
    from raytune_loader.errors import ConfigError
    from raytune_loader.loaders.loader import build_dataloader

    with gloo_group(rank, store, results):
        os.environ["RANK"] = str(rank)  # as torchrun sets it, for the spawned workers below
        out: dict[str, object] = {}
        config = LoaderConfig(4, access="stream")
        loader = build_dataloader(RankStream((10, 7), 8), config, drop_last=False)
        out["len"] = len(loader)
        out["read"] = [_labels(loader) for _ in range(2)]  # rank 1 runs out: it repeats
        # from a fork server: a worker forked from a process holding gloo's threads
        # aborted at exit (SIGABRT, 1 run in many), as fork after threads may, and so did
        # a spawned one ("terminate called without an active exception": a spawned
        # process ends through the interpreter's exit, which runs C++'s static
        # destructors; a fork server's child ends in os._exit, as a forked one does)
        served = LoaderConfig(4, 2, 2, access="stream", multiprocessing_context="forkserver")
        processes = build_dataloader(RankStream((10, 7), 8), served)
        out["processes"] = [len(b) for b in _labels(processes)]
        for name, build in (
            ("no length", lambda: build_dataloader(RankStream((10, 7), None), config)),
            ("one shard", lambda: build_dataloader(_stream(Path(shards)), _config())),
        ):  # fmt: skip
            try:
                build()
            except ConfigError as exc:
                out[name] = str(exc)
        results.put((rank, out))  # type: ignore[attr-defined]


@pytest.mark.slow  # a process group of ranks: minutes of the fast tier's CPU
def test_in_a_process_group_every_rank_reads_as_many_batches_or_is_refused(
    tmp_path: Path, tiny_imagenet: Path
) -> None:
    """Two gloo ranks: a user's stream with a length is cut to as many batches on both
    ranks (the shorter one repeating); one without a length, and shards fewer than the
    ranks, are refused when the loader is built."""
    from conftest import two_gloo_ranks, write_uneven_shards

    write_uneven_shards(tiny_imagenet / "train", tmp_path, sizes=(6,))
    read = two_gloo_ranks(_user_streams_in_a_group, str(tmp_path))
    for rank in (0, 1):
        got = read[rank]
        assert got["len"] == 2 and [len(e) for e in got["read"]] == [2, 2]
        assert got["processes"] == [4, 4]
        assert "without a length, read by 2 ranks" in got["no length"]
        assert "the stream has 1 shards for 2 ranks" in got["one shard"]
    assert {x // 1000 for epoch in read[1]["read"] for b in epoch for x in b} == {1}
    assert sorted(x for b in read[1]["read"][0] for x in b) == [1000, 1000, *range(1001, 1007)]


class _LoggedReads:
    """Shards of 8 samples; each shard's read logged at the sample count yielded so far."""

    def __init__(self, yielded: list[int]) -> None:
        self.yielded, self.started = yielded, []

    def count(self, path: str) -> int:
        return 8

    def read(self, path: str, start: int, stop: int):  # noqa: ANN201
        self.started.append(self.yielded[0])
        yield from ((path, i) for i in range(start, stop))

    def ray_reader(self, paths: object) -> None:
        return None


def test_a_trial_s_stream_reads_at_a_steady_pace_behind_a_buffer_larger_than_its_shards() -> None:
    """A trial's shards (4 of 8 samples) behind a shuffle buffer of 100: the buffer holds
    at most the 32 samples of an epoch, and once it is full a shard is read every 8
    samples taken out, as in a long training epoch; a buffer refilled each pass would
    read all 4 shards, then hand out 32 without a read (a window there sees no fetch:
    from a store, a rate with no request in it)."""
    from raytune_loader.loaders.shard_stream import ShardStream

    yielded = [0]
    reader = _LoggedReads(yielded)
    stream = ShardStream([f"s{i}" for i in range(4)], [8] * 4, reader, lambda sample: sample,
                         shuffle_buffer=100, repeat=True)  # fmt: skip
    items = iter(stream)
    for _ in range(300):
        next(items)
        yielded[0] += 1
    assert reader.started.count(0) == 5  # 32 held, and the one that pushes out the first
    steady = [r for r in reader.started if r > 0]  # after the first sample: the buffer is full
    gaps = [b - a for a, b in itertools.pairwise(steady)]
    assert len(steady) >= 300 // 8 - 1 and max(gaps) <= 8, gaps

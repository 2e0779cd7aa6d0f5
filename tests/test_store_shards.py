"""WebDataset shards in an object store: a real S3 API on loopback (moto's server behind
the tests' proxy, tests/s3_for_tests.py). The seams: a brace pattern and a prefix name
the same shards, a missing one is named, an epoch reads every sample once and as the
local shards give it, read-ahead puts shards in flight together, every GET is counted."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from s3_for_tests import S3Server, environment

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import DatasetError
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.loaders.shard_stream import StreamVariant
from raytune_loader.sources import store_shards, webdataset_shards
from raytune_loader.sources.datasets import DatasetSpec
from raytune_loader.stores import probe
from raytune_loader.stores.kept import kept as kept_objects
from raytune_loader.stores.store import count_requests

pytest.importorskip("botocore")
pytest.importorskip("moto")
pytest.importorskip("webdataset")

BUCKET = "shards-bucket"
PATTERN = f"s3://{BUCKET}/wds/shard-{{0000..0003}}.tar"


@pytest.fixture(scope="module")
def server(tiny_shards: Path) -> Iterator[S3Server]:
    """The S3 server holding tiny_shards' 4 shards (24 samples each) under ``wds/``."""
    with S3Server() as found:
        found.upload_folder(tiny_shards, BUCKET, "wds")
        with environment(found.env()):
            yield found


@pytest.fixture(autouse=True)
def _fresh(server: S3Server) -> None:
    server.reset()


def _spec(root: str = PATTERN) -> DatasetSpec:
    return DatasetSpec("webdataset", root)


def _stream(root: str, shards: list[str] | None = None, batch_size: int | None = None) -> object:
    spec = _spec(root)
    variant = StreamVariant(transfer="uint8", decode="tensor", batch_size=batch_size)
    return spec.source.build_stream(spec, shards or spec.source.shards(spec), variant)


def test_a_pattern_and_a_prefix_name_the_same_shards_and_a_missing_one_is_named(
    server: S3Server,
) -> None:
    source = webdataset_shards.SOURCE
    requests = server.proxy.requests
    named = source.shards(_spec())
    assert server.proxy.requests == requests  # a pattern is expanded without a request
    assert named == [f"s3://{BUCKET}/wds/shard-{i:04d}.tar" for i in range(4)]
    assert source.shards(_spec(f"s3://{BUCKET}/wds")) == named  # the prefix, listed
    info = source.read_shard(_spec(), named[1])
    assert (info.samples, info.bytes) == (24, server.client().head_object(
        Bucket=BUCKET, Key="wds/shard-0001.tar")["ContentLength"])  # fmt: skip
    too_many = f"s3://{BUCKET}/wds/shard-{{0000..0005}}.tar"
    with pytest.raises(DatasetError, match=r"shard s3://shards-bucket/wds/shard-0004.tar does "):
        source.read_shard(_spec(too_many), source.shards(_spec(too_many))[4])
    with pytest.raises(DatasetError, match=f"s3://{BUCKET}/elsewhere holds no object"):
        source.shards(_spec(f"s3://{BUCKET}/elsewhere"))
    server.client().put_object(Bucket=BUCKET, Key="notes/readme.txt", Body=b"no shard")
    with pytest.raises(DatasetError, match=f"s3://{BUCKET}/notes holds no .tar object"):
        source.shards(_spec(f"s3://{BUCKET}/notes"))
    assert source.fetches(_spec()) and source.ray_data_reads(_spec())  # Arrow's S3 client
    assert store_shards.expand_braces("s3://b/x-{1..010}.tar")[:2] == [  # as braceexpand
        "s3://b/x-001.tar", "s3://b/x-002.tar"]  # fmt: skip
    assert store_shards.expand_braces("s3://b/{a,{b,c}}.tar") == [
        "s3://b/a.tar", "s3://b/b.tar", "s3://b/c.tar"]  # fmt: skip
    assert source.describe(_spec())["store"]["bucket"] == BUCKET


def test_an_epoch_reads_every_sample_once_as_the_local_shards_give_it(
    server: S3Server, tiny_shards: Path
) -> None:
    proxy = server.proxy
    proxy.throttle, proxy.cut = 0.4, 0.3  # 4 shards' GETs: enough to be retried
    local = _stream(str(tiny_shards / "shard-{0000..0003}.tar"))
    remote = _stream(PATTERN)  # each shard's samples counted here, a GET each
    gets, throttled, cuts = proxy.gets, proxy.throttled, proxy.cuts
    counts = count_requests(remote)
    assert counts is not None, "the stream's store is where the measurement counts"
    config = LoaderConfig.from_dict(
        {"num_workers": 2, "fetch_threads": 2, "access": "stream"}, batch_size=8
    )
    epochs = {}
    for name, stream in (("local", local), ("remote", remote)):
        loader = build_dataloader(stream, config, seed=1, drop_last=False)
        epochs[name] = torch.cat([labels for _, labels in loader]).tolist()
    assert epochs["remote"] == epochs["local"] and len(epochs["local"]) == 96  # each once
    totals = counts.totals()  # the workers' GETs, their retries by cause
    retried = (proxy.throttled - throttled) + (proxy.cuts - cuts)
    assert totals["requests"] == proxy.gets - gets - retried >= 4  # a span's shard a GET
    assert totals["throttled"] == proxy.throttled - throttled
    assert totals["reset"] == proxy.cuts - cuts
    assert retried > 0


def test_read_ahead_puts_a_worker_s_shards_in_flight_together(server: S3Server) -> None:
    server.proxy.ttfb_s = 0.05
    peaks = {}
    for ahead in (1, 4):
        stream = _stream(PATTERN)  # its shards counted (4 GETs at once) before the reads
        server.proxy.peak_in_flight = 0
        config = LoaderConfig.from_dict(
            {"num_workers": 0, "fetch_threads": ahead, "access": "stream"}, batch_size=8
        )
        loader = build_dataloader(stream, config, seed=0)
        assert len(torch.cat([labels for _, labels in loader])) == 96
        peaks[ahead] = server.proxy.peak_in_flight
    assert peaks == {1: 1, 4: 4}
    # read-ahead is per worker, thread workers' too: each of two threads of one process
    # keeps its own 2 shards in flight, not 2 between them
    stream = _stream(PATTERN)
    server.proxy.peak_in_flight = 0
    config = LoaderConfig.from_dict(
        {"num_workers": 2, "workers": "thread", "fetch_threads": 2, "access": "stream"},
        batch_size=8,
    )
    assert len(torch.cat([y for _, y in build_dataloader(stream, config, seed=0)])) == 96
    assert server.proxy.peak_in_flight == 4
    # a trial's stream (repeating 2 shards): the read-ahead runs on across its epochs
    spec = _spec()
    shards = spec.source.shards(spec)[:2]
    trial = spec.source.build_stream(spec, shards, StreamVariant("uint8", "tensor", repeat=True))
    trial.fetch_threads = 4
    server.proxy.peak_in_flight = 0
    items = iter(trial)
    for _ in range(24 * 5):  # five passes over the two shards
        next(items)
    assert server.proxy.peak_in_flight == 4


def test_two_streams_read_in_turn_in_one_thread_keep_their_own_read_ahead(
    server: S3Server,
) -> None:
    """A training stream and a validation stream read in turn in one thread (no workers),
    with 2 and 4 shards ahead: each keeps its pool (asking for another size does not
    close the first), and each reads its every sample."""
    train, check = _stream(PATTERN), _stream(PATTERN)
    train.fetch_threads, check.fetch_threads = 2, 4
    read = {"train": 0, "check": 0}
    for first, second in zip(iter(train), iter(check), strict=True):
        read["train"] += first is not None
        read["check"] += second is not None
    assert read == {"train": 96, "check": 96}


def test_a_stream_s_profile_counts_a_shard_s_get_over_its_samples(server: S3Server) -> None:
    """The cost model's latency term for a stream: one GET for a shard's 24 samples."""
    from raytune_loader.measuring.profile import _worker_side
    from raytune_loader.sources.remote_folder import keys_of

    server.proxy.ttfb_s = 0.03
    stream = _stream(PATTERN)
    rate, request_s, per_sample = _worker_side(stream)
    assert request_s >= 0.03  # a shard's GET waits for its first byte at least
    assert per_sample == pytest.approx(4 / 96)  # the shards' GETs over their samples,
    # though the 32 timed samples took 1 or 2 of them
    assert rate > 0
    assert keys_of(stream) == [f"wds/shard-{i:04d}.tar" for i in range(4)]


def test_a_batched_stream_s_profile_divides_by_the_samples_it_read(server: S3Server) -> None:
    """Batches of 24 made in the stream: the profile asks for 32 samples and reads 48
    (two batches), and its figures are of the 48: a GET a shard of 24."""
    from raytune_loader.measuring.measure import worker_side_read
    from raytune_loader.measuring.profile import SAMPLES, _worker_side

    spec = _spec()
    variant = StreamVariant("uint8", "tensor", batch_size=24, repeat=True)
    stream = spec.source.build_stream(spec, spec.source.shards(spec), variant)
    assert SAMPLES % 24, "the test needs a batch that does not divide the timed samples"
    assert worker_side_read(stream, SAMPLES)[0] == 48
    _, _, per_sample = _worker_side(stream)
    assert per_sample == pytest.approx(2 / 48)


def test_the_profile_s_untimed_samples_of_a_stream_skip_its_shuffle_buffer(
    server: S3Server,
) -> None:
    """Filling a stream's shuffle buffer reads every shard (and again, the stream
    repeating): the profile's untimed samples (collated, finished, handed over) come from
    the stream without it, a shard's GET, where a 5 MB shard's took 0.4 s each time. The
    stream without it is a copy: the trial's own keeps its buffer."""
    from raytune_loader.measuring import profile
    from raytune_loader.measuring.job import SegmentSpec, TrialJob
    from raytune_loader.measuring.shards import unbuffered

    spec = DatasetSpec("webdataset", PATTERN, shuffle_buffer=1000)
    job = TrialJob(dataset=spec, model="small-cnn", segment=SegmentSpec(1, 4, 2),
                   samples_per_trial=48, node_cpus=2, stream_shards=4)  # fmt: skip
    config = LoaderConfig.from_dict({"num_workers": 2, "access": "stream"}, batch_size=8)
    buffered, checked = profile.prepare(job, 0, config, check=False)  # the shards counted
    assert checked == 0  # unchecked: no sample read
    gets = server.proxy.gets
    samples = profile._samples(unbuffered(buffered), 8, config)
    assert len(samples) == 8 and server.proxy.gets - gets == 1
    assert buffered.shuffle_buffer == 1000 and buffered.shuffle
    gets = server.proxy.gets
    assert len(profile._samples(buffered, 8, config)) == 8
    assert server.proxy.gets - gets >= 4  # with the buffer: every shard first


def test_the_ceiling_s_resident_batch_skips_a_stream_s_shuffle_buffer(server: S3Server) -> None:
    """The ceiling trains on one batch of the data's shape: it reads it from the stream
    without its shuffle buffer, a shard's GET, where filling the buffer read every shard
    first (a bucket's 8 shards of 5 MB: 5 of an 11.5 s ceiling)."""
    from raytune_loader.measuring import profile
    from raytune_loader.measuring.job import SegmentSpec, TrialJob
    from raytune_loader.measuring.measure import measure_ceiling

    spec = DatasetSpec("webdataset", PATTERN, shuffle_buffer=1000)
    job = TrialJob(dataset=spec, model="small-cnn", segment=SegmentSpec(1, 4, 2),
                   samples_per_trial=48, node_cpus=2, stream_shards=4)  # fmt: skip
    config = LoaderConfig.from_dict({"access": "stream"}, batch_size=8)
    profile.prepare(job, 0, config, check=False)  # the shards counted, as the driver had
    gets = server.proxy.gets
    size, rate = measure_ceiling(job, 8, windows=1)
    assert size == 8 and rate > 0
    # the first shard twice: to check a sample, then for the batch; the buffer read all 4
    assert server.proxy.gets - gets == 2


def test_the_profile_reads_a_stream_s_first_shards_not_its_shuffle_buffer(
    server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream with a shuffle buffer of 1000 over 96 samples: filling it read every
    shard again and again (a 5 MB shard's GET took 0.4 s, 38 s of a 62 s profile). The
    profile reads the stream without it: the first structure's worker side fetches
    shards 0 and 1 and times their GETs; the profile keeps them, and every structure's
    untimed samples and the other structures' worker sides read them kept, taking the
    first's GET figures. (The store's own probes, which cycle every key, are left out of
    the count.)"""
    from raytune_loader.measuring import profile
    from raytune_loader.measuring.job import SegmentSpec, TrialJob

    monkeypatch.setattr(profile, "top_rate", lambda store, keys, per_thread, enough: 100.0)
    monkeypatch.setattr(profile, "latency", lambda store, keys, served: None)
    server.proxy.ttfb_s = 0.03
    spec = DatasetSpec("webdataset", PATTERN, shuffle_buffer=1000)
    job = TrialJob(dataset=spec, model="small-cnn", segment=SegmentSpec(1, 4, 2),
                   samples_per_trial=48, node_cpus=2, stream_shards=4)  # fmt: skip
    structures = (("pil", "float32"), ("tensor", "float32"), ("pil", "uint8"))
    configs = [LoaderConfig.from_dict({"num_workers": 2, "access": "stream", "decode": d,
                                       "transfer": t}, batch_size=8)
               for d, t in structures]  # fmt: skip
    profile.prepare(job, 0, configs[0], check=False)  # the shards counted, as the driver had
    gets = server.proxy.gets
    found = profile.profile(job, configs, 2)
    # the first worker side: shards 0 and 1; nothing after it
    assert server.proxy.gets - gets == 2
    assert found.fetch_s >= 0.03 and found.requests_per_sample == pytest.approx(4 / 96)
    assert len(found.per_core) == 3 and all(rate > 0 for rate in found.per_core.values())


def test_a_worker_side_that_made_no_get_takes_the_first_one_s_get_figures(
    server: S3Server,
) -> None:
    """Read again on the shards kept, a stream's worker side makes no GET and takes the
    GET figures of the first, which timed them (its request's seconds, from the proxy's
    first byte); outside the block, the same read fetches and times its own."""
    from raytune_loader.measuring import profile
    from raytune_loader.measuring.job import SegmentSpec, TrialJob
    from raytune_loader.measuring.shards import unbuffered

    server.proxy.ttfb_s = 0.05
    job = TrialJob(dataset=DatasetSpec("webdataset", PATTERN), model="small-cnn",
                   segment=SegmentSpec(1, 4, 2), samples_per_trial=48, node_cpus=2,
                   stream_shards=4)  # fmt: skip
    config = LoaderConfig.from_dict({"num_workers": 2, "access": "stream"}, batch_size=8)
    stream = unbuffered(profile.prepare(job, 0, config, check=False)[0])
    gets, kept = profile.Gets(), {}
    with kept_objects(kept):
        rate, request_s, per_sample = profile._stream_side(stream, count_requests(stream), gets)
        assert gets.request_s == request_s >= 0.05 and gets.cpu_s is not None
        fetched = server.proxy.gets
        again = profile._stream_side(stream, count_requests(stream), gets)
    assert server.proxy.gets == fetched and len(kept) == 2  # shards 0 and 1, kept
    assert again[1:] == (request_s, per_sample) and again[0] > 0
    other = profile._stream_side(stream, count_requests(stream), profile.Gets())
    assert server.proxy.gets == fetched + 2 and other[1] >= 0.05  # its own, outside


def test_a_measurement_checks_a_stream_s_first_sample_without_filling_its_buffer(
    server: S3Server, tiny_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every trial, verification run and ceiling checks its first sample (its bytes, and
    that it decodes): with a shuffle buffer of 1000 that read all four shards first (3-4 s
    of a 7.5 s trial on a bucket's 5 MB shards); from the stream without it, the first
    shard's first bytes, one ranged GET. A process checks a variant's first shard once:
    the next measurement of it in a reused process makes no GET before its segment;
    another variant's, one."""
    from raytune_loader.measuring import measure
    from raytune_loader.measuring.job import SegmentSpec, TrialJob

    shard_bytes = (tiny_shards / "shard-0000.tar").stat().st_size
    monkeypatch.setattr(store_shards, "HEAD_BYTES", shard_bytes // 3)  # a few samples' worth
    spec = DatasetSpec("webdataset", PATTERN, shuffle_buffer=1000)
    job = TrialJob(dataset=spec, model="small-cnn", segment=SegmentSpec(1, 4, 2),
                   samples_per_trial=48, node_cpus=2, stream_shards=4)  # fmt: skip
    config = LoaderConfig.from_dict({"num_workers": 2, "access": "stream"}, batch_size=8)
    measure.prepare(job, 0, config, check=False)  # the shards counted, as the driver had
    measure._CHECKED.clear()  # this process's earlier tests checked the same shards
    gets, sent = server.proxy.gets, server.proxy.sent
    stream, nbytes = measure.prepare(job, 0, config)
    assert server.proxy.gets - gets == 1
    assert server.proxy.sent - sent == shard_bytes // 3  # not the whole shard
    assert nbytes == 3 * 224 * 224 * 4 + 8  # a float32 image and its int64 class
    assert stream.shuffle_buffer == 1000  # the trial's own stream keeps its buffer
    assert measure.prepare(job, 0, config)[1] == nbytes and server.proxy.gets - gets == 1
    uint8 = LoaderConfig.from_dict({"num_workers": 2, "access": "stream", "transfer": "uint8"},
                                   batch_size=8)  # fmt: skip
    assert measure.prepare(job, 0, uint8)[1] == 3 * 224 * 224 + 8
    assert server.proxy.gets - gets == 2


def test_the_device_decoder_is_offered_from_the_first_shard_s_first_bytes(
    server: S3Server, tiny_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU, whether the images are JPEGs (which nvjpeg decodes on the device) is
    read from the first sample of the first shard: from a bucket, one ranged GET of its
    first bytes, not the whole shard."""
    shard_bytes = (tiny_shards / "shard-0000.tar").stat().st_size
    monkeypatch.setattr(store_shards, "HEAD_BYTES", shard_bytes // 3)
    spec = DatasetSpec("webdataset", PATTERN)
    assert spec.source.decoders(spec, cuda=False) == ("pil", "tensor")
    gets, sent = server.proxy.gets, server.proxy.sent
    assert spec.source.decoders(spec, cuda=True) == ("pil", "tensor", "device")
    assert (server.proxy.gets - gets, server.proxy.sent - sent) == (1, shard_bytes // 3)


def _first_shard(tiny_shards: Path) -> tuple[str, Any, list[dict[str, Any]], int]:
    """The bucket's first shard: its URL, a reader of it from the bucket, its 24 samples
    as its whole GET gives them, and its bytes."""
    from raytune_loader.stores.store import Store
    from raytune_loader.stores.url import parse

    url = f"s3://{BUCKET}/wds/shard-0000.tar"
    reader = webdataset_shards._TarShards(Store(parse(f"s3://{BUCKET}/wds")))
    return (
        url,
        reader,
        list(reader.read(url, 0, 24)),
        (tiny_shards / "shard-0000.tar").stat().st_size,
    )


def test_a_shard_s_head_grows_until_its_samples_are_whole_and_ends_with_the_shard(
    server: S3Server, tiny_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check reads a shard from ranged GETs of its first bytes: a range that cuts a
    sample in a header or in its data gives it only once a larger one holds it whole;
    read on, the ranges grow fourfold up to the whole shard, and the samples come once
    each, in the shard's order, as its whole GET gives them."""
    import tarfile

    url, reader, whole, shard_bytes = _first_shard(tiny_shards)
    with tarfile.open(tiny_shards / "shard-0000.tar") as tar:
        members = tar.getmembers()
    second = next(m for m in members if m.name.split(".")[0] != members[0].name.split(".")[0])
    enough = second.offset + 512  # the first sample is whole once the next one's header is in
    assert members[1].name.split(".")[0] == members[0].name.split(".")[0]  # its class
    cuts = {
        "in the first header": 300,
        "in the first member's data": members[0].offset_data + 9,
        "in its class's header": members[1].offset + 100,
        "in the second sample's header": second.offset + 100,
        "just enough": enough,
    }
    for where, cut in cuts.items():
        monkeypatch.setattr(store_shards, "HEAD_BYTES", cut)
        gets = server.proxy.gets
        assert next(reader.read_head(url)) == whole[0], where
        tries = next(k for k in range(1, 10) if cut * 4 ** (k - 1) >= enough)
        assert server.proxy.gets - gets == tries, where
    monkeypatch.setattr(store_shards, "HEAD_BYTES", 1024)
    gets, sent = server.proxy.gets, server.proxy.sent
    assert list(reader.read_head(url)) == whole
    tries = server.proxy.gets - gets
    assert 1024 * 4 ** (tries - 2) <= shard_bytes < 1024 * 4 ** (tries - 1)
    ranged = sum(1024 * 4**k for k in range(tries - 1))  # under 4/3 of the shard
    assert server.proxy.sent - sent == ranged + shard_bytes


def test_a_check_of_a_batch_sizes_its_ranges_for_the_batch_and_a_mid_shard_span_reads_its_own(
    server: S3Server, tiny_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch made in the workers needs its samples whole: the next range is sized for
    them from the bytes a sample took so far, in fewer GETs than growing fourfold; a
    span that starts inside a shard (a rank's after the first) reads its own samples'
    bytes in one GET, not the shard's head again from the first byte."""
    from raytune_loader.measuring.shards import _Heads

    url, reader, whole, shard_bytes = _first_shard(tiny_shards)
    monkeypatch.setattr(store_shards, "HEAD_BYTES", 1024)
    tries = {}
    for need in (1, 8):
        gets = server.proxy.gets
        assert list(_Heads(reader, need).read(url, 0, 8)) == whole[:8]
        tries[need] = server.proxy.gets - gets
    assert tries[8] < tries[1]
    starts = _sample_starts(tiny_shards / "shard-0000.tar")
    gets, sent = server.proxy.gets, server.proxy.sent
    assert list(_Heads(reader, 8).read(url, 5, 7)) == whole[5:7]
    assert (server.proxy.gets - gets, server.proxy.sent - sent) == (1, starts[7] - starts[5])


def _sample_starts(shard: Path) -> list[int]:
    """Where each sample of a local tar shard starts (its first member's header), and
    the shard's size last: read with tarfile alone, members grouped by their stem."""
    import tarfile

    starts, stems = [], set()
    with tarfile.open(shard) as tar:
        for member in tar:
            stem = member.name.split(".", 1)[0]
            if stem not in stems:
                stems.add(stem)
                starts.append(member.offset)
    return [*starts, shard.stat().st_size]


def test_a_span_of_a_shard_gets_its_own_samples_bytes_in_one_ranged_get(
    server: S3Server, tiny_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's span that starts or ends inside a shard fetches the bytes of its own
    samples (from the index made when the shard was counted), not the whole shard: a
    trial's epoch of a few shards cut among workers would otherwise fetch the shards
    at its workers' ends twice, which training's epoch of thousands does not. Every
    ``stride``-th sample is indexed; a store that ignores Range, and a compressed
    shard, give the whole shard, and the same samples."""
    url, reader, whole, shard_bytes = _first_shard(tiny_shards)
    starts = _sample_starts(tiny_shards / "shard-0000.tar")
    assert len(starts) == 25 and starts[-1] == shard_bytes
    proxy = server.proxy

    def read(reader: Any, spans: list[tuple[int, int]]) -> tuple[list[Any], int, int]:
        gets, sent = proxy.gets, proxy.sent
        got = list(reader.reads([(url, a, b) for a, b in spans], 2))
        return got, proxy.gets - gets, proxy.sent - sent

    for a, b in ((5, 7), (0, 1), (23, 24), (0, 24)):
        assert read(reader, [(a, b)]) == (whole[a:b], 1, starts[b] - starts[a])
    spans = [(5, 7), (10, 12), (2, 3)]  # two in flight, read in order
    bytes_of = sum(starts[b] - starts[a] for a, b in spans)
    assert read(reader, spans) == ([s for a, b in spans for s in whole[a:b]], 3, bytes_of)

    store_shards.COUNTED.clear()  # indexed again, every 5th sample: ceil(24 / 5) = 5
    monkeypatch.setattr(webdataset_shards, "INDEX_POINTS", 5)
    assert reader.count(url) == 24 and reader.indexed(url).stride == 5
    assert read(reader, [(7, 9)]) == (whole[7:9], 1, starts[10] - starts[5])
    assert read(reader, [(21, 23)]) == (whole[21:23], 1, starts[24] - starts[20])

    proxy.ranges = False  # the whole shard answered: its first sample is sample 0
    assert read(reader, [(7, 9)]) == (whole[7:9], 1, shard_bytes)
    proxy.ranges = True

    import gzip

    shard = (tiny_shards / "shard-0000.tar").read_bytes()  # written again, shorter:
    server.client().put_object(Bucket=BUCKET, Key="wds/shard-0000.tar", Body=shard[: starts[22]])
    try:
        with pytest.raises(DatasetError, match="shard-0000.tar changed since the search count"):
            read(reader, [(20, 24)])  # the range asked for runs past the object's new end
    finally:
        server.client().put_object(Bucket=BUCKET, Key="wds/shard-0000.tar", Body=shard)

    packed = gzip.compress(shard)
    server.client().put_object(Bucket=BUCKET, Key="gz/shard-0000.tar.gz", Body=packed)
    url = f"s3://{BUCKET}/gz/shard-0000.tar.gz"
    assert reader.count(url) == 24 and reader.indexed(url).offsets == ()
    got, gets, sent = read(reader, [(7, 9)])
    assert [{**sample, "__url__": url} for sample in whole[7:9]] == got
    assert (gets, sent) == (1, len(packed))


def test_what_comes_before_a_shard_s_first_sample_is_read_with_it(
    server: S3Server, tiny_shards: Path
) -> None:
    """A folder's entry before the first sample (as ``tar cf`` of a folder writes): the
    index starts the first sample at byte 0, so a span of the whole shard is one plain
    GET of it (kept where the profile keeps objects), and a later span still reads its
    own samples' bytes."""
    import io
    import tarfile

    url, reader, whole, _ = _first_shard(tiny_shards)
    written = io.BytesIO()
    with tarfile.open(tiny_shards / "shard-0000.tar") as source, \
            tarfile.open(fileobj=written, mode="w") as tar:  # fmt: skip
        folder = tarfile.TarInfo("images")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for member in source:
            tar.addfile(member, source.extractfile(member))
    blob = written.getvalue()
    server.client().put_object(Bucket=BUCKET, Key="folder/shard-0000.tar", Body=blob)
    url = f"s3://{BUCKET}/folder/shard-0000.tar"
    starts = _sample_starts(tiny_shards / "shard-0000.tar")  # without the folder's header
    assert reader.count(url) == 24 and reader.indexed(url).offsets[:2] == (0, 512 + starts[1])
    kept: dict[str, bytes] = {}
    gets, sent = server.proxy.gets, server.proxy.sent
    with kept_objects(kept):
        got = list(reader.reads([(url, 0, 24)], 2))
    assert (server.proxy.gets - gets, server.proxy.sent - sent, list(kept)) == (1, len(blob), [url])
    keyed = [{k: v for k, v in sample.items() if k != "__url__"} for sample in got]
    assert keyed == [{k: v for k, v in sample.items() if k != "__url__"} for sample in whole]
    assert [sample["__key__"] for sample in reader.reads([(url, 3, 5)], 2)] == [
        sample["__key__"] for sample in whole[3:5]]  # fmt: skip


def test_a_spawned_worker_reads_its_spans_from_the_indexes_its_stream_carries(
    server: S3Server, tiny_shards: Path
) -> None:
    """A loader worker started by spawn or forkserver inherits no process's indexes: it
    gets the stream pickled, and the stream's reader carries them, so its spans are
    ranged GETs as a forked worker's are, not a whole GET to index each shard and then
    another for the span. (What spawn hands a worker is the pickled stream; starting
    one costs an import of torch, which the pickle alone does not.)"""
    import pickle

    url, _, whole, _ = _first_shard(tiny_shards)
    stream = _stream(PATTERN)  # counted (and indexed) here
    carried = pickle.loads(pickle.dumps(stream)).reader  # type: ignore[attr-defined]
    store_shards.COUNTED.clear()  # a spawned worker's: nothing counted in it
    starts = _sample_starts(tiny_shards / "shard-0000.tar")
    gets, sent = server.proxy.gets, server.proxy.sent
    assert list(carried.reads([(url, 5, 7)], 2)) == whole[5:7]
    assert (server.proxy.gets - gets, server.proxy.sent - sent) == (1, starts[7] - starts[5])


def test_an_epoch_cut_inside_shards_among_workers_fetches_each_shard_s_bytes_once(
    server: S3Server, tiny_shards: Path
) -> None:
    """Three workers of 32 samples each over 4 shards of 24: two workers' shares start
    inside a shard. The epoch's spans fetch every shard's bytes once between them (a
    shard cut between two workers, in two parts), and read what the local shards give."""
    config = LoaderConfig.from_dict(
        {"num_workers": 3, "fetch_threads": 2, "access": "stream"}, batch_size=8
    )
    local = _stream(str(tiny_shards / "shard-{0000..0003}.tar"))
    remote = _stream(PATTERN)  # counted (and indexed) here, before the epoch
    gets, sent = server.proxy.gets, server.proxy.sent
    epochs = {}
    for name, stream in (("local", local), ("remote", remote)):
        loader = build_dataloader(stream, config, seed=3, drop_last=False)
        epochs[name] = torch.cat([labels for _, labels in loader]).tolist()
    assert epochs["remote"] == epochs["local"] and len(epochs["local"]) == 96
    sizes = sum(p.stat().st_size for p in tiny_shards.glob("shard-*.tar"))
    assert server.proxy.gets - gets == 6  # 4 shards, 2 of them in two parts
    assert server.proxy.sent - sent == sizes


def test_a_kept_shard_is_fetched_once_inside_the_block_and_again_outside(
    server: S3Server,
) -> None:
    """What nothing times may read a kept shard again without its GET; what follows the
    block (a measurement) fetches it, also after the block ended in an error."""
    from raytune_loader.stores.store import Store
    from raytune_loader.stores.url import parse

    store, url = Store(parse(f"s3://{BUCKET}/wds")), f"s3://{BUCKET}/wds/shard-0000.tar"
    kept: dict[str, bytes] = {}
    gets = server.proxy.gets
    with kept_objects(kept):
        first = store_shards.fetched(store, url, "webdataset")
        assert store_shards.fetched(store, url, "webdataset") == first
    assert server.proxy.gets - gets == 1 and kept == {url: first}
    with pytest.raises(KeyError), kept_objects(kept):
        raise KeyError("inside")
    assert store_shards.fetched(store, url, "webdataset") == first
    assert server.proxy.gets - gets == 2  # outside: fetched


def test_the_driver_counts_a_bucket_s_shards_at_once_after_the_first(server: S3Server) -> None:
    """Counting a shard from a store is its whole GET: after the first (24 samples), the
    two more that a trial's 72 samples take are fetched together, and no more."""
    from raytune_loader.measuring.job import SegmentSpec, TrialJob
    from raytune_loader.measuring.shards import prepare_stream

    class Quiet:
        def stage(self, text: str) -> None: ...
        def count(self, what: str, done: int, total: int) -> None: ...
        def warn(self, text: str) -> None: ...

    server.proxy.ttfb_s = 0.05
    job = TrialJob(dataset=_spec(), model="small-cnn", segment=SegmentSpec(1, 4, 2),
                   samples_per_trial=72, node_cpus=2)  # fmt: skip
    store_shards.COUNTED.clear()
    gets = server.proxy.gets
    server.proxy.peak_in_flight = 0
    prepared = prepare_stream(job, 8, Quiet())  # type: ignore[arg-type]
    assert prepared.stream_shards == 3 and server.proxy.gets - gets == 3
    assert server.proxy.peak_in_flight == 2


def test_a_thread_s_gets_and_their_cpu_are_its_own(server: S3Server) -> None:
    """What a GET costs the core that makes it is counted for the thread that made it:
    the profile takes a stream's GETs out of its samples' CPU and adds them back as a
    share, where the reading thread makes them, not where fetch threads do."""
    import threading

    from raytune_loader.stores.store import Store, thread_gets
    from raytune_loader.stores.url import parse

    store = Store(parse(f"s3://{BUCKET}/wds"))
    requests, cpu_s = thread_gets()
    store.get("wds/shard-0000.tar")
    store.get("wds/shard-0001.tar")
    mine = thread_gets()
    assert mine[0] - requests == 2 and mine[1] > cpu_s
    other: list[tuple[int, float]] = []
    worker = threading.Thread(
        target=lambda: (store.get("wds/shard-0002.tar"), other.append(thread_gets()))
    )
    worker.start()
    worker.join()
    assert other[0][0] == 1 and thread_gets() == mine  # the other thread's, not this one's


def test_the_latency_probe_of_large_objects_stops_at_its_budget(
    server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One GET at a time, 48 of them; where they take longer than the budget (a bucket's
    5 MB shards: 34 s), those sent within it, at least 8."""
    from raytune_loader.stores import store as stores
    from raytune_loader.stores.url import parse

    server.proxy.ttfb_s = 0.05
    bucket = stores.Store(parse(f"s3://{BUCKET}/wds"))
    keys = [f"wds/shard-{i:04d}.tar" for i in range(4)]
    monkeypatch.setattr(probe, "LATENCY_BUDGET_S", 0.2)
    found = probe.latency(bucket, keys)
    assert found is not None and found.requests == probe.LATENCY_LEAST
    assert found.ttfb_p50_s >= 0.05
    monkeypatch.setattr(probe, "LATENCY_BUDGET_S", 60.0)
    assert probe.latency(bucket, keys, requests=12).requests == 12  # type: ignore[union-attr]


def test_the_latency_probe_reads_a_large_object_s_first_bytes_and_tells_its_whole_get(
    server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each probe GET asks for the object's first bytes alone (a 5 MB shard read whole
    held the probe 0.43 s a GET): its first byte is the whole object's, and its body
    gives the bandwidth, at which a whole GET's seconds are told. A quarter of each
    object is read and the rest told from it, so a late wake-up of the loaded fast tier
    while reading it counts three times over (at an eighth it counted seven times, and
    8 ms late a GET would have crossed the 25% then asked)."""
    from raytune_loader.stores import store as stores
    from raytune_loader.stores.url import parse

    bucket = stores.Store(parse(f"s3://{BUCKET}/wds"))
    keys = [f"wds/shard-{i:04d}.tar" for i in range(4)]
    transport = bucket.transport()
    whole = transport.timed(BUCKET, keys[0])[4]
    monkeypatch.setattr(probe, "LATENCY_BYTES", whole // 4)
    server.proxy.ttfb_s, server.proxy.bytes_per_s = 0.02, 8e6  # 64 Mbit/s a request
    try:
        whole_s = statistics.median(transport.timed(BUCKET, key)[2] for key in keys[:3])
        started = time.perf_counter()
        found = probe.latency(bucket, keys, requests=8)
        probed_s = (time.perf_counter() - started) / 8
    finally:
        server.proxy.bytes_per_s = None
    assert whole_s > 0.02 + whole / 8e6 * 0.9  # the cap holds a whole GET (1.9 MB)
    assert found is not None and found.ttfb_p50_s >= 0.02
    assert found.mbit_per_s is not None and 64 / 2 < found.mbit_per_s <= 64 * 1.1
    assert probed_s < 0.02 + whole / 8e6 / 2  # a quarter of each object read
    assert found.request_s == pytest.approx(whole_s, rel=0.3)


def test_the_ramp_s_threads_make_fewer_gets_where_a_request_takes_long(
    server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The top rate's ramp makes 4 GETs a thread, one after another; where the latency
    probe found requests that would hold a thread past a second (a bucket's 5 MB
    shards, 0.43 s: the ramp took 8 s of a profile), as many as fit, at least 2. The
    profile probes the latency first and sizes the ramp from it."""
    from raytune_loader.measuring import profile
    from raytune_loader.measuring.job import SegmentSpec, TrialJob
    from raytune_loader.stores import store as stores
    from raytune_loader.stores.url import parse

    def probed(request_s: float) -> probe.Latency:
        return probe.Latency(0.03, 0.03, None, 8, None, request_s)

    found = [probe.ramp_per_thread(m) for m in (None, probed(0.03), probed(0.3), probed(0.43))]
    assert found == [4, 4, 3, 2] and probe.ramp_per_thread(probed(3.0)) == 2  # at least 2
    bucket = stores.Store(parse(f"s3://{BUCKET}/wds"))
    keys = [f"wds/shard-{i:04d}.tar" for i in range(4)]
    gets = server.proxy.gets
    assert probe.top_rate(bucket, keys, per_thread=1) > 0
    assert server.proxy.gets - gets in (4, 4 + 16, 4 + 16 + 64)  # a GET a thread, a step
    gets = server.proxy.gets
    assert probe.top_rate(bucket, keys, per_thread=1, enough=1.0) > 1.0
    assert server.proxy.gets - gets == 4  # the first step answered enough
    ramped: list[tuple[int, float]] = []
    monkeypatch.setattr(profile, "latency", lambda store, keys, served: probed(0.3))

    def ramp(store: object, keys: object, per_thread: int, enough: float) -> float:
        ramped.append((per_thread, enough))
        return 1.0

    monkeypatch.setattr(profile, "top_rate", ramp)
    spec = DatasetSpec("webdataset", PATTERN, shuffle_buffer=1000)
    job = TrialJob(dataset=spec, model="small-cnn", segment=SegmentSpec(1, 4, 2),
                   samples_per_trial=48, node_cpus=2, stream_shards=4,
                   ceilings={8: 300.0, 16: 400.0}, ranks=2)  # fmt: skip
    config = LoaderConfig.from_dict({"num_workers": 2, "access": "stream"}, batch_size=8)
    profile.prepare(job, 0, config, check=False)
    found = profile.profile(job, [config], 2)
    assert found.store_rate == 1.0 and [per_thread for per_thread, _ in ramped] == [3]
    # past twice what both ranks at the faster step ask for, a store bounds no candidate
    enough = profile.RAMP_ENOUGH * 2 * 400.0 * found.requests_per_sample
    assert ramped[0][1] == pytest.approx(enough) and found.requests_per_sample == 1 / 24


def test_what_the_driver_listed_and_counted_is_handed_on_not_redone(server: S3Server) -> None:
    """A trial's process builds its stream from the job's listing: no LIST, and no shard
    fetched to count its samples (a count there is a whole shard's GET)."""
    import pickle

    from raytune_loader.sources.datasets import adopt_listing

    root = f"s3://{BUCKET}/wds"
    source, spec = webdataset_shards.SOURCE, _spec(root)
    for url in source.shards(spec):
        source.read_shard(spec, url)  # the driver counts them before the trials
    handed = pickle.loads(pickle.dumps(source.listed(spec)))  # in the job, to a trial
    store_shards.LISTED.clear()  # as in the trial's own process
    store_shards.COUNTED.clear()
    requests = server.proxy.requests
    adopt_listing(spec, handed)
    stream = _stream(root)
    assert server.proxy.requests == requests
    assert stream.sizes == (24, 24, 24, 24)


def test_arrow_s_filesystem_reads_the_bucket_with_the_store_s_settings(
    server: S3Server,
) -> None:
    """What Ray Data's own readers read a bucket's shards through: Arrow's S3 client on
    the store's endpoint and region, credentials from the environment (none passed as
    values), a throttled GET retried by it. A profile only --storage-options names is
    refused in one line: Arrow's client takes one from AWS_PROFILE alone."""
    from raytune_loader.errors import ConfigError
    from raytune_loader.stores.arrow import arrow_filesystem
    from raytune_loader.stores.store import Store, StoreOptions
    from raytune_loader.stores.url import parse

    server.proxy.throttle = 0.4
    store = Store(parse(f"s3://{BUCKET}/wds"))
    filesystem = arrow_filesystem(store)
    throttled = server.proxy.throttled
    for i in range(4):
        key = f"wds/shard-{i:04d}.tar"
        with filesystem.open_input_stream(f"{BUCKET}/{key}") as handle:
            got = handle.read()
        assert got == server.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
    assert server.proxy.throttled > throttled  # answered 503, tried again by Arrow
    assert "testing" not in repr(filesystem.__reduce__())  # what a read task is sent
    named = Store(parse(f"s3://{BUCKET}/wds"), StoreOptions(profile="training"))
    with pytest.raises(ConfigError, match="export AWS_PROFILE=training, or pass --no-ray-data"):
        arrow_filesystem(named)


def test_a_profile_arrow_cannot_take_keeps_ray_data_out_of_the_search_in_one_line() -> None:
    """Ray's readers take a profile from AWS_PROFILE only: one that only --storage-options
    names is said once, before any trial, and Ray Data is not offered (every Ray Data
    trial failed on it one by one); without it, Ray Data is offered on the bucket."""
    from dataclasses import replace

    from conftest import OneNode, Said
    from raytune_loader.tuning.bounds import raydata_cpus
    from raytune_loader.tuning.options import SearchOptions, job_from_options

    opts = SearchOptions(ray_data=True)
    base = job_from_options(opts, "small-cnn", device="cpu", node_cpus=2.0)
    named = DatasetSpec("webdataset", PATTERN, storage_options=(("profile", "training"),))
    said = Said()
    assert raydata_cpus(opts, OneNode(), replace(base, dataset=named), said) == 0.0  # type: ignore[arg-type]
    (line,) = said.warnings
    assert "export AWS_PROFILE=training" in line and "\n" not in line
    assert raydata_cpus(opts, OneNode(), replace(base, dataset=_spec()), Said()) == 1.0  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_ray_data_epoch_reads_a_bucket_s_shards_with_ray_s_own_reader(
    server: S3Server, tiny_shards: Path
) -> None:
    """Ray Data's ``read_webdataset`` of the bucket's shards (real Ray, through Arrow's
    S3 client): every sample once an epoch with the classes the local shards give, each
    shard's object fetched, the throttled GETs retried."""
    from collections import Counter

    import ray

    from conftest import ray_processes, ray_processes_left
    from raytune_loader import raydata
    from raytune_loader.raydata.config import RayDataConfig

    config = RayDataConfig(8, map_batch_size=8, crosses="uint8", decoder="tensor")
    streams = {
        "remote": _stream(PATTERN),
        "local": _stream(str(tiny_shards / "shard-{0000..0003}.tar")),
    }
    # throttling on once the shards are counted (each count a GET, unthrottled), its
    # draws from the seed: of the read's four GETs the fourth draw (0.26) is throttled,
    # however many GETs came before
    server.proxy.throttle = 0.3
    server.proxy.reseed()
    before_ray = ray_processes()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        answered, throttled = server.proxy.answered.copy(), server.proxy.throttled
        labels = {}
        for name, stream in streams.items():
            read = raydata.rows_of(stream)
            loader = raydata.RayDataLoader(raydata.build_dataset(read, config, seed=1), config)
            labels[name] = Counter(int(y) for _, ys in loader for y in ys)
    finally:
        ray.shutdown()
    assert not ray_processes_left(before_ray)
    assert labels["remote"] == labels["local"] and sum(labels["local"].values()) == 96
    fetched = server.proxy.answered - answered
    assert set(fetched) == {f"wds/shard-{i:04d}.tar" for i in range(4)}
    assert server.proxy.throttled > throttled


@pytest.mark.slow
def test_a_search_over_shards_in_s3_searches_read_ahead_and_records_the_store(
    server: S3Server, tmp_path: Path
) -> None:
    """The command line on a brace pattern of shards 30 ms from their first byte: every
    trial's window counts its GETs (a shard each, not a sample each), read-ahead is
    searched, and best_config.json records the store and how the stream is read."""
    import csv
    import json

    from conftest import TINY_SEARCH, ray_processes, run_cli

    before, server.proxy.ttfb_s = ray_processes(), 0.03
    args = [a for a in TINY_SEARCH if a not in ("--dataset", "synthetic-imagenet",
                                                "--synthetic-images", "96")]  # fmt: skip
    result = run_cli(
        *args, "--dataset", "webdataset", "--data-root", PATTERN, "--num-samples", "5",
        "--verify-repeats", "1", "--samples-per-trial", "48", "--no-ray-data",
        "--out", str(tmp_path / "out"), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    folder = tmp_path / "out" / "webdataset"
    best = json.loads((folder / "best_config.json").read_text())
    with open(folder / "trials.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r["status"] == "ok"]
    assert rows and all(r["access"] == "stream" for r in rows)
    assert {int(r["fetch_threads"]) for r in rows} <= {1, 2, 4}  # shards ahead, not 64
    for row in rows:  # a GET for 24 samples: far fewer requests than samples
        assert 0 < int(row["store_requests"]) <= int(row["samples"]) / 4, row
    store = best["source"]["store"]
    assert (store["scheme"], store["bucket"]) == ("s3", BUCKET) and store["request_s"] >= 0.03
    assert store["ttfb_p99_s"] >= store["ttfb_p50_s"] >= 0.03 and store["top_requests_per_s"] > 0
    assert store["server_cpu_s_per_request"] > 0  # the tests' server shares this node's cores
    assert best["pipeline"]["access"] == "stream" and best["source"]["shards"] == 4
    profile = best["search"]["model"]["profile"]  # the cost model saw a GET a shard
    assert profile["requests_per_sample"] < 0.5 and profile["fetch_s"] >= 0.03
    assert ray_processes() <= before


def _best_config(path: Path, pipeline: dict[str, object], spec: dict[str, object]) -> Path:
    """A best_config.json as a search on a bucket writes it (the keys the reader reads)."""
    import json

    from raytune_loader.machine.hardware import cpu_and_gpu_summary

    path.write_text(json.dumps({
        "schema_version": 1, "dataset": spec["name"], "model": "tiny", "objective": "util",
        "loader": {"batch_size": 8, "num_workers": 0, "prefetch_factor": None,
                   "pin_memory": False, "persistent_workers": False, "in_order": True,
                   "multiprocessing_context": None},
        "pipeline": {"transfer": "uint8", "decode": "tensor", **pipeline},
        "metrics": {}, "baselines": {}, "speedup": {}, "hardware": cpu_and_gpu_summary(),
        "source": {"kind": spec["name"], "shuffle_buffer": 0,
                   "store": {"scheme": "s3", "bucket": BUCKET}},
        "search": {"dataset_spec": spec}, "created": "now",
    }))  # fmt: skip
    return path


def _rank_reads(rank: int, store: str, configs: list[str], results: object) -> None:
    from conftest import gloo_group
    from raytune_loader import load_best_config

    with gloo_group(rank, store, results):
        shards, folder = (load_best_config(path) for path in configs)
        stream = shards.dataset(PATTERN)
        read = [int(y) for _, labels in shards.dataloader(stream) for y in labels]
        images = folder.image_dataset(f"s3://{BUCKET}/imagenet/train")
        results.put((rank, {"stream": read, "images": len(images)}))  # type: ignore[attr-defined]


@pytest.mark.slow  # a process group of ranks: minutes of the fast tier's CPU
def test_in_training_rank_zero_lists_and_counts_and_every_rank_reads_its_share(
    server: S3Server, tiny_imagenet: Path, tmp_path: Path
) -> None:
    """Two gloo ranks build the tuned shards' stream and an image folder on the bucket:
    rank 0 alone counts the shards (a GET each) and lists the folder, the others take
    what it found; each rank then reads its own half of the shards, a GET a shard."""
    from conftest import two_gloo_ranks

    server.upload_folder(tiny_imagenet / "train", BUCKET, "imagenet/train")
    spec = {"name": "webdataset", "data_root": PATTERN, "storage_options": []}
    configs = [
        str(_best_config(tmp_path / "shards.json", {"access": "stream", "fetch_threads": 2}, spec)),
        str(_best_config(tmp_path / "images.json", {"fetch_threads": 4}, {"name": "imagefolder"})),
    ]
    requests, gets = server.proxy.requests, server.proxy.gets
    read = two_gloo_ranks(_rank_reads, configs)
    gets_for_the_ranks = server.proxy.gets - gets
    listings = (server.proxy.requests - requests) - gets_for_the_ranks
    assert sorted(read[0]["stream"] + read[1]["stream"]) == sorted(  # each sample once
        int(y) for _, labels in _loader_of(_stream(PATTERN)) for y in labels
    )
    assert len(read[0]["stream"]) == len(read[1]["stream"]) == 48
    assert read[0]["images"] == read[1]["images"] == 96
    classes = len([p for p in (tiny_imagenet / "train").iterdir() if p.is_dir()])
    assert gets_for_the_ranks == 4 + 4  # rank 0 counted the 4 shards; each rank read its 2
    assert listings == 2 + classes  # one listing of the folder, not one a rank


def _loader_of(stream: object) -> object:
    config = LoaderConfig.from_dict({"num_workers": 0, "access": "stream"}, batch_size=8)
    return build_dataloader(stream, config, seed=0, drop_last=False)

"""Parquet files in an object store (``--dataset hf --data-root s3://…``): a real S3 API
on loopback (moto behind the tests' proxy, tests/s3_for_tests.py). A prefix and a
pattern name the same files; a stream reads the rows the local files give, a GET a
file; read-ahead puts files in flight together; what the driver learned is handed on;
a broken file is named in one line; by index is refused, in one line."""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from s3_for_tests import S3Server, environment

from conftest import Tables
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import DatasetError
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.loaders.shard_stream import StreamVariant
from raytune_loader.sources import hf_tables, store_shards
from raytune_loader.sources.datasets import DatasetSpec, adopt_listing
from raytune_loader.stores.store import count_requests

pytest.importorskip("moto")
pytest.importorskip("datasets")

BUCKET = "tables-bucket"
PREFIX = f"s3://{BUCKET}/hf"
SOURCE = hf_tables.SOURCE
RAW = StreamVariant(transfer="uint8", decode="device", shuffle_buffer=0)  # encoded bytes


@pytest.fixture(scope="module")
def server(tables: Tables) -> Iterator[S3Server]:
    """The S3 server holding the table's 3 Parquet files (32 rows each) under ``hf/``."""
    with S3Server() as found:
        found.upload_folder(tables.parquet, BUCKET, "hf")
        with environment(found.env()):
            yield found


@pytest.fixture(autouse=True)
def _fresh(server: S3Server) -> None:
    server.reset()


def _read(samples: object) -> Counter[tuple[bytes, int]]:
    return Counter((bytes(image.numpy()), label) for image, label in samples)  # type: ignore[attr-defined]


def _spec(root: str = PREFIX) -> DatasetSpec:
    return DatasetSpec("hf", root)


def test_a_bucket_s_files_stream_the_rows_of_the_local_files_a_get_a_file(
    server: S3Server, tables: Tables
) -> None:
    spec = _spec()
    urls = [f"{PREFIX}/part-{i}.parquet" for i in range(3)]
    assert SOURCE.shards(spec) == urls  # the prefix, listed
    requests = server.proxy.requests
    assert SOURCE.shards(_spec(f"{PREFIX}/part-{{0..2}}.parquet")) == urls  # no request
    assert server.proxy.requests == requests
    assert SOURCE.accesses(spec) == ("stream",)  # by index would copy every file here
    assert SOURCE.fetches(spec) and SOURCE.ray_data_reads(spec)  # Arrow's S3 client
    gets = server.proxy.gets
    stream = SOURCE.build_stream(spec, [], RAW)
    assert server.proxy.gets - gets == 3  # each file read once to count and check it
    assert stream.sizes == (32, 32, 32)  # type: ignore[attr-defined]
    assert stream.classes == tables.classes  # the ClassLabel's names, from the schema
    counts = count_requests(stream)
    assert counts is not None, "the stream's store is where a measurement counts"
    before = counts.totals()["requests"]
    assert _read(stream) == tables.samples  # every row once, as the local files hold it
    assert counts.totals()["requests"] - before == 3  # a file's rows: one GET
    described = SOURCE.describe(spec)
    assert described["store"]["bucket"] == BUCKET and described["shards"] == 3
    with pytest.raises(DatasetError, match="read as a stream") as refused:
        SOURCE.build(spec)
    assert "\n" not in str(refused.value)


def test_read_ahead_puts_a_worker_s_files_in_flight_together(server: S3Server) -> None:
    spec = _spec()
    stream = SOURCE.build_stream(spec, [], replace(RAW, decode="tensor"))
    server.proxy.ttfb_s = 0.05
    peaks = {}
    for ahead in (1, 2):
        server.proxy.peak_in_flight = 0
        config = LoaderConfig.from_dict(
            {"num_workers": 0, "fetch_threads": ahead, "access": "stream"}, batch_size=8
        )
        loader = build_dataloader(stream, config, seed=0, drop_last=False)
        assert len(torch.cat([labels for _, labels in loader])) == 96
        peaks[ahead] = server.proxy.peak_in_flight
    assert peaks == {1: 1, 2: 2}


def test_a_trial_s_process_takes_what_the_driver_learned_of_the_files(
    server: S3Server, tables: Tables
) -> None:
    """No listing and no file fetched to count it or to find its classes: the driver's
    reading of each file (rows, labels, ClassLabel names) is handed on in the job."""
    spec = _spec()
    infos = [SOURCE.read_shard(spec, url) for url in SOURCE.shards(spec)]  # the driver
    assert [i.samples for i in infos] == [32, 32, 32]
    sizes = {p.name: p.stat().st_size for p in tables.parquet.iterdir()}
    assert [i.bytes for i in infos] == [sizes[f"part-{n}.parquet"] for n in range(3)]
    handed = pickle.loads(pickle.dumps(SOURCE.listed(spec)))  # in the job, to a trial
    store_shards.LISTED.clear()  # as in the trial's own process
    store_shards.COUNTED.clear()
    requests = server.proxy.requests
    adopt_listing(spec, handed)
    stream = SOURCE.build_stream(spec, [], RAW)
    assert server.proxy.requests == requests
    assert stream.classes == tables.classes  # type: ignore[attr-defined]


def _in_row_groups(server: S3Server, tables: Tables, prefix: str) -> tuple[bytes, str, Any]:
    """The first Parquet file written again in 4 row groups of 8 rows, as the only file
    under ``prefix`` of the bucket: its bytes, its URL, a stream of it (counted: a GET)."""
    import io

    import pyarrow.parquet as pq

    written = io.BytesIO()
    pq.write_table(pq.read_table(tables.parquet / "part-0.parquet"), written, row_group_size=8)
    blob = written.getvalue()
    server.client().put_object(Bucket=BUCKET, Key=f"{prefix}/part-0.parquet", Body=blob)
    stream = SOURCE.build_stream(_spec(f"s3://{BUCKET}/{prefix}"), [], RAW)
    return blob, f"s3://{BUCKET}/{prefix}/part-0.parquet", stream


def test_a_check_of_a_file_reads_its_footer_and_first_row_group_not_the_whole_file(
    server: S3Server, tables: Tables
) -> None:
    """Before a measurement, a stream's first row is checked (``checked_head``): of a
    bucket's Parquet file of 4 row groups, its footer and first row group, two ranged
    GETs, not the whole file. Read on, each row group is one more GET, and the rows
    are the whole file's, in its order, from a store that ignores Range too (its first
    GET read from). A file listed and then gone is named in one line."""
    from raytune_loader.measuring.shards import checked_head

    blob, url, stream = _in_row_groups(server, tables, "groups")
    whole = list(stream.reader.read(url, 0, 32))  # type: ignore[attr-defined]
    gets, sent = server.proxy.gets, server.proxy.sent
    first = next(iter(checked_head(stream)))
    assert (server.proxy.gets - gets, server.proxy.sent - sent < len(blob) / 2) == (2, True)
    assert torch.equal(first[0], next(iter(stream))[0])  # the row the stream reads first
    gets = server.proxy.gets
    assert list(stream.reader.read_head(url, 8)) == whole  # type: ignore[attr-defined]
    assert server.proxy.gets - gets == 1 + 4
    server.proxy.ranges = False  # each GET answers the whole file: the first is read
    gets, sent = server.proxy.gets, server.proxy.sent
    assert list(stream.reader.read_head(url, 8)) == whole  # type: ignore[attr-defined]
    assert (server.proxy.gets - gets, server.proxy.sent - sent) == (1, len(blob))
    server.client().delete_object(Bucket=BUCKET, Key="groups/part-0.parquet")
    with pytest.raises(DatasetError, match=f"hf: shard {url} does not exist") as gone:
        next(iter(checked_head(stream)))  # listed and counted, then gone
    assert "\n" not in str(gone.value)


def test_a_span_of_a_file_gets_its_row_groups_and_the_footer_not_the_rest(
    server: S3Server, tables: Tables
) -> None:
    """A worker's span of a Parquet file (its share of an epoch cut among workers)
    fetches the row groups that hold its rows and the footer, two ranged GETs at once,
    or one to the file's end where its groups reach the footer's read; a span of the
    whole file is one GET of it. The rows are the whole file's either way, from a store
    that ignores Range too. A spawned loader worker's reader carries the facts. Counts
    that did not note the footer's length read to the end; a read outside what was
    fetched (the file changed since it was counted) is named in one line."""
    import io

    import pyarrow.parquet as pq

    from raytune_loader.sources.table_files import FOOTER_READ

    blob, url, stream = _in_row_groups(server, tables, "spans")
    reader = stream.reader  # type: ignore[attr-defined]
    whole = list(reader.read(url, 0, 32))
    meta = pq.read_metadata(io.BytesIO(blob))  # a row group starts where the last ended
    sizes = [sum(meta.row_group(g).column(c).total_compressed_size
                 for c in range(meta.num_columns)) for g in range(4)]  # fmt: skip
    starts = [4 + sum(sizes[:g]) for g in range(4)]  # after the magic, b"PAR1"
    assert reader.learned(url).groups == tuple((8, start) for start in starts)
    footer = len(blob) - max(FOOTER_READ, int.from_bytes(blob[-8:-4], "little") + 8)
    assert starts[3] < footer < starts[3] + sizes[3]  # the last group meets the footer's read
    tail = len(blob) - footer
    proxy = server.proxy

    def read(spans: list[tuple[int, int]], by: Any = reader) -> tuple[list[Any], int, int]:
        gets, sent = proxy.gets, proxy.sent
        rows = list(by.reads([(url, a, b) for a, b in spans], 2))
        return rows, proxy.gets - gets, proxy.sent - sent

    assert read([(0, 32)]) == (whole, 1, len(blob))
    assert read([(0, 5)]) == (whole[0:5], 2, starts[1] + tail)
    assert read([(10, 14)]) == (whole[10:14], 2, sizes[1] + tail)
    assert read([(6, 20)]) == (whole[6:20], 2, starts[3] + tail)  # groups 0 to 2
    assert read([(27, 32)]) == (whole[27:32], 1, len(blob) - starts[3])
    assert read([(20, 27)]) == (whole[20:27], 1, len(blob) - starts[2])
    spans = [(17, 20), (8, 9), (3, 4)]  # two in flight, read in order
    assert read(spans) == ([r for a, b in spans for r in whole[a:b]], 6,
                           starts[3] + 3 * tail)  # fmt: skip
    carried = pickle.loads(pickle.dumps(reader))  # what a spawned loader worker gets,
    store_shards.COUNTED.clear()  # with no counts of its own: the reader carries them
    assert read([(10, 14)], carried) == (whole[10:14], 2, sizes[1] + tail)
    facts = reader.known[url]
    store_shards.COUNTED[url] = facts._replace(footer=0)  # counts that did not note it
    assert read([(10, 14)]) == (whole[10:14], 1, len(blob) - starts[1])  # to the end
    wrong = ((8, starts[0]), (8, starts[2]), (8, starts[2]), (8, starts[3]))
    store_shards.COUNTED[url] = facts._replace(groups=wrong)  # group 1's bytes not fetched
    with pytest.raises(DatasetError, match=r"rows 10 to 14 of .*part-0.parquet could not be "
                       "read from the bytes fetched") as unfetched:  # fmt: skip
        read([(10, 14)])
    assert "\n" not in str(unfetched.value)
    store_shards.COUNTED[url] = facts
    proxy.ranges = False  # each GET answers the whole file: read as it is
    assert read([(10, 14)]) == (whole[10:14], 2, 2 * len(blob))
    assert read([(27, 32)]) == (whole[27:32], 1, len(blob))


def test_a_footer_longer_than_arrow_s_first_read_is_fetched_whole(server: S3Server) -> None:
    """A file of many row groups has a footer longer than Arrow's first read of 64 KiB:
    a span's GET of it takes the whole footer, which Arrow reads next."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from raytune_loader.sources.table_files import FOOTER_READ

    noise = random.Random(1)
    table = pa.table({"image": [{"bytes": noise.randbytes(40), "path": None} for _ in range(600)],
                      "label": [i % 3 for i in range(600)]})  # fmt: skip
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=2)
    blob = sink.getvalue().to_pybytes()
    footer = int.from_bytes(blob[-8:-4], "little") + 8
    assert footer > FOOTER_READ
    server.client().put_object(Bucket=BUCKET, Key="long/part-0.parquet", Body=blob)
    url = f"s3://{BUCKET}/long/part-0.parquet"
    reader = SOURCE.build_stream(_spec(f"s3://{BUCKET}/long"), [], RAW).reader  # type: ignore[attr-defined]
    assert reader.learned(url).footer == footer
    whole = list(reader.read(url, 0, 600))
    gets, sent = server.proxy.gets, server.proxy.sent
    assert list(reader.reads([(url, 100, 104)], 1)) == whole[100:104]
    assert server.proxy.gets - gets == 2
    assert footer < server.proxy.sent - sent < footer + 1000  # and two groups of 2 rows


def test_a_span_near_the_end_of_a_small_file_fetches_what_arrow_reads_of_its_footer(
    server: S3Server,
) -> None:
    """Arrow reads a Parquet file's footer as its last 64 KiB (or all of a smaller
    file): a span in a late row group of a file of small rows starts its GET there, and
    no earlier, and a span in an early one gets its group and that read; the rows are
    the file's. An object written again shorter since it was
    counted is named in one line, not read as another file."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from raytune_loader.sources.table_files import FOOTER_READ

    rows, noise = 400, random.Random(0)  # incompressible: 400 bytes a row
    images = [{"bytes": noise.randbytes(400), "path": None} for _ in range(rows)]
    table = pa.table({"image": images, "label": [i % 4 for i in range(rows)]})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=50)
    blob = sink.getvalue().to_pybytes()
    assert FOOTER_READ < len(blob) < 4 * FOOTER_READ  # 8 row groups, 20 KiB each or so
    server.client().put_object(Bucket=BUCKET, Key="small/part-0.parquet", Body=blob)
    url = f"s3://{BUCKET}/small/part-0.parquet"
    stream = SOURCE.build_stream(_spec(f"s3://{BUCKET}/small"), [], RAW)
    reader = stream.reader  # type: ignore[attr-defined]
    whole = list(reader.read(url, 0, rows))
    gets, sent = server.proxy.gets, server.proxy.sent
    assert list(reader.reads([(url, 390, 400)], 2)) == whole[390:400]
    assert (server.proxy.gets - gets, server.proxy.sent - sent) == (1, FOOTER_READ)
    gets, sent = server.proxy.gets, server.proxy.sent
    assert list(reader.reads([(url, 60, 70)], 2)) == whole[60:70]
    first = [g for _, g in reader.learned(url).groups]  # group 1, then the footer's read
    assert (server.proxy.gets - gets, server.proxy.sent - sent) == (
        2,
        first[2] - first[1] + FOOTER_READ,
    )
    server.client().put_object(Bucket=BUCKET, Key="small/part-0.parquet", Body=blob[:-100])
    with pytest.raises(DatasetError, match="part-0.parquet changed since the search counted"):
        list(reader.reads([(url, 390, 400)], 2))


def test_a_broken_file_or_a_missing_column_is_named_in_one_line(
    server: S3Server, tables: Tables
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    client = server.client()
    client.put_object(Bucket=BUCKET, Key="broken/part-0.parquet", Body=b"PAR1 not a table")
    spec = _spec(f"s3://{BUCKET}/broken")
    with pytest.raises(DatasetError, match=r"broken/part-0.parquet is truncated or not a Parquet"):
        SOURCE.read_shard(spec, SOURCE.shards(spec)[0])
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"img": [b"x"], "label": [0]}), sink)
    table = sink.getvalue().to_pybytes()
    client.put_object(Bucket=BUCKET, Key="renamed/part-0.parquet", Body=table)
    spec = _spec(f"s3://{BUCKET}/renamed")
    with pytest.raises(DatasetError, match="has no column 'image' .*--image-column"):
        SOURCE.read_shard(spec, SOURCE.shards(spec)[0])
    with pytest.raises(DatasetError, match=f"{PREFIX}/part-7.parquet does not exist"):
        SOURCE.read_shard(spec, f"{PREFIX}/part-7.parquet")
    client.put_object(Bucket=BUCKET, Key="texts/readme.txt", Body=b"no table")
    with pytest.raises(DatasetError, match=f"s3://{BUCKET}/texts holds no .parquet object"):
        SOURCE.shards(replace(spec, data_root=f"s3://{BUCKET}/texts"))


@pytest.mark.slow
def test_a_ray_data_epoch_reads_a_bucket_s_parquet_with_ray_s_own_reader(
    server: S3Server, tables: Tables
) -> None:
    """Ray Data's ``read_parquet`` of the bucket's files (real Ray, through Arrow's S3
    client): every row once an epoch with its class, as the local files hold them."""
    import ray

    from conftest import ray_processes, ray_processes_left
    from raytune_loader import raydata
    from raytune_loader.raydata.config import RayDataConfig

    stream = SOURCE.build_stream(_spec(), [], StreamVariant("uint8", "tensor"))
    read = raydata.rows_of(stream)
    assert (read.reader, read.rows, read.store is not None) == ("parquet", 96, True)  # type: ignore[union-attr]
    config = RayDataConfig(8, map_batch_size=8, crosses="uint8", decoder="tensor")
    before_ray = ray_processes()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        gets = server.proxy.gets
        loader = raydata.RayDataLoader(raydata.build_dataset(read, config, seed=1), config)
        labels = Counter(int(y) for _, ys in loader for y in ys)
    finally:
        ray.shutdown()
    assert not ray_processes_left(before_ray)
    assert labels == Counter(label for _, label in tables.samples.elements())
    assert server.proxy.gets > gets  # read from the bucket, not from a local copy


@pytest.mark.slow
def test_a_search_over_parquet_in_s3_reads_a_stream_and_training_reads_every_row(
    server: S3Server, tables: Tables, tmp_path: Path
) -> None:
    """The command line on a bucket's Parquet files 30 ms from their first byte: every
    trial streams them (a GET a file's span, not a row), read-ahead is searched,
    best_config.json records the store, and the tuned loader reads every row once."""
    import csv
    import json

    from conftest import TINY_SEARCH, ray_processes, run_cli
    from raytune_loader import load_best_config

    before, server.proxy.ttfb_s = ray_processes(), 0.03
    args = [a for a in TINY_SEARCH if a not in ("--dataset", "synthetic-imagenet",
                                                "--synthetic-images", "96")]  # fmt: skip
    result = run_cli(
        *args, "--dataset", "hf", "--data-root", PREFIX, "--num-samples", "4",
        "--verify-repeats", "1", "--samples-per-trial", "48", "--shuffle-buffer", "0",
        "--out", str(tmp_path / "out"), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    folder = tmp_path / "out" / "hf"
    best = json.loads((folder / "best_config.json").read_text())
    with open(folder / "trials.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r["status"] == "ok"]
    assert rows and all(r["access"] == "stream" for r in rows)  # never a local copy
    assert {int(r["fetch_threads"]) for r in rows} <= {1, 2, 4}
    for row in rows:  # a GET for a file's 32 rows: far fewer requests than samples
        assert 0 < int(row["store_requests"]) <= int(row["samples"]) / 4, row
    store = best["source"]["store"]
    assert (store["scheme"], store["bucket"]) == ("s3", BUCKET) and store["ttfb_p50_s"] >= 0.03
    assert best["source"]["shards"] == 3 and best["pipeline"]["access"] == "stream"
    assert "testing" not in (folder / "best_config.json").read_text()  # no credential
    tuned = load_best_config(folder / "best_config.json")  # the store as it was tuned on
    labels = [int(y) for _, batch in tuned.dataloader(tuned.dataset()) for y in batch]
    assert Counter(labels) == Counter(label for _, label in tables.samples.elements())
    assert ray_processes() <= before

"""Data in an object store: a real S3 API on loopback (moto's server) behind the tests'
proxy (tests/s3_for_tests.py), which adds latency, throttling and dropped connections
request by request. The seams: URLs, options, listing once, reading every sample once,
retries counted by cause, errors in one line without secrets, requests in flight."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from s3_for_tests import S3Server, environment

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import ConfigError, CorruptSampleError, DatasetError, StoreRefusedError
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.measuring.prepare import prepare_data
from raytune_loader.sources import remote_folder
from raytune_loader.sources.datasets import DatasetSpec, build_dataset, check_sample, listing_of
from raytune_loader.stores.store import Counts, Store, StoreOptions, StoreWatch, count_requests
from raytune_loader.stores.url import is_remote, parse
from raytune_loader.tuning.options import SearchOptions, job_from_options

pytest.importorskip("botocore")
pytest.importorskip("moto")

BUCKET = "training-data"
SECRET = "wJalrXUtnFEMI-do-not-print-me"


@pytest.fixture(scope="module")
def server(tiny_imagenet: Path) -> Iterator[S3Server]:
    """The S3 server holding the tiny dataset under ``imagenet/train``, its environment set
    (a distinctive secret, to look for in every message)."""
    with S3Server() as found:
        found.upload_folder(tiny_imagenet / "train", BUCKET, "imagenet/train")
        env = {**found.env(), "AWS_SECRET_ACCESS_KEY": SECRET}
        with environment(env):
            yield found


@pytest.fixture(autouse=True)
def _fresh(server: S3Server) -> Iterator[None]:
    """Each test starts with no listing remembered and a store that answers at once."""
    remote_folder._LISTINGS.clear()
    server.reset()
    yield
    remote_folder._LISTINGS.clear()


def _spec(root: str = f"s3://{BUCKET}/imagenet", **options: str) -> DatasetSpec:
    return DatasetSpec("imagenet", root, storage_options=tuple(sorted(options.items())))


# -- where the data is ---------------------------------------------------------------------


def test_an_s3_url_is_kept_whole_and_told_from_a_local_path() -> None:
    url = parse("s3://my-bucket/imagenet/")
    assert (url.scheme, url.bucket, url.prefix) == ("s3", "my-bucket", "imagenet")
    assert str(url.child("train")) == "s3://my-bucket/imagenet/train"  # the // kept
    assert is_remote("s3://b/x") and not is_remote("/data/s3:/b") and not is_remote(None)
    with pytest.raises(DatasetError, match="storage.googleapis.com"):
        parse("gs://bucket/imagenet")  # read through GCS's S3 API: said how
    with pytest.raises(DatasetError, match="names no bucket"):
        parse("s3:///imagenet")


def test_storage_options_take_settings_and_refuse_credentials_and_unknown_keys() -> None:
    found = StoreOptions.from_pairs({"region": "eu-west-1", "force_path_style": "true"})
    assert found.region == "eu-west-1" and found.force_path_style is True
    with pytest.raises(ConfigError, match="no credential .*AWS_ACCESS_KEY_ID"):
        StoreOptions.from_pairs({"aws_secret_access_key": SECRET})
    with pytest.raises(ConfigError, match="no key 'regoin'.*region"):
        StoreOptions.from_pairs({"regoin": "eu-west-1"})
    with pytest.raises(ConfigError, match="no credential"):
        StoreOptions.from_pairs({"endpoint_url": f"http://me:{SECRET}@host:9000"})
    # a key pasted as a setting's value: refused, and not repeated
    # R2's key ID and secret, a GCS HMAC key's ID, an Azure account key
    others = ("0123456789abcdef" * 2, "0123456789abcdef" * 4,
              "GOOG1EXAMPLEKEYID7ABCDEFGHIJKLMNOP", "Ab3+/" * 17 + "9==")  # fmt: skip
    for pasted in ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", " AKIAIOSFODNN7EXAMPLE\n",
                   *others):  # fmt: skip
        with pytest.raises(ConfigError, match="profile looks like an access key") as caught:
            StoreOptions.from_pairs({"profile": pasted})
        assert pasted.strip() not in str(caught.value)
    named = {"profile": "Training2024-readonly", "region": "ap-southeast-2"}
    assert StoreOptions.from_pairs(named).profile == "Training2024-readonly"
    hexy = {"profile": "deadbeef" * 3, "endpoint_url": "https://" + "0a" * 16 + ".r2.dev"}
    assert StoreOptions.from_pairs(hexy).profile == "deadbeef" * 3  # a name, not a key


def test_a_wrong_secret_or_an_unknown_key_id_says_which() -> None:
    """The store's code says which of the keys is wrong; a policy's refusal is apart."""
    from raytune_loader.stores.refusals import first_line, refusal

    wrong = refusal(OSError("HTTP 403 SignatureDoesNotMatch"), None)
    assert "does not match the key ID" in wrong.why and "AWS_SECRET_ACCESS_KEY" in wrong.fix
    said = "An error occurred (InvalidAccessKeyId) when calling the ListObjectsV2 operation"
    unknown = refusal(OSError(said), None)
    assert "no such key ID" in unknown.why and "AWS_ACCESS_KEY_ID" in unknown.fix
    said = first_line(OSError("see https://docs.example/x for (endpoint(http://h:1/b) refused)"))
    assert said == "see <url> for (endpoint(<url>) refused)"
    denied = refusal(OSError("HTTP 403 AccessDenied"), None)
    assert denied.why == "refused these credentials (access denied)"
    assert "policy" in denied.fix


def test_the_storage_options_flag_reads_a_json_object_and_never_echoes_it() -> None:
    from raytune_loader.search import get_args_parser, storage_options

    assert storage_options('{"region": "eu-west-1", "unsigned": true}') == (
        ("region", "eu-west-1"), ("unsigned", "true"),
    )  # fmt: skip
    with pytest.raises(argparse.ArgumentTypeError, match="JSON object.*true or false") as caught:
        storage_options(f'{{"region": "{SECRET}"')  # not JSON
    assert SECRET not in str(caught.value)
    parser = get_args_parser()
    assert parser.parse_args(["--storage-options", "{}"]).storage_options == ()
    assert parser.parse_args([]).storage_options is None  # the environment's


# -- listing once --------------------------------------------------------------------------


def test_a_remote_folder_lists_classes_and_images_as_the_local_one_does(
    server: S3Server, tiny_imagenet: Path
) -> None:
    from torchvision.datasets import ImageFolder

    local = ImageFolder(str(tiny_imagenet / "train"))
    before = server.proxy.requests
    remote = build_dataset(_spec())
    listed = server.proxy.requests - before
    assert remote.classes == local.classes
    names = [tuple(key.rsplit("/", 2)[-2:]) for key, _ in remote.listing.samples]
    assert names == [Path(p).parts[-2:] for p, _ in local.samples]
    assert [label for _, label in remote.listing.samples] == local.targets
    # one request to check the prefix, one for the class folders, one per class
    assert listed == 2 + len(local.classes)
    again = server.proxy.requests
    build_dataset(_spec())  # this process's listing, remembered
    assert server.proxy.requests == again


def test_a_listing_handed_on_is_not_repeated_by_workers_or_another_process(
    server: S3Server,
) -> None:
    spec = _spec()
    dataset = build_dataset(spec, "uint8", "tensor")
    listings = server.proxy.requests - server.proxy.gets
    loader = build_dataloader(dataset, LoaderConfig(batch_size=16, num_workers=2), seed=0)
    assert sum(len(labels) for _, labels in loader) == len(dataset) // 16 * 16
    assert server.proxy.requests - server.proxy.gets == listings  # the workers listed nothing
    remote_folder._LISTINGS.clear()  # as in another process (a trial): the job's listing
    from raytune_loader.sources.datasets import adopt_listing

    adopt_listing(spec, listing_of(dataset))
    build_dataset(spec)
    assert server.proxy.requests - server.proxy.gets == listings


# -- reading -------------------------------------------------------------------------------


def test_a_remote_sample_is_the_local_sample(server: S3Server, tiny_imagenet: Path) -> None:
    from raytune_loader.sources.datasets import DatasetSpec as Spec

    local = build_dataset(Spec("imagefolder", str(tiny_imagenet / "train")), "uint8", "tensor")
    remote = build_dataset(_spec(), "uint8", "tensor")
    for index in (0, 37, len(local) - 1):
        torch.manual_seed(index)  # the same random crop and flip
        want, want_label = local[index]
        torch.manual_seed(index)
        got, got_label = remote[index]
        assert got_label == want_label and torch.equal(got, want)


def test_an_epoch_reads_every_sample_once_whatever_was_retried(server: S3Server) -> None:
    server.proxy.throttle, server.proxy.cut = 0.15, 0.1
    dataset = build_dataset(_spec(), "uint8", "tensor")
    counts = count_requests(dataset)
    before = server.proxy.answered.copy()
    config = LoaderConfig.from_dict({"num_workers": 2, "fetch_threads": 4}, batch_size=8)
    labels = torch.cat([y for _, y in build_dataloader(dataset, config, seed=1, drop_last=False)])
    assert len(labels) == len(dataset)
    assert sorted(labels.tolist()) == sorted(dataset.targets)
    answered = server.proxy.answered - before
    assert set(answered.values()) == {1} and len(answered) == len(dataset)  # each key once
    totals = counts.totals()  # the workers' counts reached the parent's tensor
    assert totals["requests"] == len(dataset)
    assert totals["throttled"] == server.proxy.throttled > 0
    assert totals["reset"] == server.proxy.cuts > 0


def test_fetch_threads_put_a_batch_s_requests_in_flight_together(server: S3Server) -> None:
    server.proxy.ttfb_s = 0.05
    dataset = build_dataset(_spec(), "uint8", "tensor")
    peaks = {}
    for threads in (1, 8):
        server.proxy.peak_in_flight = 0
        config = LoaderConfig.from_dict({"num_workers": 0, "fetch_threads": threads}, 16)
        loader = build_dataloader(dataset, config, seed=0)
        next(iter(loader))
        peaks[threads] = server.proxy.peak_in_flight
    assert peaks == {1: 1, 8: 8}
    # fetch_threads are per worker, thread workers' too: two threads of one process
    # reading the same dataset keep 2 x 4 requests in flight, not 4 between them
    server.proxy.peak_in_flight = 0
    config = LoaderConfig.from_dict(
        {"num_workers": 2, "workers": "thread", "fetch_threads": 4}, batch_size=8
    )
    assert len(torch.cat([y for _, y in build_dataloader(dataset, config, seed=0)])) == len(dataset)
    assert server.proxy.peak_in_flight == 8


def test_a_ray_data_actor_fetches_its_map_call_s_objects_together(server: S3Server) -> None:
    """What a Ray Data actor runs on a bucket's dataset by index: a map call's objects in
    flight at once (one at a time, each of its rows waited for its own request), the
    same samples in the same order, every row stamped from the call's start; a local
    dataset's rows are still made one at a time. 100 ms to a first byte: the 7 waits
    saved stand above what the loaded fast tier adds to one call's rows (0.24 s once)."""
    import numpy as np

    from raytune_loader.raydata.actors import Indexed, make_samples

    ttfb_s = server.proxy.ttfb_s = 0.1
    dataset = build_dataset(_spec(), "uint8", "tensor")
    indices = [5, 0, 17, 3, 40, 2, 9, 11]
    # an untimed call first: the fetch threads and their connections opened, which the
    # first call alone pays (0.78 s against 0.55 s one at a time, once, beside the tier)
    make_samples({"index": np.array(indices)}, "uint8", "tensor", Indexed(dataset, 64))
    server.proxy.peak_in_flight = 0
    made = make_samples({"index": np.array(indices)}, "uint8", "tensor", Indexed(dataset, 64))
    assert server.proxy.peak_in_flight == len(indices)
    assert made["label"].tolist() == [dataset[i][1] for i in indices]
    assert made["image"].shape == (len(indices), *dataset[3][0].shape)  # augmented anew
    # each row's time holds its share of the call's one wait (a batch's cost is its
    # rows' sum)
    times = made["_made"] - made["_started"]
    assert times.min() >= ttfb_s / len(indices) and times.sum() >= ttfb_s
    server.proxy.peak_in_flight = 0
    one_by_one = make_samples({"index": np.array(indices)}, "uint8", "tensor", Indexed(dataset))
    assert server.proxy.peak_in_flight == 1
    assert one_by_one["label"].tolist() == made["label"].tolist()
    alone = one_by_one["_made"] - one_by_one["_started"]
    assert alone.min() >= ttfb_s  # each row waited for its own request
    # together the call's rows hold the wait once, not once a row: 7 waits less than
    # one at a time, asked with a margin of half of that for the tier's load (an upper
    # bound on the call's own seconds failed under it: 0.301 s against 0.3)
    assert alone.sum() - times.sum() >= 0.5 * (len(indices) - 1) * ttfb_s


def test_a_ray_data_actor_says_what_its_map_calls_asked_of_the_store(
    server: S3Server, tiny_imagenet: Path
) -> None:
    """An actor's requests are made in its own process, where the trial's counts cannot
    see them: each map call hands its counts over in its first row (every GET, retries
    by cause), and a measured segment's watch sums those of the batches received during
    its window, not before or after it. A local dataset's calls carry no counts."""
    import numpy as np

    from raytune_loader.raydata.actors import STORE_COLUMNS, Indexed, make_samples
    from raytune_loader.raydata.receiving import PipelineWatch

    server.proxy.ttfb_s, server.proxy.throttle = 0.01, 0.3
    dataset = build_dataset(_spec(), "uint8", "tensor")
    sent, throttled = server.proxy.requests, server.proxy.throttled
    calls = [
        make_samples({"index": np.arange(start, start + 8)}, "uint8", "tensor",
                     Indexed(dataset, 64))
        for start in (0, 8, 16, 24)
    ]  # fmt: skip
    asked = {c: sum(int(call[c].sum()) for call in calls) for c in STORE_COLUMNS}
    assert asked["_store_requests"] == 32  # each object once
    assert asked["_store_throttled"] == server.proxy.throttled - throttled > 0
    assert 32 + asked["_store_throttled"] == server.proxy.requests - sent  # every GET sent
    assert not any(call[c][1:].any() for call in calls for c in STORE_COLUMNS)
    watch = PipelineWatch()
    watch.saw(calls[0])  # collated before the window opened
    watch.window_started()
    watch.saw(calls[1])
    watch.saw(calls[2])
    watch.window_ended()
    watch.saw(calls[3])  # after it closed
    figures = watch.figures()
    inside = calls[1:3]
    assert figures["store_requests"] == sum(int(c["_store_requests"].sum()) for c in inside)
    assert figures["store_throttled"] == sum(int(c["_store_throttled"].sum()) for c in inside)
    assert figures["store_request_s"] >= 0.01  # at least the time to its first byte
    local = build_dataset(DatasetSpec("imagenet", str(tiny_imagenet)), "uint8", "tensor")
    made = make_samples({"index": np.arange(8)}, "uint8", "tensor", Indexed(local, 64))
    assert not set(STORE_COLUMNS) & set(made)
    assert "store_requests" not in PipelineWatch().figures()


@pytest.mark.slow
def test_a_ray_data_epoch_on_a_bucket_reads_every_object_once_a_call_s_together(
    server: S3Server,
) -> None:
    """A Ray Data pipeline's actors (real Ray, their processes started in the store's
    environment) read the bucket's images by index: each object is fetched exactly once
    an epoch, with its class, a map call's 16 objects in flight at once."""
    from collections import Counter

    import ray

    from conftest import ray_processes, ray_processes_left
    from raytune_loader import raydata
    from raytune_loader.raydata.config import RayDataConfig

    server.proxy.ttfb_s = 0.03
    dataset = build_dataset(_spec(), "uint8", "tensor")
    config = RayDataConfig(16, map_batch_size=16, crosses="uint8", decoder="tensor")
    before_ray = ray_processes()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        before = server.proxy.answered.copy()
        rows = raydata.rows_of(dataset)
        source = raydata.build_dataset(rows, config, seed=1)
        loader = raydata.RayDataLoader(source, config, stamp=True)
        assert loader.watch is not None
        loader.watch.window_started()
        labels = Counter(int(label) for stamped in loader for label in stamped.batch[1])
        loader.watch.window_ended()
        asked = loader.watch.figures()
    finally:
        ray.shutdown()
    assert not ray_processes_left(before_ray)
    answered = server.proxy.answered - before
    assert set(answered.values()) == {1} and len(answered) == len(dataset)  # type: ignore[arg-type]
    assert labels == Counter(dataset.targets)  # type: ignore[attr-defined]
    assert server.proxy.peak_in_flight == 16
    # the actors' GETs, counted in their processes, summed by the trial's watch
    assert asked["store_requests"] == len(dataset) and asked["store_throttled"] == 0  # type: ignore[arg-type]


def test_workers_forked_after_the_training_process_fetched_in_threads_read_every_sample(
    server: S3Server,
) -> None:
    """A trial's process fetches a batch on its threads (a loader without workers), then a
    loader forks two workers from it: each makes its own threads (the parent's did not
    come with the fork: a task given them would wait forever, a DataLoader timeout)."""
    dataset = build_dataset(_spec(), "uint8", "tensor")
    config = LoaderConfig.from_dict({"num_workers": 0, "fetch_threads": 8}, 16)
    next(iter(build_dataloader(dataset, config, seed=0)))  # the pool made here
    forked = LoaderConfig.from_dict(
        {"num_workers": 2, "fetch_threads": 8, "multiprocessing_context": "fork"}, 16
    )
    loader = build_dataloader(dataset, forked, seed=0, timeout=60)
    labels = torch.cat([labels for _, labels in loader])
    assert sorted(labels.tolist()) == sorted(dataset.targets)


def test_the_window_s_figures_count_the_store_s_requests(server: S3Server) -> None:
    server.proxy.ttfb_s, server.proxy.throttle = 0.02, 0.3  # the 4th GET from the seed
    store = Store(parse(f"s3://{BUCKET}/imagenet"), StoreOptions(), Counts())
    keys = [key for key, _, _ in store.list()][:12]
    watch, throttled = StoreWatch(store.counts), server.proxy.throttled
    watch.window_started()
    for key in keys:
        store.get(key)
    watch.window_ended()
    figures = watch.figures()
    assert figures["store_requests"] == len(keys)
    assert figures["store_throttled"] == server.proxy.throttled - throttled > 0
    assert figures["store_request_s"] >= 0.02  # at least the time to first byte
    assert 0.5 < figures["store_in_flight"] <= 1.05  # one request at a time


# -- errors, in one line, without secrets --------------------------------------------------


def test_a_missing_bucket_or_prefix_is_one_line_naming_the_bucket_and_credentials(
    server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DatasetError) as missing:
        build_dataset(_spec("s3://no-such-bucket/imagenet"))
    said = str(missing.value)
    assert "s3://no-such-bucket does not exist" in said and "\n" not in said
    assert "AWS_ACCESS_KEY_ID in the environment" in said
    assert said.endswith("check the bucket's name, the endpoint and the region")
    with pytest.raises(DatasetError, match=f"s3://{BUCKET}/elsewhere/train holds no object"):
        build_dataset(_spec(f"s3://{BUCKET}/elsewhere"))
    with pytest.raises(DatasetError) as twice:  # the split named in --data-root too
        build_dataset(_spec(f"s3://{BUCKET}/imagenet/train"))
    hinted = str(twice.value)
    assert "imagenet/train/train holds no object" in hinted and "\n" not in hinted
    assert hinted.endswith(f"imagenet reads --data-root/train: pass s3://{BUCKET}/imagenet "
                           "with --data-root")  # fmt: skip
    with pytest.raises(DatasetError) as bucket_named_train:  # a bucket named as the split
        build_dataset(_spec("s3://train"))
    assert "pass" not in str(bucket_named_train.value)
    assert SECRET not in said and SECRET not in caplog.text


def test_a_bucket_anyone_may_list_but_not_read_is_refused_before_any_trial(
    server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """A bucket's policy may let anyone list its objects and read none of them: the
    listing passes, and the check of the first sample, before any trial, says so in
    one line (the trials would each fail on the same refusal)."""
    caplog.set_level(logging.DEBUG)
    spec = _spec()
    dataset = build_dataset(spec)  # listed
    server.proxy.deny = True
    step = "datasets_for_tests:make_step"  # the user's own step: its search checks it too
    opts = SearchOptions(dataset="imagenet", data_root=spec.data_root, train_step=step)
    with pytest.raises(StoreRefusedError, match="access denied"):
        prepare_data(job_from_options(opts, step, device="cpu", node_cpus=2), 8)
    with pytest.raises(StoreRefusedError) as denied:
        check_sample(spec, dataset)
    said = str(denied.value)
    assert "refused these credentials (access denied)" in said and "\n" not in said
    assert f"bucket {BUCKET}" in said and "AWS_ACCESS_KEY_ID in the environment" in said
    assert SECRET not in said and SECRET not in caplog.text
    server.proxy.deny = False
    check_sample(spec, dataset)  # read: nothing to say


def test_a_url_left_with_one_slash_is_told_from_a_path_and_a_url() -> None:
    """``pathlib.Path("s3://bucket/x")`` is ``s3:/bucket/x``: the URL it meant is named,
    whether it comes as a string or as the Path; a URL or a path is not touched."""
    from raytune_loader.stores.url import mistyped

    assert mistyped("s3:/bucket/x") == mistyped(Path("s3://bucket/x")) == "s3://bucket/x"
    assert mistyped("s3://bucket/x") is None and mistyped("/data/s3:/x") is None
    assert mistyped("gs:/bucket") == "gs://bucket" and mistyped(None) is None


def test_no_credentials_a_missing_profile_and_an_endpoint_down_each_say_what_to_do(
    server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each in one line with its fix: none found (not "refused"), a profile named that
    is not there (the profile, not the environment's keys, is what botocore would read),
    an endpoint nothing answers at (its host named once, the client's URL left out)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to ask
    with pytest.raises(DatasetError) as none:
        build_dataset(_spec())
    said = str(none.value)
    assert "cannot be read: no credentials were found" in said and "refused" not in said
    assert said.endswith(
        "or AWS_PROFILE; a public bucket: --storage-options '{\"unsigned\": true}'"
    )
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    with pytest.raises(DatasetError) as profile:
        build_dataset(_spec(profile="nosuch"))
    said = str(profile.value)
    assert "no profile nosuch was found" in said and "credentials: profile nosuch" in said
    with pytest.raises(DatasetError) as down:
        # its prefix says "forbidden" and "403": the client's words name the URL
        build_dataset(_spec(f"s3://{BUCKET}/forbidden-403", endpoint_url="http://127.0.0.1:1"))
    said = str(down.value)
    assert "cannot be reached" in said and "(Could not connect to the endpoint URL)" in said
    assert "127.0.0.1:1" in said and "http://" not in said  # the host, named once
    assert said.endswith("check the endpoint (AWS_ENDPOINT_URL, or endpoint_url) and that it is up")
    assert all("\n" not in str(e.value) for e in (none, profile, down))


def test_the_proxy_passes_an_upload_that_waits_for_100_continue(server: S3Server) -> None:
    """boto3's PUT sends its body once told to go on: uploaded through the store's
    endpoint (as a person serving it by hand does), not only around it."""
    import boto3

    client = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")  # fmt: skip
    client.put_object(Bucket=BUCKET, Key="uploaded/one", Body=b"x" * 70_000)
    assert server.client().get_object(Bucket=BUCKET, Key="uploaded/one")["Body"].read() == (
        b"x" * 70_000
    )


def test_listing_many_classes_at_once_drops_no_connection(
    server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Twenty class folders listed side by side, each listing 20 ms from its first byte:
    the listing client's pool holds every connection (at botocore's 10, urllib3 warned
    of each one it dropped, in a user's first minute)."""
    from raytune_loader.stores.url import parse

    client = server.client()
    for index in range(20):
        client.put_object(Bucket=BUCKET, Key=f"wide/c{index:02d}/image.JPEG", Body=b"x")
    server.proxy.ttfb_s = 0.02
    caplog.set_level(logging.WARNING, logger="urllib3")
    listed = remote_folder.listing(parse(f"s3://{BUCKET}/wide"), StoreOptions())
    assert len(listed.samples) == 20
    assert [r.message for r in caplog.records if "pool is full" in r.message] == []


def test_a_key_listed_but_gone_or_corrupt_is_named(server: S3Server) -> None:
    dataset = build_dataset(_spec())
    gone, corrupt = dataset.listing.samples[3][0], dataset.listing.samples[5][0]
    client = server.client()
    original = client.get_object(Bucket=BUCKET, Key=corrupt)["Body"].read()
    client.delete_object(Bucket=BUCKET, Key=gone)
    client.put_object(Bucket=BUCKET, Key=corrupt, Body=b"not a jpeg")
    try:
        with pytest.raises(
            CorruptSampleError, match=f"s3://{BUCKET}/{gone} was listed but is gone"
        ):
            dataset[3]
        with pytest.raises(CorruptSampleError, match=f"corrupt sample s3://{BUCKET}/{corrupt}"):
            dataset[5]
    finally:
        client.put_object(Bucket=BUCKET, Key=corrupt, Body=original)
        client.put_object(Bucket=BUCKET, Key=gone, Body=original)


def test_the_command_line_refuses_a_missing_bucket_before_any_trial(
    server: S3Server, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "raytune_loader.search", "--dataset", "imagenet",
               "--data-root", "s3://no-such-bucket/imagenet", "--out", str(tmp_path / "out"),
               "--storage-options", '{"region": "us-east-1"}']  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "s3://no-such-bucket does not exist" in last and "credentials:" in last
    assert SECRET not in done.stderr + done.stdout
    assert not (tmp_path / "out" / "best_config.json").exists()


def test_a_config_tuned_on_local_files_warns_on_a_bucket_and_the_other_way_round(
    server: S3Server, tiny_imagenet: Path, tmp_path: Path
) -> None:
    """Requests in flight chosen for one latency do not hold at another: a config used
    on the other kind of data says so, and still builds the dataset (with its settings)."""
    import json
    import warnings

    from raytune_loader import StoreMismatchWarning, load_best_config
    from raytune_loader.machine.hardware import cpu_and_gpu_summary

    def written(name: str, source: dict[str, object]) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({
            "schema_version": 1, "dataset": "imagenet", "model": "tiny", "objective": "util",
            "loader": {"batch_size": 8, "num_workers": 0, "prefetch_factor": None,
                       "pin_memory": False, "persistent_workers": False, "in_order": True,
                       "multiprocessing_context": None},
            "pipeline": {"transfer": "uint8", "decode": "tensor", "fetch_threads": 4},
            "metrics": {}, "baselines": {}, "speedup": {}, "source": source,
            "hardware": cpu_and_gpu_summary(), "search": {}, "created": "now",
        }))  # fmt: skip
        return path

    bucket = f"s3://{BUCKET}/imagenet/train"
    local = load_best_config(written("local.json", {"kind": "imagenet"}))
    store = {"scheme": "s3", "bucket": BUCKET, "request_s": 0.031}
    remote = load_best_config(written("remote.json", {"kind": "imagenet", "store": store}))
    with pytest.warns(StoreMismatchWarning, match="tuned on local files.*fetch_threads"):
        dataset = local.image_dataset(bucket)
    assert len(dataset) == 96
    with pytest.warns(StoreMismatchWarning, match=f"tuned on s3://{BUCKET} .*0.031 s"):
        remote.image_dataset(tiny_imagenet / "train")
    # a winner whose window read a warm cache timed no request: its first byte is said
    cached = load_best_config(written("cached.json", {"kind": "imagenet", "store": {
        **store, "request_s": None, "ttfb_p50_s": 0.003}}))  # fmt: skip
    with pytest.warns(StoreMismatchWarning, match=r" \(a first byte in 0.003 s\), and "):
        cached.image_dataset(tiny_imagenet / "train")
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreMismatchWarning)
        on_its_store = remote.image_dataset(bucket)
        next(iter(remote.dataloader(on_its_store)))
        local.image_dataset(tiny_imagenet / "train")
    assert on_its_store.fetch_threads == 4  # the loader set it
    # a store much slower than the one it was tuned on: its first bytes are timed, and said
    slow = load_best_config(written("slow.json", {"kind": "imagenet", "store": {
        **store, "ttfb_p50_s": 0.004}}))  # fmt: skip
    server.proxy.ttfb_s = 0.05
    with pytest.warns(StoreMismatchWarning, match=r"first byte in \d{2,3} ms.* in 4 ms \(\d+\.\dx "
                      r"slower\).*fetch_threads=4"):  # 50 ms and more, to a 4 ms store  # fmt: skip
        slow.image_dataset(bucket)
    as_tuned = load_best_config(written("as_tuned.json", {"kind": "imagenet", "store": {
        **store, "ttfb_p50_s": 0.05}}))  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreMismatchWarning)
        as_tuned.image_dataset(bucket)


def test_the_latency_probe_times_the_first_byte_and_a_request_s_bandwidth(
    server: S3Server,
) -> None:
    from raytune_loader.stores.probe import latency

    store = Store(parse(f"s3://{BUCKET}/imagenet"), StoreOptions())
    keys = [key for key, _, _ in store.list()]
    server.proxy.ttfb_s, server.proxy.bytes_per_s = 0.03, 2e6  # 16 Mbit/s a request
    try:
        measured = latency(store, keys, requests=12, served=True)
        unasked = latency(store, keys, requests=8)  # a user's check in training: no server
    finally:
        server.proxy.bytes_per_s = None
    assert measured is not None and measured.requests == 12
    assert 0.03 <= measured.ttfb_p50_s <= measured.ttfb_p99_s < 0.3
    assert measured.mbit_per_s is not None and 16 / 2 < measured.mbit_per_s <= 16 * 1.1
    # the tests' server runs in this process, on this node: its CPU a request is counted
    assert measured.server_cpu_s is not None and 0 < measured.server_cpu_s < 0.5
    assert measured.as_dict()["server_cpu_s_per_request"] == round(measured.server_cpu_s, 6)
    assert unasked is not None and unasked.server_cpu_s is None


@pytest.mark.skipif(sys.platform != "linux", reason="another process's sockets: root elsewhere")
def test_a_store_s_server_is_found_on_this_node_by_its_endpoint(server: S3Server) -> None:
    """The process listening on a loopback endpoint's port (here, this one: the tests'
    server runs in it); none for a host that is not this node's, or a port no process
    listens on, or S3 itself (no endpoint)."""
    import os

    from env_for_tests import free_port

    from raytune_loader.stores.colocated import server_on_this_node

    assert [p.pid for p in server_on_this_node(server.endpoint)] == [os.getpid()]
    assert server_on_this_node(server.endpoint.replace("127.0.0.1", "localhost"))
    assert server_on_this_node("http://198.51.100.7:9000") == []  # TEST-NET-2: elsewhere
    assert server_on_this_node(f"http://127.0.0.1:{free_port()}") == []
    assert server_on_this_node("http://127.0.0.1:notaport") == []
    assert server_on_this_node(None) == []


def test_a_server_s_clock_counts_its_threads_not_the_caller_s_own_requests() -> None:
    """In the tests the server shares the measuring process: the CPU the calling thread
    spends (its own requests) is not the server's; another thread's is."""
    import threading
    import time

    import psutil

    from raytune_loader.stores.colocated import ServerClock

    def spin(seconds: float) -> None:
        until = time.thread_time() + seconds
        while time.thread_time() < until:
            pass

    clock = ServerClock([psutil.Process()])
    assert clock.start()
    spin(0.3)  # the caller's
    own = clock.seconds()
    assert clock.start()
    worker = threading.Thread(target=spin, args=(0.3,))
    worker.start()
    worker.join()
    served = clock.seconds()
    assert own is not None and own < 0.1
    assert served is not None and served >= 0.25
    # a server gone between finding it and timing it: nothing counted, nothing raised
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = ServerClock([psutil.Process(child.pid)])
    assert gone.start()
    child.kill()
    child.wait()
    assert gone.seconds() is None and not gone.start()


# -- a search over a store -----------------------------------------------------------------


@pytest.mark.slow
def test_a_search_over_s3_searches_requests_in_flight_and_lists_once(
    server: S3Server, tmp_path: Path
) -> None:
    """The command line on an ``s3://`` root 30 ms from its first byte: the listing is made
    once for the whole search, every trial's window counts its GETs, the space holds
    requests in flight, and the winner keeps more than one in flight per worker (one at a
    time, 30 ms each, is slower than anything else a trial does here)."""
    import csv
    import json

    from conftest import TINY_SEARCH, ray_processes, ray_sessions, run_cli

    before, server.proxy.ttfb_s, sessions = ray_processes(), 0.03, ray_sessions()
    requests, gets = server.proxy.requests, server.proxy.gets
    args = [a for a in TINY_SEARCH if a not in ("synthetic-imagenet", "--synthetic-images",
                                                "96", "--dataset")]  # fmt: skip
    result = run_cli(
        *args, "--dataset", "imagenet", "--data-root", f"s3://{BUCKET}/imagenet",
        "--num-samples", "6", "--verify-repeats", "1", "--out", str(tmp_path / "out"),
        "--cache-bytes", "0",  # every epoch from the store: test_store_cache's search caches
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert SECRET not in result.stderr + result.stdout
    logs = [f for s in ray_sessions() - sessions for f in s.rglob("*.log") if f.is_file()]
    assert logs and [f.name for f in logs if SECRET.encode() in f.read_bytes()] == []
    folder = tmp_path / "out" / "imagenet"
    best = json.loads((folder / "best_config.json").read_text())
    with open(folder / "trials.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r["status"] == "ok"]
    assert {int(r["fetch_threads"]) for r in rows} - {1}, "requests in flight not searched"
    for row in rows:
        # a GET a sample: the window's, less what workers fetched before it started
        assert int(row["samples"]) / 2 <= int(row["store_requests"]) <= 2 * int(row["samples"])
        assert float(row["store_request_s"]) >= 0.03, row  # the first byte's wait at least
    assert best["pipeline"]["fetch_threads"] > 1, best["pipeline"]
    assert dict(map(tuple, best["search"]["dataset_spec"]["storage_options"])) == {}
    store = best["source"]["store"]
    assert (store["scheme"], store["bucket"], store["region"]) == ("s3", BUCKET, "us-east-1")
    assert store["endpoint_host"] == server.endpoint.split("//")[1] and store["request_s"] >= 0.03
    assert store["ttfb_p99_s"] >= store["ttfb_p50_s"] >= 0.03 and store["top_requests_per_s"] > 0
    assert store["server_cpu_s_per_request"] > 0  # the tests' server shares this node's cores
    # listed once: the prefix's check, its class folders, each class (8); the rest GETs
    assert (server.proxy.requests - requests) - (server.proxy.gets - gets) == 2 + 8
    assert ray_processes() <= before
    # in training, the README's way: the bucket's images with the tuned requests in flight
    from raytune_loader import load_best_config

    tuned = load_best_config(folder / "best_config.json")
    dataset = tuned.image_dataset(f"s3://{BUCKET}/imagenet/train")
    images, labels = next(iter(tuned.dataloader(dataset)))
    assert dataset.fetch_threads == best["pipeline"]["fetch_threads"]
    assert len(labels) == best["loader"]["batch_size"] and images.dtype in (
        torch.float32,
        torch.uint8,
    )

"""One bucket of an object store, listed once and read object by object, every retry counted.

:class:`Store` GETs each object itself: a request signed by botocore (AWS's own
signer and credential chain) sent over a urllib3 connection pool of this process, with
no retry of the library's, so that each retry is the package's: backed off with jitter
and counted by cause (:class:`Counts`: throttled, timed out, connection reset), which
the measurement reads. Why not a client whole (s3torchconnector's CRT,
obstore, boto3, s3fs): ``docs/object_storage.md`` (the CRT retries out of sight,
obstore's runtime hangs in a forked DataLoader worker, boto3 costs twice the CPU a
request). Listing, a few requests a search, goes through botocore's client.
Credentials come from where the user set them for every other AWS tool
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE``,
the instance's role), the endpoint and region
from ``AWS_ENDPOINT_URL`` and ``AWS_REGION``; ``--storage-options`` sets what is left
(:class:`StoreOptions`), and takes no credential. No secret reaches a message or a log
line. A store pickles as its URL and options alone: each process (a loader worker, a
Ray task) opens its own client when it first reads.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlparse

from raytune_loader.errors import ConfigError, CorruptSampleError, DatasetError, StoreRefusedError
from raytune_loader.stores import kept
from raytune_loader.stores.refusals import first_line, refusal
from raytune_loader.stores.url import StoreUrl
from raytune_loader.wrapped import wrapped

log = logging.getLogger(__name__)
ATTEMPTS = 8  # a request tried at most this many times before its error is the trial's
BACKOFF_S = 0.05  # the first retry's wait at most; doubled each time, with full jitter
BACKOFF_MAX_S = 5.0
CAUSES = ("throttled", "timeout", "reset")  # why a request was retried
POOL_CONNECTIONS = 64  # kept open per process: a worker's fetch threads at most
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0  # between two reads of an answer: a stalled body is retried
_CREDENTIAL_WORDS = ("secret", "token", "password", "access_key", "key_id", "credential")
# an AWS access key's ID, and a secret key: 40 characters of base64 (a name has no / or +,
# nor upper and lower case and digits all at once)
_KEY_ID = re.compile(r"(AKIA|ASIA|AROA|AIDA|AGPA|ANPA|ANVA|APKA|ABIA|ACCA)[A-Z0-9]{16}")
_SECRET_KEY = re.compile(r"[A-Za-z0-9/+=]{40}")
# the other stores' keys of a fixed form: R2's key ID (32 hex digits) and secret (64),
# a GCS HMAC key's ID, an Azure account key (64 bytes of base64). MinIO's are the
# user's own words, which no form tells apart from a name.
_OTHER_KEYS = re.compile(r"[0-9a-f]{32}|[0-9a-f]{64}|GOOG[A-Z0-9]{16,}|[A-Za-z0-9/+]{86}==")


@dataclass(frozen=True)
class StoreOptions:
    """The client's settings beyond the environment's (``--storage-options``): each None
    takes the environment's value (``AWS_REGION``, ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``)
    or the client's default. No credential: those come from the environment or a
    profile, where a flag's value (shell history, process lists) would not put them."""

    region: str | None = None
    endpoint_url: str | None = None  # an S3-compatible store's (MinIO, R2, GCS's S3 API)
    profile: str | None = None
    force_path_style: bool | None = None  # bucket in the path; default: with an endpoint
    unsigned: bool = False  # a public bucket, read without credentials

    @classmethod
    def from_pairs(cls, pairs: Mapping[str, str] | tuple[tuple[str, str], ...]) -> StoreOptions:
        """From ``--storage-options``' (key, value) pairs; a ConfigError in one line for
        a key it does not know, or one that looks like a credential."""
        values = dict(pairs)
        known = {f for f in cls.__dataclass_fields__}
        for key in values:
            if any(word in key.lower() for word in _CREDENTIAL_WORDS):
                raise ConfigError(
                    f"--storage-options takes no credential ({key}): set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY in the environment, or AWS_PROFILE"
                )
            if key not in known:
                raise ConfigError(
                    f"--storage-options has no key {key!r}; it takes {', '.join(sorted(known))}"
                )
            if _looks_like_credential(str(values[key])):  # pasted in the wrong place
                raise ConfigError(
                    f"--storage-options {key} looks like an access key, which it does not take "
                    "(its value is not repeated here): set AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY in the environment, or AWS_PROFILE"
                )
        flags = {k: _flag(k, values[k]) for k in ("force_path_style", "unsigned") if k in values}
        found = cls(**{**values, **flags})  # type: ignore[arg-type]
        endpoint = found.endpoint_url
        if endpoint is not None:
            parsed = urlparse(endpoint)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise ConfigError(f"endpoint_url must be http(s)://host[:port], got {endpoint}")
            if parsed.username or parsed.password:
                raise ConfigError("endpoint_url carries no credential: use the environment's")
        return found

    def resolved(self) -> StoreOptions:
        """These options with the environment's values where they are None; the profile
        only where ``--storage-options`` names one (botocore reads ``AWS_PROFILE`` itself,
        after the environment's keys, as the AWS CLI and Arrow's client do; a profile
        handed to it explicitly would come before them)."""
        env = os.environ
        endpoint = (self.endpoint_url or env.get("AWS_ENDPOINT_URL_S3")
                    or env.get("AWS_ENDPOINT_URL"))  # fmt: skip
        return StoreOptions(
            region=self.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
            endpoint_url=endpoint,
            profile=self.profile,
            force_path_style=(
                endpoint is not None if self.force_path_style is None else self.force_path_style
            ),  # fmt: skip
            unsigned=self.unsigned,
        )


def _looks_like_credential(value: str) -> bool:
    """Whether ``value`` has the form of an access key's ID or of a secret key (AWS's,
    and R2's, GCS's and Azure's where their form is fixed)."""
    value = value.strip()
    if _KEY_ID.fullmatch(value) or _OTHER_KEYS.fullmatch(value):
        return True
    if not _SECRET_KEY.fullmatch(value):
        return False
    mixed = any(c.islower() for c in value) and any(c.isupper() for c in value)
    return "/" in value or "+" in value or (mixed and any(c.isdigit() for c in value))


def _flag(key: str, value: str) -> bool:
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise ConfigError(f"--storage-options {key} must be true or false, got {value!r}")


class Counts:
    """Requests, request time and retries by cause, added to by every process and
    thread that reads through the store, read by the measurement (the trial's process).

    The figures live in a torch tensor in shared memory (loader workers inherit it, or
    receive it through torch's sharing when they are spawned), a row per process
    (``pid`` modulo :data:`ROWS`: the processes of one trial do not share a row), so no
    lock crosses processes; a process's threads take its own lock."""

    NAMES = ("requests", *CAUSES, "busy_us")
    ROWS = 4096

    def __init__(self) -> None:
        import torch

        self.values = torch.zeros(self.ROWS, len(self.NAMES), dtype=torch.int64).share_memory_()

    def add(self, **amounts: float) -> None:
        """Add ``amounts`` by name (``requests=1, busy_us=n, ...``)."""
        pid = os.getpid()
        row = self.values[pid % self.ROWS]
        with _process_lock(pid):
            for name, amount in amounts.items():
                row[self.NAMES.index(name)] += int(amount)

    def totals(self) -> dict[str, int]:
        """Every count by name, all processes together."""
        return dict(zip(self.NAMES, self.values.sum(0).tolist(), strict=True))


_LOCKS: dict[int, threading.Lock] = {}
_THREAD = threading.local()  # this thread's answered GETs and their CPU (thread_gets)


def thread_gets() -> tuple[int, float]:
    """The GETs the calling thread has had answered, and the CPU-seconds they took it
    (signing, sending, reading the body): what a request costs the core that makes it,
    apart from what the thread did with the bytes."""
    return getattr(_THREAD, "requests", 0), getattr(_THREAD, "cpu_s", 0.0)


def _thread_got(cpu_s: float) -> None:
    requests, spent = thread_gets()
    _THREAD.requests, _THREAD.cpu_s = requests + 1, spent + cpu_s


def _process_lock(pid: int) -> threading.Lock:
    """This process's lock (a forked child makes its own: its pid differs)."""
    lock = _LOCKS.get(pid)
    if lock is None:
        lock = _LOCKS.setdefault(pid, threading.Lock())
    return lock


@dataclass
class Store:
    """A bucket at ``url``; ``options`` the client's settings beyond the environment's."""

    url: StoreUrl
    options: StoreOptions = field(default_factory=StoreOptions)
    counts: Counts | None = None
    _client: Transport | None = field(default=None, repr=False, compare=False)
    _pid: int = field(default=0, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options": self.options, "counts": self.counts,
                "_client": None, "_pid": 0}  # fmt: skip

    # -- what the user set ---------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What ``best_config.json`` records of the store: its scheme, bucket, endpoint
        host and region (no credential)."""
        options = self.options.resolved()
        endpoint = options.endpoint_url
        host = urlparse(endpoint) if endpoint else None
        return {
            "scheme": self.url.scheme,
            "bucket": self.url.bucket,
            # the host and port alone: no user:password@ of AWS_ENDPOINT_URL
            "endpoint_host": host.netloc.rpartition("@")[2] if host else "s3.amazonaws.com",
            "region": options.region,
        }

    def credentials(self) -> str:
        """Where the credentials come from, in words (never what they are)."""
        env = os.environ
        options = self.options.resolved()
        if options.unsigned:
            return "none (unsigned requests)"
        if options.profile:  # named: botocore's chain then skips the environment's keys
            return f"profile {options.profile}"
        if env.get("AWS_ACCESS_KEY_ID"):
            return "AWS_ACCESS_KEY_ID in the environment"
        if env.get("AWS_PROFILE"):
            return f"profile {env['AWS_PROFILE']} (AWS_PROFILE)"
        if env.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
            return "AWS_WEB_IDENTITY_TOKEN_FILE in the environment"
        return "none in the environment (no AWS_ACCESS_KEY_ID, AWS_PROFILE): the instance's role"

    # -- reading -------------------------------------------------------------------------

    def list(self, prefix: str = "") -> list[tuple[str, int, str]]:
        """Every object under ``prefix`` (a folder, relative to the store's own), as (key,
        bytes, ETag: what changes when the object is written again), in key order; one
        listing request per thousand keys."""
        where = self._folder(prefix)
        found: list[tuple[str, int, str]] = []
        for page in self._pages(Prefix=where):
            found += [(item["Key"], int(item["Size"]), str(item.get("ETag", "")))
                      for item in page.get("Contents", ())]  # fmt: skip
        return sorted(found)

    def folders(self, prefix: str = "") -> list[str]:
        """The keys' first level under ``prefix`` (relative to the store's own): the
        "folders" (common prefixes) a ``/`` delimiter finds, each a key prefix without
        its trailing slash, in key order."""
        where = self._folder(prefix)
        found: list[str] = []
        for page in self._pages(Prefix=where, Delimiter="/"):
            found += [p["Prefix"].rstrip("/") for p in page.get("CommonPrefixes", ())]
        return sorted(found)

    def get(self, key: str, length: int | None = None, start: int = 0) -> bytes:
        """The object ``key``, retried with backoff where the store throttled, timed out
        or dropped the connection (each retry counted); a CorruptSampleError naming it
        where it is gone, a DatasetError for what no retry mends (access denied). Inside
        a :func:`~raytune_loader.stores.kept.kept` block, kept, and answered from there
        where the block serves its objects. With ``length`` (positive), that many of
        its bytes alone, from its ``start``-th on (a ranged GET; fewer where the object
        is shorter, and all of it from a store that ignores the range), never kept."""
        url, keeping = self.url.of(key), kept.current()  # the profile's (stores.kept)
        found = keeping.held(url) if keeping is not None else None
        if found is not None:
            return found if length is None else found[start : start + length]
        transport = self.transport()  # its client made outside the request's clocks
        for attempt in range(ATTEMPTS):
            started, cpu_started = time.perf_counter(), time.thread_time()
            status, data, cause = transport.get(self.url.bucket, key, length, start)
            if status == 200:
                self._count(requests=1, busy_us=_us(time.perf_counter() - started))
                _thread_got(time.thread_time() - cpu_started)
                if keeping is not None and length is None:
                    keeping.keep(url, data)
                return data
            if cause is None or attempt == ATTEMPTS - 1:
                raise self._failed(status, data, key)
            self._count(**{cause: 1, "busy_us": _us(time.perf_counter() - started)})
            time.sleep(random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_S * 2**attempt)))
        raise AssertionError("unreachable")  # pragma: no cover

    def check(self) -> None:
        """Before any trial: the bucket exists, the credentials read it, and the prefix
        holds objects; each otherwise a DatasetError in one line naming the bucket and
        where the credentials came from."""
        page = next(iter(self._pages(Prefix=self._folder(""), PaginationConfig={"MaxItems": 1})))
        if not page.get("Contents"):
            raise DatasetError(
                f"{self.url} holds no object (bucket {self.url.bucket}, credentials: "
                f"{self.credentials()}, endpoint {self.describe()['endpoint_host']}): "
                "check the prefix"
            )

    def transport(self) -> Transport:
        """This process's transport (opened on first use, again after a fork)."""
        if self._client is None or self._pid != os.getpid():
            self._client, self._pid = Transport(self.options.resolved()), os.getpid()
        return self._client

    def _pages(self, **query: Any) -> Iterator[dict[str, Any]]:
        """ListObjectsV2's pages (botocore's paginator, its standard retries), its
        errors in one line naming the bucket and the credentials' source."""
        where = query.get("Prefix", "")
        try:
            pages = self.transport().lister().get_paginator("list_objects_v2")
            yield from pages.paginate(Bucket=self.url.bucket, **query)
        except Exception as exc:  # noqa: BLE001 - botocore's errors, said in one line
            raise self._refused(exc, where) from None

    def _folder(self, prefix: str) -> str:
        key = self.url.key(prefix)
        return f"{key}/" if key else ""

    def _count(self, **amounts: float) -> None:
        if self.counts is not None:
            self.counts.add(**amounts)

    def _refused(self, exc: Exception, where: str) -> StoreRefusedError:
        found = refusal(exc, self.options.profile)
        place = self.url.of(where) if where and not found.bucket else self.url.of("")
        return StoreRefusedError(
            f"{place.rstrip('/')} {found.why}: bucket {self.url.bucket}, credentials: "
            f"{self.credentials()}, endpoint {self.describe()['endpoint_host']} "
            f"({first_line(exc)}); {found.fix}"
        )

    def _failed(self, status: int, body: bytes, key: str) -> Exception:
        said = body[:2000].decode("utf-8", "replace")
        code = re.search(r"<Code>([^<]+)</Code>", said)
        words = f"HTTP {status}" + (f" {code[1]}" if code else "") if status else said
        if status == 404 and (code is None or code[1] == "NoSuchKey"):
            return CorruptSampleError(f"{self.url.of(key)} was listed but is gone")
        if status in (403, 404):
            return self._refused(OSError(words), key)
        return DatasetError(f"{self.url.of(key)} could not be read ({words}), {ATTEMPTS} tries")


class Transport:
    """This process's way to the store: signed GETs over a urllib3 connection pool (no
    retry of urllib3's: :meth:`Store.get` retries and counts), and botocore's client
    for listing. The credentials are botocore's chain (the environment, ``AWS_PROFILE``
    and its files, the instance's role), refreshed as botocore refreshes them."""

    def __init__(self, options: StoreOptions) -> None:
        try:
            import botocore.session
            import urllib3
        except ImportError:
            raise ConfigError(
                "reading an object store needs botocore: pip install 'raytune_loader[s3]'"
            ) from None
        self.options = options
        self.region = options.region or "us-east-1"
        self.session = botocore.session.Session(profile=options.profile)
        self.credentials = None if options.unsigned else self.session.get_credentials()
        self.pool = urllib3.PoolManager(
            maxsize=POOL_CONNECTIONS, retries=False,
            timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S),
        )  # fmt: skip
        self._lister: Any = None

    def url(self, bucket: str, key: str) -> str:
        """The object's URL: in the path (an endpoint's default) or the bucket's host."""
        path = quote(key, safe="/~")
        endpoint = self.options.endpoint_url or f"https://s3.{self.region}.amazonaws.com"
        if self.options.force_path_style:
            return f"{endpoint.rstrip('/')}/{bucket}/{path}"
        parts = urlparse(endpoint)
        return f"{parts.scheme}://{bucket}.{parts.netloc}/{path}"

    def get(
        self, bucket: str, key: str, length: int | None = None, start: int = 0
    ) -> tuple[int, bytes, str | None]:
        """One GET: (status, body, why it is worth another try or None); status 0 where
        no answer came (the body then says why). With ``length``, of that many of the
        object's bytes from its ``start``-th on (status 200 for its 206, and for the
        416 of a range that starts at its end: no bytes)."""
        import urllib3

        url = self.url(bucket, key)
        headers = _ranged(self._signed(url), length, start)
        try:
            answer = self.pool.request("GET", url, headers=headers)
        except urllib3.exceptions.TimeoutError as exc:
            return 0, first_line(exc).encode(), "timeout"
        except urllib3.exceptions.HTTPError as exc:  # reset, cut mid-body, refused
            return 0, first_line(exc).encode(), "reset"
        status = _whole_or_part(answer.status, length)
        cause = {429: "throttled", 503: "throttled", 500: "reset", 502: "reset", 504: "timeout"}
        empty = length is not None and answer.status == 416  # none from where it starts
        return status, b"" if empty else answer.data, cause.get(status)

    def timed(
        self, bucket: str, key: str, first_bytes: int | None = None
    ) -> tuple[int, float, float, int, int]:
        """One GET, timed: (status, seconds to its first byte, seconds to its last, bytes,
        the object's bytes); status 0 where no answer came. With ``first_bytes``, of the
        object's first bytes alone (a ranged GET: its first byte is the whole object's)."""
        import urllib3

        url = self.url(bucket, key)
        headers = _ranged(self._signed(url), first_bytes)
        started = time.perf_counter()
        try:
            answer = self.pool.request("GET", url, headers=headers, preload_content=False)
            first = time.perf_counter() - started  # the status line and headers are in
            size = len(answer.read())
            answer.release_conn()
        except urllib3.exceptions.HTTPError:
            return 0, 0.0, 0.0, 0, 0
        whole = answer.headers.get("Content-Range", "").rpartition("/")[2]
        status = _whole_or_part(answer.status, first_bytes)
        return (
            status,
            first,
            time.perf_counter() - started,
            size,
            int(whole) if whole.isdigit() else size,
        )

    def lister(self) -> Any:
        """botocore's S3 client, for listing (with botocore's standard retries)."""
        if self._lister is None:
            from botocore import UNSIGNED
            from botocore.config import Config

            style = "path" if self.options.force_path_style else "auto"
            signature = UNSIGNED if self.options.unsigned else None
            # a pool for as many listings at once as a fetching worker's GETs: at
            # botocore's 10, urllib3 warns of every connection it drops
            config = Config(s3={"addressing_style": style}, retries={"mode": "standard"},
                            signature_version=signature,
                            max_pool_connections=POOL_CONNECTIONS)  # fmt: skip
            self._lister = self.session.create_client(
                "s3", region_name=self.region, endpoint_url=self.options.endpoint_url,
                config=config,
            )  # fmt: skip
        return self._lister

    def _signed(self, url: str) -> dict[str, str]:
        if self.credentials is None:
            return {}
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method="GET", url=url)
        S3SigV4Auth(self.credentials.get_frozen_credentials(), "s3", self.region).add_auth(request)
        return dict(request.headers.items())


def _ranged(headers: dict[str, str], length: int | None, start: int = 0) -> dict[str, str]:
    """``headers`` asking for ``length`` of the object's bytes alone, from its
    ``start``-th on; added after signing: S3 takes a Range the signature leaves out."""
    if length is not None:
        headers["Range"] = f"bytes={start}-{start + length - 1}"
    return headers


def _whole_or_part(status: int, length: int | None) -> int:
    """200 for what a ranged GET answered: 206, the bytes asked for; 416, none (a range
    from the object's end on, an empty object's first bytes)."""
    return 200 if length is not None and status in (206, 416) else status


def _us(seconds: float) -> int:
    return round(seconds * 1e6)


def store_of(dataset: Any) -> Store | None:
    """The store that ``dataset`` (or a dataset it wraps: a ``Subset``, a measurement's)
    reads through; None where it reads none."""
    for layer in wrapped(dataset):
        store = vars(layer).get("store") if hasattr(layer, "__dict__") else None
        if isinstance(store, Store):
            return store
    return None


def count_requests(dataset: Any) -> Counts | None:
    """Start counting the requests of the store ``dataset`` reads through, in a new
    :class:`Counts`; None where it reads no store."""
    store = store_of(dataset)
    if store is None:
        return None
    store.counts = Counts()
    return store.counts


class StoreWatch:
    """What a measured window asked of the store (the measurement's figures): requests,
    retries by cause, a request's mean time, and the requests in flight on average
    (request-seconds over the window's seconds)."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts
        self._started: tuple[dict[str, int], float] | None = None
        self._ended: tuple[dict[str, int], float] | None = None

    def window_started(self) -> None:
        """Called when the measured window starts."""
        self._started = (self.counts.totals(), time.monotonic())

    def window_ended(self) -> None:
        """Called when the measured window ends."""
        self._ended = (self.counts.totals(), time.monotonic())

    def figures(self) -> dict[str, Any]:
        """The window's figures by ``SegmentMetrics``' names."""
        if self._started is None or self._ended is None:
            return {}
        (before, start), (after, end) = self._started, self._ended
        took = {name: after[name] - before[name] for name in Counts.NAMES}
        return window_figures(took, end - start)


def window_figures(took: Mapping[str, int], wall_s: float) -> dict[str, Any]:
    """A window's figures by ``SegmentMetrics``' names from what its requests took
    (:attr:`Counts.NAMES`, summed over every process that made them) in ``wall_s``."""
    requests = took["requests"]
    return {
        "store_requests": requests,
        "store_throttled": took["throttled"],
        "store_timeouts": took["timeout"],
        "store_resets": took["reset"],
        "store_request_s": took["busy_us"] / 1e6 / requests if requests else None,
        "store_in_flight": took["busy_us"] / 1e6 / max(wall_s, 1e-9),
    }

"""One bucket of an object store, listed once and read object by object, every retry counted.

:class:`Store` reads through obstore (Rust ``object_store``: the client the package
measured fastest per core, ``docs/object_storage.md``) with obstore's own retries off,
so that each retry is the package's: backed off with jitter and counted by cause
(:class:`Counts`: throttled, timed out, connection reset), which the findings read.
Credentials, endpoint and region come from where the user set them (``AWS_*``
environment variables, ``AWS_PROFILE`` through boto3), and ``--storage-options`` for
anything else; no secret reaches a message or a log line. A store pickles as its URL
and options alone: each process (a loader worker, a Ray task) opens its own client
when it first reads, as obstore's runtime does not survive a fork.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from raytune_loader.errors import ConfigError, CorruptSampleError, DatasetError
from raytune_loader.stores.url import StoreUrl

log = logging.getLogger(__name__)
ATTEMPTS = 8  # a request tried at most this many times before its error is the trial's
BACKOFF_S = 0.05  # the first retry's wait at most; doubled each time, with full jitter
BACKOFF_MAX_S = 5.0
CAUSES = ("throttled", "timeout", "reset")  # why a request was retried
_SECRET = ("secret", "token", "password", "key_id", "access_key", "session")


class Counts:
    """Requests, bytes and retries by cause, shared by every process that reads through
    the store (a torch tensor in shared memory: loader workers add to the trial's)."""

    NAMES = ("requests", "bytes", *CAUSES)

    def __init__(self) -> None:
        import torch

        self.values = torch.zeros(len(self.NAMES), dtype=torch.int64).share_memory_()

    def add(self, name: str, amount: int = 1) -> None:
        """Count ``amount`` more of ``name``."""
        self.values[self.NAMES.index(name)] += amount

    def as_dict(self) -> dict[str, int]:
        """Every count by name."""
        return {name: int(v) for name, v in zip(self.NAMES, self.values.tolist(), strict=True)}


@dataclass
class Store:
    """A bucket (or container) at ``url``; ``options`` are the client's settings beyond
    the environment's (``--storage-options``)."""

    url: StoreUrl
    options: Mapping[str, str] = field(default_factory=dict)
    counts: Counts | None = None
    _client: Any = field(default=None, repr=False, compare=False)
    _pid: int = field(default=0, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options": dict(self.options), "counts": self.counts,
                "_client": None, "_pid": 0}  # fmt: skip

    # -- what the user set ---------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What ``best_config.json`` records of the store: its scheme, bucket and
        endpoint host (no credential, no option's value)."""
        endpoint = _endpoint(self.options)
        return {
            "scheme": self.url.scheme,
            "bucket": self.url.bucket,
            "endpoint_host": urlparse(endpoint).hostname if endpoint else None,
            "options": sorted(self.options),
        }

    def credentials(self) -> str:
        """Where the credentials come from, in words (never what they are)."""
        env = os.environ
        if self.url.scheme != "s3":
            return "the environment of the store's client"
        if any(k.lower().startswith("aws_access_key") for k in self.options):
            return "--storage-options"
        if env.get("AWS_ACCESS_KEY_ID"):
            return "AWS_ACCESS_KEY_ID in the environment"
        if env.get("AWS_PROFILE"):
            return f"AWS_PROFILE {env['AWS_PROFILE']}"
        if env.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
            return "AWS_WEB_IDENTITY_TOKEN_FILE in the environment"
        return "none found (no AWS_ACCESS_KEY_ID, AWS_PROFILE): the instance's role, if any"

    # -- reading -------------------------------------------------------------------------

    def list(self, prefix: str = "") -> list[tuple[str, int]]:
        """Every object under ``prefix`` (relative to the store's own), as (key, bytes),
        in key order; one listing request per thousand keys."""
        import obstore

        found: list[tuple[str, int]] = []
        where = self.url.key(prefix) or None
        try:
            for chunk in obstore.list(self.client(), where, chunk_size=1000):
                found += [(meta["path"], int(meta["size"])) for meta in chunk]
        except Exception as exc:  # noqa: BLE001 - obstore's errors, said in one line
            raise self._refused(exc, where or "") from None
        return sorted(found)

    def get(self, key: str) -> bytes:
        """The object ``key``, retried with backoff where the store throttled, timed out
        or dropped the connection (each retry counted); a CorruptSampleError naming it
        where it is gone, a DatasetError for what no retry mends (access denied)."""
        import obstore

        for attempt in range(ATTEMPTS):
            try:
                data = bytes(obstore.get(self.client(), key).bytes())
            except Exception as exc:  # noqa: BLE001 - classified below; the rest re-raised
                cause = retry_cause(exc)
                if cause is None or attempt == ATTEMPTS - 1:
                    raise self._failed(exc, key) from None
                self._count(cause)
                time.sleep(random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_S * 2**attempt)))
                continue
            self._count("requests")
            self._count("bytes", len(data))
            return data
        raise AssertionError("unreachable")  # pragma: no cover

    def check(self) -> None:
        """Before any trial: the bucket exists, the credentials read it, and the prefix
        holds objects; each otherwise a DatasetError in one line naming the bucket and
        where the credentials came from."""
        if not self.list_some():
            raise DatasetError(
                f"{self.url} holds no object (bucket {self.url.bucket}, credentials: "
                f"{self.credentials()}): check the prefix"
            )

    def list_some(self) -> bool:
        """Whether the prefix holds at least one object (one listing request)."""
        import obstore

        where = self.url.key() or None
        try:
            stream = obstore.list(self.client(), where, chunk_size=1)
            return any(chunk for chunk in (next(iter(stream), []),))
        except Exception as exc:  # noqa: BLE001 - obstore's errors, said in one line
            raise self._refused(exc, where or "") from None

    def client(self) -> Any:
        """This process's obstore client (opened on first use, again after a fork)."""
        if self._client is None or self._pid != os.getpid():
            self._client, self._pid = _open(self.url, self.options), os.getpid()
        return self._client

    def _count(self, name: str, amount: int = 1) -> None:
        if self.counts is not None:
            self.counts.add(name, amount)

    def _refused(self, exc: Exception, where: str) -> DatasetError:
        said = _said(exc)
        place = self.url.of(where) if where else f"{self.url.scheme}://{self.url.bucket}"
        why = "cannot be listed"
        if "nosuchbucket" in said.replace(" ", "") or "bucket does not exist" in said:
            why = "does not exist"
        elif _denied(exc, said):
            why = "refused these credentials (access denied)"
        return DatasetError(
            f"{place} {why}: bucket {self.url.bucket}, credentials: {self.credentials()}"
            f"{_endpoint_words(self.options)} ({_first_line(exc)})"
        )

    def _failed(self, exc: Exception, key: str) -> Exception:
        said = _said(exc)
        if _not_found(exc, said):
            return CorruptSampleError(f"{self.url.of(key)} was listed but is gone")
        if _denied(exc, said):
            return self._refused(exc, key)
        return DatasetError(f"{self.url.of(key)} could not be read: {_first_line(exc)}")


def retry_cause(exc: Exception) -> str | None:
    """Why a failed request is worth another try (``throttled``, ``timeout``, ``reset``),
    or None: it is not."""
    said = _said(exc)
    if any(w in said for w in ("503", "slowdown", "slow down", "service unavailable", "429",
                               "too many requests", "throttl")):  # fmt: skip
        return "throttled"
    if "timed out" in said or "timeout" in said:
        return "timeout"
    if any(w in said for w in ("connection reset", "reset by peer", "broken pipe",
                               "error sending request", "incomplete", "unexpected eof",
                               "connection closed", "connection refused", "500",
                               "internal error")):  # fmt: skip
        return "reset"
    return None


def _open(url: StoreUrl, options: Mapping[str, str]) -> Any:
    """An obstore client for ``url``'s bucket, the environment's settings under
    ``options``; obstore's own retries off (ours count)."""
    try:
        from obstore.store import from_url
    except ImportError:
        raise ConfigError(
            f"reading {url} needs an object store client: pip install 'raytune_loader[s3]' "
            "(obstore)"
        ) from None
    from datetime import timedelta

    client_options: dict[str, Any] = {"connect_timeout": "5s", "timeout": "60s"}
    if (_endpoint(options) or "").startswith("http://"):
        client_options["allow_http"] = True
    extra: dict[str, Any] = {}
    if url.scheme == "s3" and os.environ.get("AWS_PROFILE") and not _has_keys(options):
        extra["credential_provider"] = _profile_credentials()
    retry = {"max_retries": 0, "retry_timeout": timedelta(seconds=1)}
    try:
        return from_url(f"{url.scheme}://{url.bucket}", config=dict(options) or None,
                        client_options=client_options, retry_config=retry, **extra)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - obstore's configuration errors
        keys = ", ".join(sorted(options)) or "none"
        raise ConfigError(
            f"{url}: the store client refused its settings (--storage-options keys: "
            f"{keys}): {_first_line(exc)}"
        ) from None


def _profile_credentials() -> Any:
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        raise ConfigError("AWS_PROFILE is read through boto3: pip install boto3") from None
    return Boto3CredentialProvider(boto3.Session(profile_name=os.environ["AWS_PROFILE"]))


def _endpoint(options: Mapping[str, str]) -> str | None:
    for key in ("aws_endpoint", "aws_endpoint_url", "endpoint", "endpoint_url"):
        if options.get(key):
            return str(options[key])
    env = os.environ
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT")


def _endpoint_words(options: Mapping[str, str]) -> str:
    endpoint = _endpoint(options)
    return f", endpoint {urlparse(endpoint).netloc}" if endpoint else ""


def _has_keys(options: Mapping[str, str]) -> bool:
    return any(k.lower().startswith("aws_access_key") for k in options)


def _said(exc: Exception) -> str:
    return str(exc).lower()


def _denied(exc: Exception, said: str) -> bool:
    name = type(exc).__name__
    return name in ("PermissionDeniedError", "UnauthenticatedError") or any(
        w in said for w in ("accessdenied", "access denied", "403", "forbidden",
                            "invalidaccesskeyid", "signaturedoesnotmatch", "credential")
    )  # fmt: skip


def _not_found(exc: Exception, said: str) -> bool:
    return type(exc).__name__ == "NotFoundError" or "nosuchkey" in said or "404" in said


def _first_line(exc: Exception) -> str:
    """The error's first line, any option's value that looks secret left out."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return line[:300]


def redacted(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` as a log line may show them: what looks like a secret hidden."""
    return {k: "***" if any(s in k.lower() for s in _SECRET) else str(v)
            for k, v in options.items()}  # fmt: skip

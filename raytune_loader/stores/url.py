"""Where data lives: a local path, or an object store's URL (``s3://bucket/prefix``).

:func:`parse` tells them apart once; :class:`StoreUrl` keeps an object store URL whole
(``s3://bucket/key`` must not become ``s3:/bucket/key``, as a ``Path`` makes it) and
joins keys under it. The package reads ``s3://`` (and ``s3a://``): AWS S3 and every
store that speaks its API (MinIO, Cloudflare R2, Ceph, Google Cloud Storage's XML API
with HMAC keys) through ``AWS_ENDPOINT_URL``; any other ``scheme://`` is refused in one
line that says so.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from raytune_loader.errors import DatasetError

SCHEMES = {"s3": "s3", "s3a": "s3"}
_THROUGH_S3 = {
    "gs": "Google Cloud Storage serves S3's API: s3://bucket/prefix with "
    "AWS_ENDPOINT_URL=https://storage.googleapis.com and an HMAC key as AWS_ACCESS_KEY_ID",
    "gcs": "Google Cloud Storage serves S3's API: s3://bucket/prefix with "
    "AWS_ENDPOINT_URL=https://storage.googleapis.com and an HMAC key as AWS_ACCESS_KEY_ID",
}
_URL = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<bucket>[^/]*)/?(?P<prefix>.*)$")


@dataclass(frozen=True)
class StoreUrl:
    """An object store location: its scheme (``s3``, ``gs``, ``az``), bucket (or
    container) and key prefix (no slash at either end; empty: the whole bucket)."""

    scheme: str
    bucket: str
    prefix: str = ""

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, *parts: str) -> str:
        """The key of ``parts`` under this prefix (``prefix/part/part``)."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def child(self, *parts: str) -> StoreUrl:
        """This location with ``parts`` appended to its prefix."""
        return StoreUrl(self.scheme, self.bucket, self.key(*parts))

    def of(self, key: str) -> str:
        """A key of this bucket as a URL (for messages)."""
        return f"{self.scheme}://{self.bucket}/{key}"


_ONE_SLASH = re.compile(r"^(?P<scheme>s3a?|gs|gcs|az|abfss?):/(?P<rest>[^/].*)$")


def mistyped(location: object) -> str | None:
    """The object store URL that ``location`` meant where it has one slash after its
    scheme (``s3:/bucket/prefix``, as ``pathlib.Path`` leaves ``s3://bucket/prefix``);
    None otherwise."""
    if isinstance(location, os.PathLike):  # a Path made of the URL: what left it so
        location = os.fspath(location)
    found = _ONE_SLASH.match(location) if isinstance(location, str) else None
    return f"{found['scheme']}://{found['rest']}" if found else None


def is_remote(location: object) -> bool:
    """Whether ``location`` (a ``--data-root``) names an object store, not a local path."""
    return isinstance(location, str) and _URL.match(location) is not None


def parse(location: str) -> StoreUrl:
    """The object store URL ``location`` names.

    Args:
        location: ``scheme://bucket/prefix``.

    Returns:
        The URL; a DatasetError for a scheme no store client here reads, or no bucket.
    """
    found = _URL.match(location)
    if found is None:
        raise DatasetError(f"{location} is not an object store URL (scheme://bucket/prefix)")
    scheme = SCHEMES.get(found["scheme"])
    if scheme is None:
        hint = _THROUGH_S3.get(found["scheme"], "use s3:// (any S3-compatible store) or a "
                               "local path (a mounted bucket)")  # fmt: skip
        raise DatasetError(f"{location}: {found['scheme']}:// is not read here; {hint}")
    if not found["bucket"]:
        raise DatasetError(f"{location} names no bucket: use {scheme}://bucket/prefix")
    return StoreUrl(scheme, found["bucket"], found["prefix"].strip("/"))

"""A bucket as Arrow's S3 filesystem: what Ray Data's own readers read a store's shards
through (``read_webdataset``, ``read_parquet`` of ``s3://`` paths, in Ray's read tasks).

The same settings as :class:`~raytune_loader.stores.store.Store`'s own client: the
endpoint, region and addressing style :meth:`StoreOptions.resolved` gives, unsigned for
a public bucket, and the credentials from where the AWS SDK looks in each process that
reads (the environment, ``~/.aws``, the node's role), never passed as values: a
filesystem is pickled into every read task. Arrow's client retries a throttled or failed
request itself, out of the package's counts: up to
:data:`~raytune_loader.stores.store.ATTEMPTS` attempts in this process, but pyarrow's
pickling drops the retry strategy, so Ray's read tasks get Arrow's default (3 attempts),
with Ray Data's own retries of a failed read on top.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from raytune_loader.errors import ConfigError
from raytune_loader.stores.store import ATTEMPTS, Store

if TYPE_CHECKING:
    import pyarrow.fs


def refused(store: Store) -> ConfigError | None:
    """Why Arrow's client cannot read ``store`` as its options say, or None: a
    ``profile`` that ``--storage-options`` set and the environment's ``AWS_PROFILE``
    does not (Arrow's client takes a profile from the environment only)."""
    options = store.options.resolved()
    if options.profile and options.profile != os.environ.get("AWS_PROFILE"):
        return ConfigError(
            f"Ray Data reads {store.url}'s shards with Arrow's S3 client, which takes a "
            f"profile from the environment only: export AWS_PROFILE={options.profile}, or "
            "pass --no-ray-data"
        )
    return None


def arrow_filesystem(store: Store) -> pyarrow.fs.S3FileSystem:
    """Arrow's S3 filesystem for ``store``'s bucket; what :func:`refused` says, raised."""
    from pyarrow.fs import AwsStandardS3RetryStrategy, S3FileSystem

    problem = refused(store)
    if problem is not None:
        raise problem
    options = store.options.resolved()
    endpoint = urlparse(options.endpoint_url) if options.endpoint_url else None
    return S3FileSystem(
        anonymous=options.unsigned,
        region=options.region or "us-east-1",
        endpoint_override=endpoint.netloc if endpoint else None,
        scheme=endpoint.scheme if endpoint else "https",
        force_virtual_addressing=not options.force_path_style,
        retry_strategy=AwsStandardS3RetryStrategy(max_attempts=ATTEMPTS),
    )

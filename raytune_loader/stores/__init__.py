"""Data in an object store: S3, and the stores that speak its API (R2, MinIO, GCS's
S3-compatible endpoint).

:mod:`~raytune_loader.stores.url` tells an object store's URL from a local path and
keeps it whole; :mod:`~raytune_loader.stores.store` lists a bucket once and reads its
objects with its own signed GETs, each retry backed off, with jitter, and counted by cause, and
what a measured window asked of the store (:class:`~raytune_loader.stores.store.StoreWatch`);
:mod:`~raytune_loader.stores.probe` measures the store for the profile (time to first
byte, a request's bandwidth, the top rate as requests in flight ramp);
:mod:`~raytune_loader.stores.kept` keeps what the profile reads again, so that each
object is fetched once;
:mod:`~raytune_loader.stores.arrow` is the bucket as Arrow's S3 filesystem, for Ray
Data's own readers of its shards.
Credentials come from where the user set them and never reach a message.

May import: the foundations.
"""

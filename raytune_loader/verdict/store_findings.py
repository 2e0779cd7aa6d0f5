"""Findings about data in an object store: what the store did, and what would pay.

:func:`store_findings` judges the tuned configuration's runs against the store it read:
single objects where the profile projects tar shards well past them
(``small_objects``), a store that throttled the runs (``throttled``), and a cached
winner's first epoch, cold, far slower than the warm ones after it (``first_epoch``).
Each :class:`~raytune_loader.verdict.finding.Finding` has its measured figure and its
fix.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from raytune_loader.candidates.rules import READ_AHEAD, applies
from raytune_loader.verdict.finding import Finding
from raytune_loader.verdict.selection import Candidate

if TYPE_CHECKING:
    from raytune_loader.tuning.costmodel import CostModel

SHARD_SAMPLES = 256  # images a shard the small-objects projection assumes (a few seconds' GET)
SHARD_READ_AHEAD = max(READ_AHEAD)  # shards a worker fetches ahead in it: the search's most
SHARDS_GAIN = 1.25  # shards projected this many times the winner's rate: a finding
FIRST_EPOCH_RATIO = 1.5  # warm epochs this many times the cold first one: a finding


def store_findings(winner: Candidate, model: CostModel | None = None) -> list[Finding]:
    """Every finding about the store the tuned configuration read (none for local data);
    with the search's cost ``model``, what shards would gain."""
    found = [_small_objects(winner, model), _throttled(winner), _first_epoch(winner)]
    return [f for f in found if f is not None]


def _small_objects(winner: Candidate, model: CostModel | None) -> Finding | None:
    """Single objects from a store, one GET a sample, where the profile projects the same
    workers reading tar shards (a GET for :data:`SHARD_SAMPLES` samples, that long a
    body, :data:`SHARD_READ_AHEAD` fetched ahead) at least :data:`SHARDS_GAIN` times
    faster. The projection is the model's ratio, shards over single objects, applied to
    the winner's measured rate (the model's own error cancels)."""
    profile = model.profile if model is not None else None
    ttfb = (profile.store_latency or {}).get("ttfb_p50_s") if profile is not None else None
    measured = winner.stats("samples_per_s")
    config = winner.config
    # a Ray Data winner (no fetch threads): on a bucket its actors read objects only
    if (model is None or profile is None or not ttfb or measured is None
            or config.access != "map" or profile.requests_per_sample < 0.5
            or not applies("fetch_threads", config.values())):  # fmt: skip
        return None
    shard_s = ttfb + SHARD_SAMPLES * max(0.0, profile.fetch_s - ttfb)  # the first byte once
    sharded = replace(model, profile=replace(
        profile, fetch_s=shard_s, requests_per_sample=1.0 / SHARD_SAMPLES))  # fmt: skip
    single = model.predict(config)
    shards = sharded.predict(replace(config, fetch_threads=SHARD_READ_AHEAD))
    if single is None or shards is None:
        return None
    gain = shards.samples_per_s / single.samples_per_s
    if gain < SHARDS_GAIN:
        return None
    in_flight = config.requests_in_flight
    projected = measured.median * gain
    figure = (
        f"each sample is an object of its own, a GET of {profile.fetch_s * 1e3:.0f} ms "
        f"({ttfb * 1e3:.0f} ms of it to the first byte); the tuned loader reached "
        f"{measured.median:.0f} samples/s with {in_flight} requests in flight. The profile "
        f"projects {projected:.0f} samples/s ({gain:.1f}x, bound: {shards.bound}) for the same "
        f"workers reading tar shards of {SHARD_SAMPLES} images, a GET a shard, "
        f"{SHARD_READ_AHEAD} fetched ahead"
    )
    fix = (
        "write the images as webdataset tar shards of a few hundred images "
        "(python experiments/to_shards.py --images DIR --out OUT, or webdataset's "
        "ShardWriter), upload them, and search them: --dataset webdataset --data-root "
        "'s3://bucket/shards/train-{0000..0127}.tar'"
    )
    values = {"measured_samples_per_s": measured.median, "projected_samples_per_s": projected,
              "gain": gain, "bound": shards.bound, "shard_samples": SHARD_SAMPLES,
              "request_s": profile.fetch_s, "ttfb_s": ttfb}  # fmt: skip
    return Finding("small_objects", figure, fix, None, values)


def _throttled(candidate: Candidate) -> Finding | None:
    """What an object store did to the candidate's runs: throttled it (503 SlowDown, 429).
    Counted over all its measured windows: one throttled GET in any of them is one. The
    GETs sent are those answered (``store_requests``) and those tried again, by cause."""
    runs = [o.metrics for o in candidate.ok if o.metrics is not None and o.metrics.store_requests]
    throttled = sum(m.store_throttled or 0 for m in runs)
    requests = sum(m.store_requests or 0 for m in runs)
    sent = requests + throttled + sum((m.store_timeouts or 0) + (m.store_resets or 0) for m in runs)
    wall = sum(m.wall_s or 0.0 for m in runs)
    if not throttled or not wall:
        return None
    config = candidate.config
    in_flight = config.requests_in_flight
    said, knobs = config.requests_in_flight_terms
    allowed = requests / wall
    figure = (
        f"the object store answered {throttled} of the {sent} GETs sent in the {len(runs)} "
        f"measured windows with 503 SlowDown or 429 (retried, backed off): it allowed about "
        f"{allowed:.0f} requests/s to {in_flight} in flight ({said})"
    )
    fix = (
        f"fewer requests in flight ({knobs}), or fewer, larger objects: "
        "the images in webdataset tar shards (experiments/to_shards.py), a request per "
        "shard rather than per image; a bucket's limit is per prefix, so shards spread "
        "over several prefixes"
    )
    values = {"throttled": throttled, "requests": requests, "sent": sent,
              "allowed_requests_per_s": allowed, "in_flight": in_flight}  # fmt: skip
    return Finding("throttled", figure, fix, None, values)


def _first_epoch(winner: Candidate) -> Finding | None:
    """A winner that keeps a bucket's objects in a local cache reads its first epoch from
    the store, filling the cache (each run's cold pass), and the later ones from the
    disk: a finding where those are :data:`FIRST_EPOCH_RATIO` times as fast or more."""
    cold, warm = winner.stats("cold_samples_per_s"), winner.stats("samples_per_s")
    if not winner.config.cache or cold is None or warm is None or not cold.median:
        return None
    ratio = warm.median / cold.median
    if ratio < FIRST_EPOCH_RATIO:
        return None
    figure = (
        f"the first epoch reads the bucket, filling the local cache, at {cold.median:.0f} "
        f"samples/s (the loader's pass, its workers' start included); the epochs after it "
        f"train from the cache at {warm.median:.0f} samples/s: the first takes about "
        f"{ratio:.1f} times as long as each later one"
    )
    fix = (
        "for many epochs nothing: the cache pays from the second. For a short training, "
        "warm the cache before the job (one pass of tuned.dataloader(tuned.image_dataset("
        "'s3://...')) on the node fills its raytune_loader/objects, under $XDG_CACHE_HOME "
        "or ~/.cache), or, where the "
        "first epoch is all that counts, search with --cache-bytes 0"
    )
    values = {"cold_samples_per_s": cold.median, "warm_samples_per_s": warm.median,
              "ratio": ratio}  # fmt: skip
    return Finding("first_epoch", figure, fix, None, values)

"""A store measured as the profile meets it: time to first byte, a request's bandwidth,
and the most GETs a second it answers as requests in flight are ramped.

:func:`latency` sends GETs one at a time, each of an object's first MiB (its first byte
is the whole object's); :func:`top_rate` ramps the requests in flight until a step gains
little, or answers more than any candidate could ask. The cost model's latency term and
its store part come from these; ``best_config.json`` records them, and a tuned loader's
check in training times the first bytes again.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from raytune_loader.stores.colocated import ServerClock, server_on_this_node
from raytune_loader.stores.store import Store

RAMP = (4, 16, 64)  # requests in flight the top rate is tried at
RAMP_GAIN = 1.10  # a step that gains less than this has found the top
RAMP_PER_THREAD = 4  # GETs each thread of a step makes, one after another...
# ... fewer (at least RAMP_LEAST_PER_THREAD) where that many would hold a thread past
# this: a bucket's 5 MB shards take 0.43 s a GET, and 4 a thread made the ramp 8 s of a
# profile. Two at the least: a step of one GET a thread would time its slowest GET
RAMP_THREAD_S = 1.0
RAMP_LEAST_PER_THREAD = 2


def ramp_per_thread(measured: Latency | None) -> int:
    """GETs each thread of :func:`top_rate`'s steps makes: :data:`RAMP_PER_THREAD`, as
    many as fit in :data:`RAMP_THREAD_S` where a request (``measured``, the latency
    probe's mean) takes longer, and at least :data:`RAMP_LEAST_PER_THREAD`."""
    if measured is None or measured.request_s <= 0:
        return RAMP_PER_THREAD
    fit = int(RAMP_THREAD_S // measured.request_s)
    return max(RAMP_LEAST_PER_THREAD, min(RAMP_PER_THREAD, fit))


def top_rate(
    store: Store, keys: Sequence[str], per_thread: int = RAMP_PER_THREAD, enough: float = math.inf
) -> float:
    """The most GETs a second the store answered this process, its requests in flight
    ramped through :data:`RAMP` until a step gains less than 10% (the store's limit, or
    this node's path to it, as a trial would meet it) or answers ``enough`` (more than
    any candidate could ask: a higher top bounds none); each thread makes ``per_thread``
    GETs (:func:`ramp_per_thread`)."""
    best = 0.0
    for threads in RAMP:
        chosen = [keys[i % len(keys)] for i in range(threads * per_thread)]
        with ThreadPoolExecutor(threads, "raytune-ramp") as pool:
            started = time.perf_counter()
            for _ in pool.map(store.get, chosen):
                pass
            rate = len(chosen) / (time.perf_counter() - started)
        gained, best = rate >= best * RAMP_GAIN, max(best, rate)
        if not gained or best >= enough:
            break
    return best


LATENCY_REQUESTS = 48  # GETs the latency probe times, one at a time
# ... within about this many seconds, and at least LATENCY_LEAST: small objects at 30 ms
# take ~2 s for the 48
LATENCY_BUDGET_S = 2.5
LATENCY_LEAST = 8
# each asks for an object's first MiB: its first byte is the whole object's, and a MiB's
# body tells the bandwidth. Read whole, a bucket's 5 MB shards held the probe 0.43 s a
# GET (3.6 s of a 15 s profile for its 8); a 100 MB shard would hold it 8 s a GET
LATENCY_BYTES = 1 << 20


@dataclass(frozen=True)
class Latency:
    """A store's latency as one request at a time meets it: time to first byte (median
    and 99th percentile, the slowest where fewer than a hundred were timed) and the
    bandwidth of one request, its bytes over the time from first byte to last (of an
    object's first :data:`LATENCY_BYTES`)."""

    ttfb_p50_s: float
    ttfb_p99_s: float
    mbit_per_s: float | None  # None: the objects were too small to tell
    requests: int
    # a server on this node: its CPU-seconds a request (None: the store is elsewhere)
    server_cpu_s: float | None = None
    # a request's mean seconds, sent to its last byte: of a whole object (its bytes past
    # the probe's first MiB at the probe's bandwidth)
    request_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """Its figures, rounded for a JSON file."""
        bandwidth = round(self.mbit_per_s, 1) if self.mbit_per_s is not None else None
        served = round(self.server_cpu_s, 6) if self.server_cpu_s is not None else None
        return {"ttfb_p50_s": round(self.ttfb_p50_s, 4), "ttfb_p99_s": round(self.ttfb_p99_s, 4),
                "mbit_per_s_per_request": bandwidth, "latency_requests": self.requests,
                "server_cpu_s_per_request": served}  # fmt: skip


def latency(
    store: Store, keys: Sequence[str], requests: int = LATENCY_REQUESTS, *, served: bool = False
) -> Latency | None:
    """The store's :class:`Latency` from ``requests`` GETs of ``keys`` (cycled), one at a
    time so that none waits behind another, fewer (at least :data:`LATENCY_LEAST`) where
    they take more than :data:`LATENCY_BUDGET_S`, each of an object's first
    :data:`LATENCY_BYTES`; None where none was answered. With ``served`` (the
    profile's), where the store's server runs on this node, its CPU-seconds a request
    too (a request of those bytes: of a larger object, less than its whole GET's)."""
    firsts, bodies, totals, bytes_read, wholes, sent = [], 0.0, 0.0, 0, 0, 0
    transport = store.transport()
    servers = server_on_this_node(transport.options.endpoint_url) if served else []
    clock = ServerClock(servers) if servers else None
    if clock is not None and not clock.start():
        clock = None
    started = time.perf_counter()
    for index in range(requests):
        if index >= LATENCY_LEAST and time.perf_counter() - started > LATENCY_BUDGET_S:
            break
        sent += 1
        key = keys[index % len(keys)]
        status, first, total, size, whole = transport.timed(store.url.bucket, key, LATENCY_BYTES)
        if status != 200:
            continue
        firsts.append(first)
        bodies, totals = bodies + (total - first), totals + total
        bytes_read, wholes = bytes_read + size, wholes + whole
    server_s = clock.seconds() if clock is not None else None
    if not firsts:
        return None
    firsts.sort()
    p99 = firsts[min(len(firsts) - 1, math.ceil(0.99 * len(firsts)) - 1)]
    # a body that came in one read takes no measurable time: no bandwidth to tell
    told = bodies > 1e-3 * len(firsts)
    bandwidth = bytes_read * 8 / 1e6 / bodies if told else None
    per_request = server_s / sent if server_s is not None else None
    # the objects' bytes past those read, at the bandwidth the read ones came at
    unread_s = (wholes - bytes_read) * bodies / bytes_read if told else 0.0
    mean_s = (totals + unread_s) / len(firsts)
    return Latency(statistics.median(firsts), p99, bandwidth, len(firsts), per_request, mean_s)

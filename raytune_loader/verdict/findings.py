"""What would break training hours later, found in the measurements, with the fix.

:func:`probe_configs` names the tuned configuration's variants the findings need
(:mod:`raytune_loader.verdict.probes` measures them after verification): persistent workers the
other way (an epoch's start, both ways), in order the other way where a step's wait has
a long tail, and worker threads the other way where worker processes ran more busy
threads than the CPUs reserved for them. :func:`findings` then judges the tuned
configuration's verification runs, the probes and the search's trials: memory that one
epoch of the whole dataset would grow past a share of the node's free memory
(``--memory-share``), workers oversubscribing their CPUs, stragglers stalling the loop,
an epoch start that costs minutes. Each :class:`Finding` has its measured figure, its
projection where there is one, and its fix; :func:`watch_section` is
``best_config.json``'s ``watch``: the tuned configuration's watched figures and the
memory series the report plots. The thresholds below are set so that the default dataset
and the test datasets give no finding (``tests/test_findings.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.engines import engine_of
from raytune_loader.machine.watch import FOLLOWED, MAIN, Watch, wait_tail
from raytune_loader.measuring.memoryfit import MemoryFit
from raytune_loader.measuring.records import MEASURED, TrialRecord
from raytune_loader.verdict.finding import Finding
from raytune_loader.verdict.selection import Candidate, fitting
from raytune_loader.verdict.store_findings import store_findings

if TYPE_CHECKING:
    from raytune_loader.tuning.costmodel import CostModel

OVERSUBSCRIBED = 0.5  # busy threads per worker above its CPUs by this: oversubscribed
STRAGGLER_RATIO = 5.0  # a step's p99 wait at least this many times the median
STRAGGLER_TAIL = 0.10  # and waits above twice the median taking this share of the window
MIN_STEPS = 50  # steps, over the runs, below which a 99th percentile says nothing
HELPED = 0.05  # faster by more than this (median of the rounds), and in every round: it helped
# an epoch start this share of an epoch's time slower without persistent workers, and
# above one batch's jitter: with a fixed 5 s floor, the default dataset's 2,000 images
# (2.5 s an epoch at 792 samples/s) started each epoch 3.8 s later without, unreported
EPOCH_START_SHARE = 0.01
EPOCH_START_S = 0.5
SERIES_POINTS = 120  # readings per process kept for the report's plot
TUNED = "tuned"  # the tuned configuration's name among the probes
ACTOR_MEMORY_SHARE = 0.5  # a Ray Data pool's resident memory above this share of the free
BACKPRESSURE_SHARE = 0.25  # the executor holding tasks back this share of the window's time
BACKPRESSURE_WAIT = 0.10  # while the loop waited this share of the window


@dataclass(frozen=True)
class Rules:
    """What the findings are judged against."""

    memory_share: float = 1.0  # --memory-share
    cpus_per_worker: float = 1.0  # --cpus-per-worker


def probe_configs(
    winner: Candidate, records: Sequence[TrialRecord], rules: Rules
) -> dict[str, LoaderConfig]:
    """The tuned configuration's variants the findings measure, by the knob flipped."""
    config = fitting(winner)
    probes: dict[str, LoaderConfig] = {}
    if config.num_workers and config.workers == "process":
        probes["persistent_workers"] = replace(
            config, persistent_workers=not config.persistent_workers
        )
        if _oversubscribed(winner, records, rules) is not None:
            threads = None if config.worker_threads else 1
            probes["worker_threads"] = replace(config, worker_threads=threads)
    if config.num_workers and _tail(winner) is not None:
        probes["in_order"] = replace(config, in_order=not config.in_order)
    return probes


def _median(candidate: Candidate | None, metric: str) -> float | None:
    stats = candidate.stats(metric) if candidate is not None else None
    return stats.median if stats else None


def _by_name(probes: Sequence[Candidate]) -> dict[str, Candidate]:
    return {c.name: c for c in probes if c.ok}


def findings(
    winner: Candidate,
    probes: Sequence[Candidate],
    records: Sequence[TrialRecord],
    rules: Rules,
    model: CostModel | None = None,
) -> list[Finding]:
    """Every finding about the tuned configuration, its probes and the search's trials
    (and, with the search's cost ``model``, what shards would gain from a store)."""
    probed = _by_name(probes)
    found = [
        _memory(winner, rules),
        _threads(winner, records, probed, rules),
        _stragglers(winner, probed),
        _epoch_start(winner, probed),
    ]
    found += store_findings(winner, model)
    return [f for f in found if f is not None] + raydata_findings(winner)


def _fit(winner: Candidate) -> MemoryFit | None:
    """The fit of the run whose projection is the median (one run's, for its cause)."""
    runs = [o.metrics for o in winner.ok if o.metrics and o.metrics.memory is not None]
    runs = [m for m in runs if m.projected_epoch_growth_bytes is not None]
    if not runs:
        return None
    runs.sort(key=lambda m: m.projected_epoch_growth_bytes or 0)
    return runs[len(runs) // 2].memory


def _memory(winner: Candidate, rules: Rules) -> Finding | None:
    growth = _median(winner, "projected_epoch_growth_bytes")
    free = min((o.metrics.memory_free_bytes for o in winner.ok
                if o.metrics and o.metrics.memory_free_bytes), default=None)  # fmt: skip
    fit = _fit(winner)
    if growth is None or free is None or fit is None or growth <= rules.memory_share * free:
        return None
    current = _median(winner, "watched_bytes") or 0
    workers = len(fit.shared_bytes)
    copies = fit.workers.copies >= max(fit.workers.kept, fit.main.kept)
    per_sample = fit.per_sample
    who = "each worker" if workers else "the training process"
    cause = (
        "copy-on-write: the workers copy the main process's pages as reference counts "
        "touch the dataset's Python objects, up to all they share with it"
        if copies
        else f"{who} keeps new memory for what it reads"
    )
    share = "all" if rules.memory_share >= 1 else f"{rules.memory_share:.0%}"
    epoch = fit.epoch or 0
    figure = (
        f"memory grows {_bytes(per_sample)} per sample read ({cause}); one epoch of "
        f"{epoch:,} samples would add {_bytes(growth)} to the {_bytes(current)} the "
        f"measurement holds ({workers} worker processes, {fit.ranks} rank(s)), more than "
        f"{share} of the node's {_bytes(free)} free"
    )
    fix = (
        "keep per-sample metadata in numpy or pyarrow arrays (or tensors) instead of lists "
        "of Python objects, dicts or strings, or build it in each worker from worker_init_fn; "
        "fewer workers copy less"
        if copies
        else "bound or remove what the dataset or its transforms keep per sample (a cache, "
        "a list that grows in __getitem__), or keep it in shared memory built once"
    )
    projection = {
        "epoch_samples": fit.epoch,
        "growth_bytes": int(growth),
        "current_bytes": int(current),
        "total_bytes": int(current + growth),
        "free_bytes": int(free),
        "memory_share": rules.memory_share,
        "workers": workers,
        "ranks": fit.ranks,
    }
    values = {
        "copies_per_sample_bytes": fit.workers.copies,
        "kept_per_sample_bytes": fit.workers.kept + fit.main.kept,
    }
    return Finding("memory", figure, fix, projection, values)


def _busy(candidate: Candidate) -> float | None:
    return _median(candidate, "worker_busy_threads")


def _oversubscribed(
    winner: Candidate, records: Sequence[TrialRecord], rules: Rules
) -> float | None:
    """Busy threads per worker process where workers ran more than their CPUs: the
    tuned configuration's runs, else the search's trials with the libraries' pools."""
    limit = rules.cpus_per_worker + OVERSUBSCRIBED
    tuned = _busy(winner)
    if tuned is not None and tuned > limit:
        return tuned
    default = [r.metrics.worker_busy_threads for r in records if r.status in MEASURED
               and r.config and r.config.worker_threads is None
               and r.metrics and r.metrics.worker_busy_threads is not None]  # fmt: skip
    return max(default) if default and max(default) > limit else None


def _threads(
    winner: Candidate,
    records: Sequence[TrialRecord],
    probed: dict[str, Candidate],
    rules: Rules,
) -> Finding | None:
    busy = _oversubscribed(winner, records, rules)
    if busy is None:
        return None
    pools = _pools(winner)
    figure = (
        f"worker processes ran {busy:.1f} busy threads each on {rules.cpus_per_worker:g} "
        f"CPU reserved per worker (thread pools they inherit: {pools or 'unknown'})"
    )
    limited = {True: None, False: None}  # samples/s with worker_threads 1, and without
    flipped = probed.get("worker_threads")
    if flipped is not None and TUNED in probed:
        ours = probed[TUNED]
        limited[bool(ours.config.worker_threads)] = _median(ours, "samples_per_s")
        limited[bool(flipped.config.worker_threads)] = _median(flipped, "samples_per_s")
    one, default = limited[True], limited[False]
    measured = (
        f": {one / default:.2f}x the samples/s of the libraries' default "
        f"({one:.0f} against {default:.0f}, measured)"
        if one and default
        else ""
    )
    tuned = fitting(winner)
    if tuned.worker_threads:
        fix = f"worker_threads=1, tuned and applied by .dataloader(){measured}"
    elif tuned.num_workers and tuned.workers == "process":
        fix = (
            f"worker_threads=1 in best_config.json's worker_init, which .dataloader() applies "
            f"(threadpoolctl and torch.set_num_threads in each worker){measured}; the search "
            "did not choose it"
        )
    else:
        fix = (
            "the tuned loader has no worker processes; with your own, hold each worker's "
            "pools to one thread (worker_threads=1, or OMP_NUM_THREADS=1)"
        )
    values = {"busy_threads_per_worker": busy, "samples_per_s_one_thread": one,
              "samples_per_s_default_threads": default}  # fmt: skip
    return Finding("threads", figure, fix, None, values)


def _pools(candidate: Candidate) -> str:
    watched = _watches(candidate)
    pools = watched[0].libraries if watched else ()
    return ", ".join(f"{name} {threads}" for name, threads in pools)


def _watches(candidate: Candidate) -> list[Watch]:
    return [o.metrics.watch for o in candidate.ok if o.metrics and o.metrics.watch]


def waits(candidate: Candidate) -> tuple[float, float, float, int] | None:
    """(p50, p99, tail share, steps) of a step's wait for its batch, pooled over the
    candidate's runs; None without any."""
    runs = [o.metrics for o in candidate.ok if o.metrics and o.metrics.waits]
    pooled = [w for m in runs for w in m.waits]
    if not pooled:
        return None
    p50, p99, tail = wait_tail(pooled, sum(m.wall_s for m in runs))
    return p50, p99, tail, len(pooled)


def _tail(candidate: Candidate) -> tuple[float, float, float] | None:
    """(p50, p99, tail share) where a step's wait has a straggler's long tail, over
    enough steps for a 99th percentile to mean something."""
    found = waits(candidate)
    if found is None:
        return None
    p50, p99, tail, steps = found
    if steps < MIN_STEPS or p99 < STRAGGLER_RATIO * max(p50, 1e-4) or tail < STRAGGLER_TAIL:
        return None
    return p50, p99, tail


def _faster(fast: Candidate, slow: Candidate) -> float | None:
    """How much faster ``fast`` ran than ``slow``, when beyond noise: faster in every
    round (the two ran side by side in each, so a slower moment of the machine hits
    both) and by more than HELPED over the rounds' median ratio."""
    ratios = [
        f.metrics.samples_per_s / s.metrics.samples_per_s
        for f, s in zip(fast.outcomes, slow.outcomes, strict=False)
        if f.metrics is not None and s.metrics is not None and s.metrics.samples_per_s
    ]
    if not ratios:
        return None
    gain = statistics.median(ratios) - 1
    return gain if min(ratios) > 1 and gain > HELPED else None


def _stragglers(winner: Candidate, probed: dict[str, Candidate]) -> Finding | None:
    """A long tail that putting batches out of order measurably shortens: a few slow
    samples stalling an in-order loader (a tail that does not shorten is the loader's
    own pace, which the search's other settings address)."""
    found = _tail(winner)
    tuned, flipped = probed.get(TUNED), probed.get("in_order")
    if found is None or tuned is None or flipped is None:
        return None
    ordered, unordered = (tuned, flipped) if tuned.config.in_order else (flipped, tuned)
    gain = _faster(unordered, ordered)
    if gain is None:
        return None
    p50, p99, tail = found
    fast, slow = _median(unordered, "samples_per_s"), _median(ordered, "samples_per_s")
    figure = (
        f"a step's wait for its batch: p99 {p99 * 1e3:.1f} ms, {p99 / max(p50, 1e-6):.0f}x the "
        f"median {p50 * 1e3:.1f} ms; waits above twice the median took {tail:.0%} of the window"
    )
    chosen = "tuned, " if not fitting(winner).in_order else ""
    fix = (
        f"in_order=False ({chosen}measured): {gain:.0%} more samples/s ({fast:.0f} against "
        f"{slow:.0f} in order), the loop taking another worker's batch while a slow sample "
        "loads; find the slow samples (cold or remote files, outsized images)"
    )
    values = {"p50_s": p50, "p99_s": p99, "tail_frac": tail,
              "samples_per_s_in_order": slow, "samples_per_s_unordered": fast}  # fmt: skip
    return Finding("stragglers", figure, fix, None, values)


def epoch_starts(winner: Candidate, probed: dict[str, Candidate]) -> dict[str, float | None]:
    """Seconds an epoch takes to start with persistent workers and without (measured:
    the tuned configuration and its persistent_workers probe), by its own setting."""
    config = fitting(winner)
    out: dict[str, float | None] = {"persistent": None, "fresh": None}
    if config.num_workers == 0 or config.workers != "process":
        out["fresh"] = _median(winner, "epoch_start_s")  # nothing to keep between epochs
        return out
    out["persistent" if config.persistent_workers else "fresh"] = _median(winner, "epoch_start_s")
    flipped = probed.get("persistent_workers")
    if flipped is not None:
        out["fresh" if config.persistent_workers else "persistent"] = _median(
            flipped, "epoch_start_s"
        )
    return out


def _epoch_start(winner: Candidate, probed: dict[str, Candidate]) -> Finding | None:
    config = fitting(winner)
    starts = epoch_starts(winner, probed)
    kept, fresh = starts["persistent"], starts["fresh"]
    speed = _median(winner, "samples_per_s")
    fits = [o.metrics.memory for o in winner.ok if o.metrics and o.metrics.memory]
    epoch = fits[0].epoch if fits else None
    if config.persistent_workers or kept is None or fresh is None or not speed or not epoch:
        return None
    saved, epoch_s = fresh - kept, epoch / speed
    if saved < EPOCH_START_S or saved < EPOCH_START_SHARE * epoch_s:
        return None
    figure = (
        f"each epoch starts in {fresh:.1f} s without persistent workers, {kept:.1f} s with "
        f"them: {saved / epoch_s:.0%} of an epoch of {epoch:,} samples ({epoch_s:.0f} s)"
    )
    fix = f"persistent_workers=True saves {saved:.1f} s an epoch (measured)"
    return Finding("epoch_start", figure, fix, None, {"persistent_s": kept, "fresh_s": fresh})


def raydata_findings(candidate: Candidate) -> list[Finding]:
    """What would break or slow a Ray Data candidate's training later, from its runs:
    bytes spilled from the object store during the window, actors whose resident memory
    would crowd their nodes (Ray's object store budget does not count it), the executor
    holding the actors back while the loop waited."""
    if not engine_of(candidate.config).remote:
        return []
    found = [_spilled(candidate), _actor_memory(candidate), _backpressure(candidate)]
    return [f for f in found if f is not None]


def _spilled(candidate: Candidate) -> Finding | None:
    spilled = _median(candidate, "store_spilled_bytes")
    samples = _median(candidate, "samples")
    if not spilled or spilled <= 0:
        return None
    per_sample = f", {_bytes(spilled / samples)} a sample trained" if samples else ""
    figure = (
        f"Ray spilled {_bytes(spilled)} from the object store to disk during the measured "
        f"window{per_sample} (the cluster's count: other work spills into it too)"
    )
    fix = (
        "set object_store_bytes below the object store's size (Ray Data then holds the "
        "actors back instead of spilling), smaller map calls (map_batch_size) or blocks "
        "(block_bytes), or fewer bytes across: uint8 images (a quarter of float32's) or the "
        "encoded files"
    )
    return Finding("spilled", figure, fix, None, {"spilled_bytes": spilled})


def _actor_memory(candidate: Candidate) -> Finding | None:
    rss = _median(candidate, "actor_rss_bytes")
    free = min((o.metrics.actor_free_bytes for o in candidate.ok
                if o.metrics and o.metrics.actor_free_bytes), default=None)  # fmt: skip
    actors = candidate.config.pool_size
    if not rss or not free or rss * actors <= ACTOR_MEMORY_SHARE * free:
        return None
    ray_figure = _median(candidate, "actor_uss_ray_bytes")
    ray_words = f"; Ray Data's own figure for its tasks: {_bytes(ray_figure)}" if ray_figure else ""
    figure = (
        f"each actor holds {_bytes(rss)} resident{ray_words}: {actors} actors would hold "
        f"{_bytes(rss * actors)}, more than {ACTOR_MEMORY_SHARE:.0%} of the {_bytes(free)} "
        "their node had free (an object store budget does not count it)"
    )
    fix = (
        "fewer actors on a node (more cpus_per_actor), smaller map calls (map_batch_size), or "
        "nodes with more memory for the actors"
    )
    values = {"actor_rss_bytes": rss, "actor_uss_ray_bytes": ray_figure, "free_bytes": free}
    return Finding("actor_memory", figure, fix, None, values)


def _backpressure(candidate: Candidate) -> Finding | None:
    held = _median(candidate, "backpressure_s")
    wall = _median(candidate, "wall_s")
    waited = _median(candidate, "data_wait_frac")
    if not held or not wall or waited is None:
        return None
    if held < BACKPRESSURE_SHARE * wall or waited < BACKPRESSURE_WAIT:
        return None
    budget = candidate.config.object_store_bytes
    figure = (
        f"Ray Data held the actors' tasks back for {held:.1f} s of the segment (the window "
        f"lasted {wall:.1f} s) while the loop waited {waited:.0%} of the window for batches"
    )
    fix = (
        f"raise object_store_bytes ({_bytes(budget)} now) or leave it to Ray's share"
        if budget
        else "fewer bytes in flight: uint8 images or the encoded files across, smaller map "
        "calls (map_batch_size) or a lower prefetch_batches"
    )
    values = {"backpressure_s": held, "window_s": wall, "data_wait_frac": waited}
    return Finding("backpressure", figure, fix, None, values)


def watch_section(winner: Candidate, probes: Sequence[Candidate]) -> dict[str, Any]:
    """``best_config.json``'s ``watch``: what was watched in the tuned configuration's
    verification runs (medians), and one run's memory readings for the report's plot."""
    probed = _by_name(probes)
    watched = _watches(winner)
    fit = _fit(winner)
    pooled = waits(winner)
    cost = sum(w.cost_s for w in watched)
    watching = sum(w.watched_s for w in watched)
    return {
        "runs": len(winner.ok),
        "first_batch_s": _median(winner, "first_batch_s"),
        "epoch_start_s": epoch_starts(winner, probed),
        "data_wait": dict(zip(WAIT_KEYS, pooled, strict=True)) if pooled else None,
        "memory": {
            "growth_per_sample_bytes": _median(winner, "memory_growth_per_sample"),
            "epoch_samples": fit.epoch if fit else None,
            "epoch_growth_bytes": _median(winner, "projected_epoch_growth_bytes"),
            "watched_bytes": _median(winner, "watched_bytes"),
            "free_bytes": _median(winner, "memory_free_bytes"),
            "series": _series(watched[0]) if watched else None,
        },
        "threads": {
            "busy_per_worker": _median(winner, "worker_busy_threads"),
            "per_worker": _median(winner, "worker_thread_count"),
            "worker_cpu_s": _median(winner, "worker_cpu_s"),
            "pools": [
                {"library": name, "threads": n}
                for name, n in (watched[0].libraries if watched else ())
            ],  # fmt: skip
        },
        "cost": {"seconds": cost, "share_of_one_cpu": cost / watching if watching else None},
    }


WAIT_KEYS = ("p50_s", "p99_s", "tail_frac", "steps")


def _series(watched: Watch) -> dict[str, Any]:
    """Memory against samples read: each process's resident anonymous memory, and the
    followed worker's private memory, thinned to SERIES_POINTS readings each."""
    processes = []
    for worker in sorted({r.worker for r in watched.readings}):
        readings = [r for r in watched.readings if r.worker == worker]
        kept = readings[:: max(1, -(-len(readings) // SERIES_POINTS))]
        processes.append({
            "worker": None if worker == MAIN else worker,
            "samples_read": [r.reads for r in kept],
            "anonymous_bytes": [r.anon for r in kept],
        })  # fmt: skip
    followed = [r for r in watched.readings if r.worker == FOLLOWED and r.uss is not None]
    return {
        "window": list(watched.window),
        "processes": processes,
        "private": {
            "samples_read": [r.reads for r in followed],
            "bytes": [r.uss for r in followed],
        },
    }


def _bytes(count: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"

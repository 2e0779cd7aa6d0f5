"""A model of where a candidate's time goes, from the profile's measured costs.

Per batch of B samples, the training process spends the step (B / ceiling), what
it costs to receive the batch from a worker (nothing extra without workers, where
it makes the batch itself) and the device-side stages; each worker spends B / (its
per-core rate) plus the collate and hand-over (into shared memory and sent, for a
process: the profile's pace of one worker over ready samples). A pipeline goes at
the pace of its slowest part:

- the training process: step + receive + finish (+ the whole worker side without
  workers);
- the workers together: (worker side + collate) / workers;
- on a CPU, the cores: every CPU-second of a batch, the step's and the workers',
  shared by the usable cores (the step and the workers run on the same cores).

Data on an object store adds, to whoever makes a batch, the wait for its objects: the
profile's mean request time for each wave of ``fetch_threads`` requests in flight
(a batch of B objects in ceil(B / fetch_threads) waves, waited for before they are
decoded; a stream's batch its share of a shard's GET, ``fetch_threads`` shards fetched
ahead by threads of their own while the worker decodes, so that with more than one
ahead only what the decoding does not cover is waited for); the wait takes no core. The
store itself is a part too: no candidate reads faster than the most GETs a second it
answered the profile's ramp of requests in flight (``store_rate``), shared by the ranks.
A candidate that keeps the objects in a local cache is modelled warm, as the epochs
after the first read it: no wait, no store part, and the profile's per-core rate on a
warm cache (a file read, no request to sign and parse); its first, cold epoch is
measured apart. A store whose server runs on this node (a MinIO beside the trainer, the
tests' server) spends its CPU-seconds a request (:attr:`Profile.server_cpu_s`) on the
cores the step and the workers share, so on a CPU they join the cores' part.

Thread workers are modelled as processes with a thread's cheaper receive; what
they lose to the GIL shows in the model's measured error, which the search uses
as its margin.

prefetch, persistent workers, the order and the start method do not change the steady
pace in this model; the search tunes them around the structures the model ranks. With
several ranks each has its share of the cores, and the node's rate is ranks x one
rank's.

A Ray Data candidate's actors run the same worker side as a worker (on a store, a map
call's objects fetched :data:`~raytune_loader.candidates.rules.ACTOR_FETCHES` at a
time), plus what putting
a sample into Ray's object store costs them (:data:`OBJECT_STORE`: a cost per sample
and one per byte, measured on one node by ``experiments/raydata_overhead.py``); the
training process pays what taking it out costs: as the profile timed it on the trials'
node from an actor on another node (the transfer, formatting and Ray Data's executor
included), or where it could not, :data:`OBJECT_STORE`'s. Its parts are the training
process (step, receive, finish), the actors together, and on a CPU the trial's cores,
which the actors share only when they run on the trial's node.
:meth:`CostModel.remote_cpus` is how many actors' CPUs keep the training process at its
own pace: past that, more remote CPUs cannot raise the rate.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.candidates.rules import ACTOR_FETCHES
from raytune_loader.candidates.structure import structure
from raytune_loader.measuring.profile import Profile
from raytune_loader.tuning.space import SearchSpace

IMAGE_VALUES = 3 * 224 * 224  # values of one training image (uint8: bytes)


@dataclass(frozen=True)
class PerByte:
    """A cost of seconds per sample plus seconds per byte of the sample."""

    per_sample_s: float
    per_byte_s: float

    def seconds(self, sample_bytes: float) -> float:
        """Seconds for ``nbytes`` bytes."""
        return self.per_sample_s + self.per_byte_s * sample_bytes

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]]) -> PerByte:
        """The least-squares line through (bytes, seconds) points (two or more sizes)."""
        mean_x = statistics.fmean(x for x, _ in points)
        mean_y = statistics.fmean(y for _, y in points)
        spread = sum((x - mean_x) ** 2 for x, _ in points)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
        return cls(mean_y - slope * mean_x, slope)


@dataclass(frozen=True)
class ObjectStoreCost:
    """What crossing Ray's object store costs a sample: the actor putting it there beyond
    its worker side (``put``), the training process taking it out, formatting and
    collating the batch (``receive``)."""

    put: PerByte
    receive: PerByte


# Measured by experiments/raydata_overhead.py (results/benchmarks/raydata_overhead.json)
# for uint8 and float32 images on one node: the actor's time a sample beyond the worker
# side's (maker_ms_per_sample less worker_side_cpu_ms_per_sample) and the training
# process's CPU time a sample (training_process_cpu_ms_per_sample), each a line through
# the two sizes (tests/test_costmodel.py refits it from the file).
OBJECT_STORE = ObjectStoreCost(
    put=PerByte(per_sample_s=3.470e-4, per_byte_s=2.745e-10),
    receive=PerByte(per_sample_s=2.170e-4, per_byte_s=1.153e-10),
)
REMOTE_MARGIN = 0.25  # actors' CPUs beyond the model's count that the search still offers


def crossing_bytes(config: LoaderConfig) -> int:
    """Bytes one sample puts in the object store: the image as it crosses (encoded files
    taken at a uint8 image's size, a bound on a training JPEG's)."""
    return IMAGE_VALUES * (4 if config.transfer == "float32" and config.decode != "device" else 1)


@dataclass(frozen=True)
class Prediction:
    """A candidate's predicted samples/s, what bounds it (``step``, ``workers``, ``actors`` or
    ``cores``) and the CPUs it reserves."""

    samples_per_s: float
    bound: str  # what sets the pace: "step", "workers", "actors", "cores" or "store"
    cpus: float  # CPUs busy: the training process and its workers (or actors), per rank
    # the wait for the store's requests a batch (the workers' together), over the pace's
    # time a batch; 0 for local data, a warm cache or Ray Data. For shards read ahead,
    # whose GETs overlap decoding: near 1, they only just keep up (a GET a little slower
    # than the profile's, and the pace falls to them). For objects, waited for before
    # decoding, it is the wait's share of the pace
    waiting: float = 0.0
    # each part's seconds a batch of ``samples`` (the node's: all ranks), for calibration
    parts: tuple[tuple[str, float], ...] = ()
    samples: float = 0.0
    # how the parts are made up: "" (DataLoader workers), "inline" (no workers: the step
    # part is the whole pipeline), "raydata" (the step part takes batches out of Ray's
    # object store): a part's bias is its own in each
    kind: str = ""

    def key(self, part: str) -> str:
        """The name a part is calibrated under: its own, and its kind's."""
        return f"{part}/{self.kind}" if self.kind else part

    def calibrated(self, factor: Callable[[str], float]) -> tuple[float, str]:
        """samples/s and bound with each part's time over its factor (what trials that
        part bounded measured of the profile's prediction, by :meth:`key`): a part the
        trials found slower than the profile may become the bound."""
        if not self.parts:  # (a prediction pickled before the parts were kept)
            return self.samples_per_s * factor(self.key(self.bound)), self.bound
        times = {part: t / factor(self.key(part)) for part, t in self.parts}
        bound = max(times, key=lambda part: times[part])
        return self.samples / times[bound], bound


@dataclass(frozen=True)
class CostModel:
    """Predicts every candidate's samples/s from the profile's measured costs and the ceilings."""

    profile: Profile
    ceilings: dict[int, float]  # samples/s of the step on a resident batch, by batch size
    cuda: bool = False
    ranks: int = 1
    remote_actors: bool = True  # Ray Data's actors run on other nodes than the trial's
    store: ObjectStoreCost = OBJECT_STORE

    def predict(self, config: LoaderConfig, cores: float | None = None) -> Prediction | None:
        """The candidate's samples/s (the node's: all ranks), or None where the profile
        lacks its structure or the batch size has no ceiling. ``cores``: another node
        (usable CPUs), for estimates; the profile's node by default."""
        built = structure(config)
        side, receiving = built.worker_side, built.receiving
        per_core = self.profile.per_core.get(side)
        if config.cache:  # its samples are read from the local disk after the first epoch
            # (a profile pickled before it timed a warm cache, resumed, has none)
            warm = getattr(self.profile, "cached_per_core", {})
            per_core = warm.get(side, per_core)
        ceiling = self.ceilings.get(config.batch_size)
        if not per_core or not ceiling:
            return None
        scale = config.batch_size / self.profile.batch_size
        batch = config.batch_size
        step = batch / ceiling
        finish = self.profile.finish_s.get(side, 0.0) * scale
        collate = self.profile.collate_s.get(side, 0.0)
        if config.num_workers:  # what a worker of this kind pays to hand a batch over
            collate = max(collate, self.profile.hand_over_s.get(receiving, 0.0))
        fetch = 0.0 if config.cache else self._fetch(batch, config.fetch_threads)
        made = batch / per_core + collate * scale  # a core's part of making the batch
        # a store served from this node's cores: its CPU for the batch's requests
        serving = 0.0 if config.cache else self._serving(batch)
        # a stream's shards fetched ahead arrive while the reading thread decodes the
        # ones before them: it waits only for what its decoding does not cover (an
        # object's batch waits for its own GETs first, then decodes them)
        ahead = self.profile.requests_per_sample < 1 and config.fetch_threads > 1
        worker = max(made, fetch) if ahead else made + fetch
        rank_cores = (cores or self.profile.cores) / self.ranks
        if built.remote:
            making = batch / per_core + self._actor_fetch(config, fetch)
            return self._raydata(config, receiving, step + finish, making, rank_cores, serving)
        if config.num_workers == 0:  # shards ahead arrive during the step and finish too
            main = max(step + made + finish, fetch) if ahead else step + worker + finish
            parts = {"step": main}
            cpu_seconds = step + made + finish + serving  # a request's wait takes no core
        else:
            receive = self.profile.receive_s.get(receiving, 0.0) * scale
            main = step + receive + finish
            parts = {"step": main, "workers": worker / config.num_workers}
            cpu_seconds = main + made + serving
        if not self.cuda:  # the step and the workers share the cores
            parts["cores"] = cpu_seconds / max(1.0, rank_cores)
        parts.update({} if config.cache else self._store(batch))
        bound = max(parts, key=lambda k: parts[k])
        return Prediction(
            samples_per_s=self.ranks * batch / parts[bound],
            bound=bound,
            cpus=1.0 + config.num_workers,
            waiting=fetch / max(1, config.num_workers) / parts[bound],
            parts=tuple(sorted(parts.items())),
            samples=self.ranks * batch,
            kind="" if config.num_workers else "inline",
        )

    def _raydata(
        self,
        config: LoaderConfig,
        receiving: str,
        main: float,
        making: float,
        cores: float,
        serving: float = 0.0,
    ) -> Prediction:
        """A Ray Data candidate: the training process (``main``: step and finish, plus
        taking the batch out of the object store: the profile's time where it measured
        it on the trials' node, else :data:`OBJECT_STORE`'s), its actors together (each
        ``making`` a batch plus putting it in the store, at its share of a core), and on
        a CPU the trial's cores (the actors' too where they run there, and ``serving``:
        a store's server on this node, whoever reads from it)."""
        batch, crossing = config.batch_size, crossing_bytes(config)
        measured = self.profile.receive_s.get(receiving)
        if measured is not None:  # timed where the trials run, from a remote actor
            main += measured * batch / self.profile.batch_size
        else:
            main += batch * self.store.receive.seconds(crossing)
        actor = making + batch * self.store.put.seconds(crossing)
        pace = config.pool_size * min(1.0, config.actor_cpus_each)
        parts = {"step": main, "actors": actor / pace}
        if not self.cuda:
            busy = (main if self.remote_actors else main + actor) + serving
            parts["cores"] = busy / max(1.0, cores)
        parts.update({} if config.cache else self._store(batch))
        bound = max(parts, key=lambda k: parts[k])
        return Prediction(self.ranks * batch / parts[bound], bound, 1.0 + config.actor_cpus,
                          parts=tuple(sorted(parts.items())), samples=self.ranks * batch,
                          kind="raydata")  # fmt: skip

    def _fetch(self, batch: int, in_flight: int) -> float:
        """A worker's wait for a batch's requests: a batch's objects in waves of
        ``in_flight`` (a GET a sample), or its share of a shard's GET with ``in_flight``
        shards fetched ahead (a GET for many samples); 0 for local data."""
        requests = batch * self.profile.requests_per_sample
        if requests >= 1:
            return math.ceil(requests / in_flight) * self.profile.fetch_s
        return requests * self.profile.fetch_s / in_flight

    def _serving(self, batch: int) -> float:
        """The CPU-seconds a store whose server runs on this node spends on a batch's
        requests (:attr:`Profile.server_cpu_s`); 0 for a store elsewhere, or local data."""
        return batch * self.profile.requests_per_sample * self.profile.server_cpu_s

    def _actor_fetch(self, config: LoaderConfig, worker_fetch: float) -> float:
        """A Ray Data actor's wait for a training batch's objects: its map call's rows
        (:attr:`~LoaderConfig.rows_per_call`, a GET each) fetched :data:`ACTOR_FETCHES`
        at a time, that call's wait shared by its rows; a stream's shards as a worker
        waits for them."""
        if self.profile.requests_per_sample < 1:
            return worker_fetch
        rows = config.rows_per_call
        return self._fetch(rows, ACTOR_FETCHES) * config.batch_size / rows

    def _store(self, batch: int) -> dict[str, float]:
        """An object store's part: a rank's batch's requests at its share of the most GETs
        a second the store answered the profile; none for local data."""
        rate = self.profile.store_rate
        requests = batch * self.ranks * self.profile.requests_per_sample
        return {"store": requests / rate} if rate else {}

    def actors_needed(self, config: LoaderConfig) -> float | None:
        """How many of ``config``'s actors make batches as fast as its training process
        takes them (its pace with actors to spare): more cannot raise its rate."""
        unbounded = replace(config, max_actors=10**6, min_actors=None)
        limit = self.predict(unbounded)
        alone = self.predict(replace(config, max_actors=1, min_actors=None))
        if limit is None or alone is None:
            return None
        return limit.samples_per_s / alone.samples_per_s if alone.bound == "actors" else 1.0

    def remote_cpus(self, space: SearchSpace) -> float | None:
        """The actors' CPUs that reach every Ray Data structure's pace of its training
        process (its ceiling, less what receiving and finishing cost), at each batch
        size, in the actors that need the fewest, with :data:`REMOTE_MARGIN` for the
        model's error; None where the profile lacks them."""
        cheapest: dict[tuple[Any, int], float] = {}  # structure and batch: fewest CPUs
        for kind, configs in space.structures().items():
            if not kind.remote:
                continue
            for config in {(c.batch_size, c.actor_cpus_each): c for c in configs}.values():
                actors = self.actors_needed(config)
                if actors is not None:
                    key, cpus = (kind, config.batch_size), actors * config.actor_cpus_each
                    cheapest[key] = min(cpus, cheapest.get(key, cpus))
        if not cheapest:
            return None
        return float(math.ceil(max(cheapest.values()) * (1 + REMOTE_MARGIN)))


def median_error(pairs: list[tuple[float, float]]) -> float | None:
    """The median of |predicted - measured| / measured over (predicted, measured) pairs."""
    errors = [abs(p - m) / m for p, m in pairs if m > 0]
    return statistics.median(errors) if errors else None


def what_if(model: CostModel, config: LoaderConfig, cores: list[int]) -> list[dict[str, object]]:
    """Estimates for ``config``'s structure on nodes of other sizes: per rank, a worker
    per core of its share (threads or processes as tuned; on a CPU the training step
    shares those cores, as the model counts), from the same measured per-core costs."""
    out: list[dict[str, object]] = []
    if structure(config).remote:
        return _actors_what_if(model, config, cores)
    for count in cores:
        workers = max(1, int(count // model.ranks)) if config.num_workers else 0
        resized = config if workers == config.num_workers else LoaderConfig.from_dict(
            {**config.kwargs(), **{k: getattr(config, k) for k in ("transfer", "decode",
             "workers", "access", "batching")}, "num_workers": workers},
        )  # fmt: skip
        found = model.predict(resized, cores=count)
        if found is not None:
            out.append({
                "cores": count, "workers_per_rank": workers, "estimate": True,
                "samples_per_s": round(found.samples_per_s, 1), "bound": found.bound,
            })  # fmt: skip
    return out


def _actors_what_if(
    model: CostModel, config: LoaderConfig, counts: list[int]
) -> list[dict[str, object]]:
    """Estimates for a Ray Data winner with other pools of actors (fixed, each with the
    winner's CPUs), from the same measured costs."""
    out: list[dict[str, object]] = []
    for count in counts:
        found = model.predict(replace(config, max_actors=max(1, count), min_actors=None))
        if found is not None:
            out.append({
                "actors": max(1, count), "remote_cpus": max(1, count) * config.actor_cpus_each,
                "estimate": True, "samples_per_s": round(found.samples_per_s, 1),
                "bound": found.bound,
            })  # fmt: skip
    return out

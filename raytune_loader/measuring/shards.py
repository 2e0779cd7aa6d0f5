"""A stream's part of the search: which shards the trials read, read once before them.

A stream (an ``IterableDataset``: webdataset tar shards, a Hugging Face table read file
by file, a user's own) cannot be subset by index. Every trial reads the same shards
instead: :func:`prepare_stream` reads shards through once, in a seeded order, until
they hold ``--samples-per-trial`` samples and at least a shard per worker the node could
run (each is pre-warmed, counted and checked: a broken one stops the search before any
trial, naming the shard and the sample). With ``--cold`` trial k reads the k-th
disjoint block of as many shards instead. Workers of one rank share its shards: the
space bounds workers per rank by the shards a rank reads. A user's stream without
shards must split itself across workers (``get_worker_info``); one that yields the same
samples in every worker is found here, from what it delivers, and the space keeps it
to one worker.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import (
    DataLoader,
    IterableDataset,
)

from raytune_loader.errors import DatasetError
from raytune_loader.loaders.shard_stream import ShardStream, StreamVariant
from raytune_loader.sources.store_shards import COUNT_THREADS, counted
from raytune_loader.stores.url import is_remote

if TYPE_CHECKING:
    from raytune_loader.candidates.config import LoaderConfig
    from raytune_loader.measuring.job import TrialJob
    from raytune_loader.progress import Progress
log = logging.getLogger(__name__)


DEFAULT_SHUFFLE_BUFFER = 1000  # samples: webdataset's and Hugging Face's usual idiom


def prepare_stream(job: TrialJob, largest_batch: int, progress: Progress) -> TrialJob:
    """``job`` with the shards its trials read, and how many workers per rank they keep
    busy; a DatasetError for what can be checked before the trials."""
    spec = job.dataset
    shards = spec.source.shards(spec)
    if not shards:
        return _prepare_own_stream(job, progress)
    if len(shards) < job.ranks:
        message = (
            f"{spec.name} has {len(shards)} shards under {spec.data_root}, fewer than the "
            f"{job.ranks} ranks (--ranks-per-node): each rank reads shards of its own"
        )
        if "map" in spec.source.accesses(spec):  # it can still be read by index
            return replace(job, stream_workers=0, stream_note=f"{message}; read by index only")
        raise DatasetError(message)
    order = _shard_order(shards, job.seed)
    wanted = min(len(shards), job.ranks * max(1, int(job.node_cpus)))
    read = 0
    infos: list[Any] = []
    what = "Counting" if job.cold else "Pre-warming and counting"
    progress.stage(f"{what} the shards the trials read ({len(shards)} in all)")
    remote = is_remote(str(spec.data_root))
    while len(infos) < len(order) and (read < job.samples_per_trial or len(infos) < wanted):
        wave = order[len(infos) : len(infos) + _wave(infos, read, job, wanted, remote)]
        for info in counted(lambda path: spec.source.read_shard(spec, path), wave, remote):
            infos.append(info)
            read += info.samples
            # how many it takes is known once they hold a trial's samples: up to them all
            progress.count("reading shards", len(infos), len(shards))
    if len(infos) < len(shards):
        progress.count("reading shards", len(infos), len(infos))  # done: these are all
    if read < largest_batch * job.ranks:
        raise DatasetError(
            f"{spec.name}: {len(infos)} shards hold {read} samples, fewer than one batch of "
            f"{largest_batch} per rank; use a smaller --batch-size or more data"
        )
    workers = len(infos) // job.ranks
    note = None
    if workers < max(1, int(job.node_cpus) // job.ranks):
        note = (
            f"{len(infos)} shards for {job.ranks} rank(s): at most {workers} loader workers "
            "per rank (a worker without a shard of its own has nothing to read)"
        )
    log.info("the trials read %d shards, %d samples", len(infos), read)
    listed = spec.source.listed(spec) or job.listing  # a store's shards: handed on, not redone
    return replace(job, stream_shards=len(infos), stream_workers=workers, stream_note=note,
                   listing=listed)  # fmt: skip


def _wave(infos: list[Any], read: int, job: TrialJob, wanted: int, remote: bool) -> int:
    """How many shards to read next: one at a time from disk; from a store, after the
    first, as many as the samples still wanted take at the shards' mean, at once (a
    whole shard's GET each: 0.4 s a 5 MB shard, one after another 3.4 s of eight)."""
    if not remote or not infos:
        return 1
    per_shard = max(1, read // len(infos))
    more = max(wanted - len(infos), -(-(job.samples_per_trial - read) // per_shard), 1)
    return min(COUNT_THREADS, more)


def _prepare_own_stream(job: TrialJob, progress: Progress) -> TrialJob:
    """A user's stream: it must yield, and split itself across loader workers."""
    spec = job.dataset
    stream = spec.source.build_stream(spec, [], StreamVariant(seed=job.seed))
    first = first_of(stream, _NOTHING)
    if first is _NOTHING:
        raise DatasetError(f"{spec.name} yielded no sample: its IterableDataset is empty")
    if not job.train_step and (not isinstance(first, (tuple, list)) or len(first) < 2):
        raise DatasetError(
            f"samples must be (input, target) pairs; the first of {spec.name} is "
            f"{type(first).__name__}: yield (input, target), or train it with --train-step"
        )
    progress.stage(f"Checking that {spec.name} splits its samples across loader workers")
    if splits_across_workers(stream):
        return job
    note = (
        f"{spec.name} yields the same samples in every loader worker, so more than one "
        "worker would repeat data: split it in __iter__ with "
        "torch.utils.data.get_worker_info() (worker id, number of workers)"
    )
    return replace(job, stream_workers=1, stream_note=note)  # warned where the space is made


_NOTHING = object()


@contextlib.contextmanager
def opened(stream: Any) -> Iterator[Iterator[Any]]:
    """An iterator over the stream, closed when the block ends: the files it opened are
    released then, not at garbage collection."""
    items = iter(stream)
    try:
        yield items
    finally:
        close = getattr(items, "close", None)
        if callable(close):
            close()


def first_of(stream: Any, default: Any = None) -> Any:
    """The stream's first sample, or ``default`` when it yields none."""
    with opened(stream) as items:
        return next(items, default)


def splits_across_workers(stream: IterableDataset[Any], samples: int = 4) -> bool:
    """Whether two loader workers of ``stream`` deliver different samples. Both workers
    start from the same random state, so a stream that does not split by
    ``get_worker_info`` delivers the same samples, augmentations included; one that
    splits delivers others. True when a worker has fewer than ``samples`` to give."""
    loader = DataLoader(
        stream, batch_size=samples, num_workers=2, worker_init_fn=_same_seed,
        collate_fn=list, multiprocessing_context="fork" if _can_fork() else None,
    )  # fmt: skip
    batches = list(itertools.islice(iter(loader), 2))
    del loader
    if len(batches) < 2 or len(batches[0]) < samples or len(batches[1]) < samples:
        return True  # too short to tell; the trials would show it
    return _fingerprint(batches[0]) != _fingerprint(batches[1])


def _same_seed(worker: int) -> None:
    torch.manual_seed(0)
    random.seed(0)
    try:
        import numpy

        numpy.random.seed(0)
    except ImportError:  # numpy is optional for torch
        pass


def _can_fork() -> bool:
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods()


def _fingerprint(samples: list[Any]) -> list[bytes]:
    out = []
    for sample in samples:
        parts = sample if isinstance(sample, (tuple, list)) else [sample]
        out.append(b"".join(_bytes(part) for part in parts))
    return out


def _bytes(value: Any) -> bytes:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().numpy().tobytes()
    return repr(value).encode()


def _shard_order(shards: list[str], seed: int) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    return [shards[i] for i in torch.randperm(len(shards), generator=generator).tolist()]


def trial_shards(job: TrialJob, slot: int = 0) -> list[str]:
    """The shards a measurement reads: slot 0 the shared, pre-warmed block; with
    ``--cold``, slot k the k-th disjoint block (wrapping when the data is used up)."""
    spec = job.dataset
    order = _shard_order(spec.source.shards(spec), job.seed)
    count = job.stream_shards
    if not count:
        return []
    # with --cold, block 0 was read once to count it (it is in the page cache): slot k
    # reads block k + 1
    start = ((slot + 1 if job.cold else 0) * count) % len(order)
    return (order[start:] + order[:start])[:count]


def variant(job: TrialJob, config: LoaderConfig, *, repeat: bool = True) -> StreamVariant:
    """How ``config`` reads the job's stream; a trial's repeats its shards, so one
    loader epoch lasts the whole segment, as with a map-style dataset."""
    buffer = shuffle_buffer(job.dataset)
    return StreamVariant(
        transfer=config.transfer,
        decode=config.decode,
        batch_size=config.batch_size if config.batching == "workers" else None,
        shuffle_buffer=buffer,
        seed=job.seed,
        repeat=repeat,
    )


def shuffle_buffer(spec: Any) -> int:
    """The stream's shuffle buffer: the user's, or the formats' usual idiom."""
    return DEFAULT_SHUFFLE_BUFFER if spec.shuffle_buffer is None else int(spec.shuffle_buffer)


def unbuffered(stream: Any) -> Any:
    """``stream`` read without its shuffle buffer (nor shuffled shards), for what does
    not depend on the order: a sample's bytes, whether it decodes, what it costs.
    Filling the buffer reads shard after shard before the first sample (from a bucket's
    5 MB shards, 0.4 s each: 3-4 s of a 7.5 s trial, 38 s of a profile). A copy of a
    stream of shards, which shares its shards, counts and epoch; any other stream (a
    user's, whose buffer is its own) as it is."""
    if not isinstance(stream, ShardStream) or not stream.shuffle_buffer:
        return stream
    found = copy.copy(stream)
    found.shuffle_buffer, found.shuffle = 0, False
    return found


def checked_head(stream: Any) -> Any:
    """:func:`unbuffered` ``stream``, whose shards in a store are read from their first
    bytes alone (a Parquet file's footer and first row groups) where its reader can
    (its ``read_head``: ranged GETs, not the whole shard), for a check of its first
    sample or batch; any other as :func:`unbuffered`."""
    found = unbuffered(stream)
    if not isinstance(found, ShardStream) or found.store is None:
        return found
    if not hasattr(found.reader, "read_head"):
        return found
    found = copy.copy(found) if found is stream else found
    found.reader = _Heads(found.reader, found.loader_batch)
    return found


@dataclass(frozen=True)
class _Heads:
    """A reader of its shards' first ``need`` samples from their first bytes, or a
    Parquet file's footer and first row groups (``read_head``), none fetched ahead; a
    span that starts inside a shard (a rank's after the first) reads it as its reader
    does (a tar shard's span, its own samples' bytes; a Parquet file's, its row groups'
    and the footer)."""

    reader: Any
    need: int = 1

    def count(self, path: str) -> int:
        return int(self.reader.count(path))

    def read(self, path: str, start: int, stop: int) -> Iterator[Any]:
        if start > 0:
            return iter(self.reader.read(path, start, stop))
        return itertools.islice(self.reader.read_head(path, self.need), stop)

    def ray_reader(self, paths: Any) -> str | None:
        return None


def stream_for_trial(job: TrialJob, config: LoaderConfig, slot: int = 0) -> IterableDataset[Any]:
    """The stream a measurement of ``config`` reads."""
    spec = job.dataset
    return spec.source.build_stream(spec, trial_shards(job, slot), variant(job, config))

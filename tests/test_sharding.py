"""Each rank reads its own shard of every epoch, whatever the worker kind and whoever
iterates the loader: real gloo process groups of two ranks."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, RandomSampler

from conftest import gloo_group, two_gloo_ranks
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import ConfigError
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.loaders.sharding import ShardSampler

PROCESSES = LoaderConfig(4, num_workers=1, prefetch_factor=2, persistent_workers=True)
THREADS = LoaderConfig(4, num_workers=2, prefetch_factor=2, workers="thread", in_order=False)


class Indices(Dataset):
    """Sample i is (a tiny image, i): what a rank read is in its batches' labels."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.zeros(3, 2, 2), index


@pytest.mark.parametrize("size", [32, 30])
def test_every_rank_has_its_own_share_of_one_permutation(size: int) -> None:
    """The ranks' samplers, built apart, agree on the epoch's order; each takes every
    world-size-th index: disjoint, covering, and padded to equal counts as
    DistributedSampler does (30 samples: 2 padded)."""
    shards = [ShardSampler(range(size), seed=3).indices(rank, 4) for rank in range(4)]
    assert {len(shard) for shard in shards} == {8}
    flat = [i for shard in shards for i in shard]
    assert set(flat) == set(range(size)) and len(flat) - len(set(flat)) == 32 - size


def test_the_epoch_advances_by_itself_until_set_epoch_takes_over() -> None:
    sampler = ShardSampler(range(64), seed=0)
    first, second = list(sampler), list(sampler)
    assert sorted(first) == sorted(second) == list(range(64)) and first != second
    sampler.set_epoch(0)
    assert list(sampler) == first  # Lightning, accelerate and DDP loops call set_epoch
    assert sampler.indices(0, 1) == first  # an extra pass does not move it any more
    sampler.set_epoch(1)
    assert list(sampler) == second


def test_a_long_epoch_chains_permutations_without_repeating_within_one() -> None:
    sampler = ShardSampler(range(10), seed=1, samples=25)
    drawn = list(sampler)
    assert len(drawn) == 25 and sorted(drawn[:10]) == sorted(drawn[10:20]) == list(range(10))


def test_without_a_process_group_the_loader_reads_everything_once_an_epoch() -> None:
    for config in (PROCESSES, THREADS):
        loader = build_dataloader(Indices(32), config, drop_last=False)
        epochs = [[int(i) for _, labels in loader for i in labels] for _ in range(2)]
        assert len(loader) == 8
        assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(32))
        assert epochs[0] != epochs[1]  # reshuffled, though nobody called set_epoch


def _rank(rank: int, store: str, results: Any) -> None:
    with gloo_group(rank, store, results):
        read: dict[str, Any] = {}
        for name, config in (("process", PROCESSES), ("thread", THREADS)):
            loader = build_dataloader(Indices(32), config, drop_last=False, seed=5)
            read[name] = [[int(i) for _, labels in loader for i in labels] for _ in range(2)]
            read[f"{name} len"] = len(loader)
            # what a trainer that splits batches itself (accelerate) iterates: whole epochs
            # of a DataLoader; a thread loader's (skip_first_batches): this rank's share
            read[f"{name} batch_sampler"] = sorted(i for b in loader.batch_sampler for i in b)
        try:  # every rank would read the same samples: refused at once
            build_dataloader(Indices(32), THREADS, sampler=RandomSampler(range(32)))
        except ConfigError as exc:
            read["refused"] = str(exc)
        results.put((rank, read))


@pytest.mark.slow  # a process group of ranks: minutes of the fast tier's CPU
def test_in_a_process_group_each_rank_reads_its_own_half_of_every_epoch() -> None:
    read = two_gloo_ranks(_rank)
    for kind in ("process", "thread"):
        for epoch in (0, 1):
            zero, one = read[0][kind][epoch], read[1][kind][epoch]
            assert len(zero) == len(one) == 16, kind
            assert not set(zero) & set(one) and set(zero) | set(one) == set(range(32)), kind
        assert set(read[0][kind][0]) != set(read[0][kind][1]), kind  # a new shard each epoch
        assert read[0][f"{kind} len"] == read[1][f"{kind} len"] == 4
    assert read[0]["process batch_sampler"] == list(range(32))
    shares = [read[rank]["thread batch_sampler"] for rank in (0, 1)]
    assert len(shares[0]) == 16 and sorted(shares[0] + shares[1]) == list(range(32))
    assert "gives every one of the 2 ranks the same samples" in read[0]["refused"]


def test_a_stream_takes_no_sampler_and_says_so_in_one_line() -> None:
    class Stream(IterableDataset):
        def __iter__(self):  # noqa: ANN204
            yield from range(4)

    with pytest.raises(ConfigError, match="Stream is a stream .* it takes no sampler"):
        build_dataloader(Stream(), PROCESSES, sampler=RandomSampler(range(4)))


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_planned_stream_epoch_gives_every_rank_equal_batches_of_its_own(
    drop_last: bool,
) -> None:
    """Any shard sizes, world, workers and batch size: every rank the same batches, the
    partial one (if any) once per rank, no sample twice, and less than a batch per rank
    (less than a sample without drop_last) left out."""
    from raytune_loader.loaders.sharding import epoch_cut, shard_order, spans, worker_range

    rng = random.Random(0)
    for _ in range(400):
        sizes = [rng.randint(1, 30) for _ in range(rng.randint(1, 7))]
        world, workers, batch = rng.randint(1, len(sizes)), rng.randint(1, 4), rng.randint(1, 6)
        cut = epoch_cut(sum(sizes), world, batch, drop_last)
        order = shard_order(len(sizes), seed=3, epoch=rng.randint(0, 9), shuffle=True)
        seen = []
        for rank in range(world):
            ranges = [worker_range(cut, batch, w, workers) for w in range(workers)]
            assert sum(math.ceil((high - low) / batch) for low, high in ranges) == cut.batches
            assert sum((high - low) % batch != 0 for low, high in ranges) <= 1
            start = rank * cut.per_rank
            for low, high in ranges:
                read = spans(sizes, order, start + low, start + high)
                assert sum(s.stop - s.start for s in read) == high - low
                seen += [(s.shard, i) for s in read for i in range(s.start, s.stop)]
        assert len(seen) == len(set(seen)) and all(0 <= i < sizes[s] for s, i in seen)
        assert sum(sizes) - len(seen) < world * (batch if drop_last else 1)
    assert shard_order(5, 3, 0, True) != shard_order(5, 3, 1, True)  # reshuffled by epoch
    assert shard_order(5, 3, 0, False) == shard_order(5, 3, 1, False) == list(range(5))


def test_the_tuned_loader_s_state_resumes_an_epoch_where_it_stopped() -> None:
    """Map-style, worker processes (in order or not) and threads: a new loader
    given the state of one stopped after 3 batches reads the rest of that epoch, then
    the next."""
    unordered = LoaderConfig(4, num_workers=2, prefetch_factor=2, in_order=False)
    for config in (PROCESSES, THREADS, unordered):
        loader = build_dataloader(Indices(32), config, drop_last=False, seed=5)
        whole = [[int(i) for i in labels] for _, labels in loader]  # epoch 0
        loader = build_dataloader(Indices(32), config, drop_last=False, seed=5)
        batches = iter(loader)
        before = [int(i) for _ in range(3) for i in next(batches)[1]]
        state = loader.state_dict()
        assert (state["epoch"], state["explicit"]) == (0, False)
        assert state["batches"][0] + len(state["ahead"]) == 3  # out of order: which ones
        again = build_dataloader(Indices(32), config, drop_last=False, seed=5)
        again.load_state_dict(state)
        after = [int(i) for _, labels in again for i in labels]
        assert sorted(before + after) == list(range(32)) and not set(before) & set(after)
        if config.in_order:
            assert before + after == [i for batch in whole for i in batch]
        assert again.state_dict()["epoch"] == 1  # read to its end: the next one
        assert sorted(int(i) for _, labels in again for i in labels) == list(range(32))

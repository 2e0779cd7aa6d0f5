"""The one loader constructor: DataLoader processes, or torchdata threads."""

from __future__ import annotations

import os
import pickle
import threading

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import CorruptSampleError
from raytune_loader.loaders.batches import WorkerThreads
from raytune_loader.loaders.loader import ThreadLoader, build_dataloader

THREADS = LoaderConfig(batch_size=8, num_workers=2, prefetch_factor=2, workers="thread")


class _Corrupt(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index == 20:
            raise CorruptSampleError(f"corrupt sample {index}.JPEG: bad Huffman code")
        return torch.zeros(3), index


@pytest.mark.parametrize("in_order", [True, False])
def test_thread_workers_give_every_sample_once_an_epoch_like_a_dataloader(in_order: bool) -> None:
    dataset = TensorDataset(torch.randn(64, 3), torch.arange(64))
    config = LoaderConfig(**{**vars(THREADS), "in_order": in_order})
    loader = build_dataloader(dataset, config, seed=0)
    assert isinstance(loader, ThreadLoader) and len(loader) == 8
    for _ in range(2):  # iterating again is a new epoch
        labels = [label for _, batch in loader for label in batch.tolist()]
        assert sorted(labels) == list(range(64))
    ordered = build_dataloader(dataset, THREADS, seed=0, shuffle=False)
    assert [batch.tolist() for _, batch in ordered][0] == list(range(8))


def test_thread_workers_have_every_public_attribute_of_a_dataloader() -> None:
    """Code that reads a loader's settings (a trainer, a logger) finds them all, with the
    values of the loader built: the batch size, workers and queue a DataLoader of the
    same arguments would give."""
    from torch.utils.data import DataLoader

    dataset = TensorDataset(torch.randn(64, 3), torch.arange(64))
    threads = build_dataloader(dataset, THREADS, seed=0)
    processes = DataLoader(dataset, batch_size=THREADS.batch_size, num_workers=2)
    # its settings (a property for the start method); check_worker_number_rationality,
    # DataLoader's own warning about processes, is the one public method left out
    public = {k for k in vars(processes) if not k.startswith("_")} | {"multiprocessing_context"}
    assert [k for k in sorted(public) if not hasattr(threads, k)] == []
    for key in ("batch_size", "num_workers", "prefetch_factor", "timeout"):
        assert getattr(threads, key) == getattr(processes, key), key
    assert threads.persistent_workers is False and threads.worker_init_fn is None


def test_an_abandoned_epoch_stops_its_threads_at_once() -> None:
    before = threading.active_count()
    loader = build_dataloader(TensorDataset(torch.randn(64, 3), torch.arange(64)), THREADS)
    batches = iter(loader)
    next(batches)
    assert threading.active_count() > before
    batches.close()  # what a trial's finally does
    assert threading.active_count() == before


def test_a_worker_thread_s_error_reaches_the_loop_with_its_type_and_message() -> None:
    loader = build_dataloader(_Corrupt(), THREADS, shuffle=False)
    with pytest.raises(CorruptSampleError, match="bad Huffman code"):
        for _ in loader:
            pass


class _Pools(Dataset):
    """What a worker's thread pools are: BLAS (threadpoolctl), torch, OMP_NUM_THREADS,
    and whether the user's own worker_init_fn ran."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict:
        from threadpoolctl import threadpool_info

        blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
        return {
            "blas": max(blas), "torch": torch.get_num_threads(),
            "omp": os.environ.get("OMP_NUM_THREADS", ""), "mine": os.environ.get("MINE", ""),
        }  # fmt: skip


def _mine(worker_id: int) -> None:
    os.environ["MINE"] = f"ran in worker {worker_id}"


def test_worker_threads_holds_each_worker_s_pools_and_keeps_the_user_s_init() -> None:
    import numpy  # noqa: F401 - its BLAS is loaded before the workers start, as in users' code

    config = LoaderConfig(batch_size=1, num_workers=1, prefetch_factor=1, worker_threads=1)
    tuned = next(iter(build_dataloader(_Pools(), config, worker_init_fn=_mine)))
    assert (tuned["blas"].item(), tuned["torch"].item()) == (1, 1)
    assert tuned["omp"] == ["1"] and tuned["mine"] == ["ran in worker 0"]
    default = LoaderConfig(batch_size=1, num_workers=1, prefetch_factor=1)
    assert build_dataloader(_Pools(), default).worker_init_fn is None  # the libraries' own
    again = pickle.loads(pickle.dumps(WorkerThreads(1, _mine)))  # spawn and forkserver
    assert (again.threads, again.then) == (1, _mine)


class _Draws(Dataset):
    """A sample is a draw from the worker's torch, random and numpy streams."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        import random

        import numpy as np

        return torch.tensor([torch.rand(()).item(), random.random(), np.random.rand()])


def test_worker_threads_seeds_workers_as_lightning_where_it_asked_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lightning's seed_everything(workers=True) adds its rank-aware seeding only to a
    loader without worker_init_fn; the tuned loader has one, so it runs Lightning's: each
    worker draws what Lightning's own seeding gives it, not torch's default."""
    from functools import partial

    from lightning.fabric.utilities.seed import pl_worker_init_function, seed_everything

    monkeypatch.setenv("PL_SEED_WORKERS", "0")  # seed_everything sets it; undone after
    config = LoaderConfig(batch_size=1, num_workers=2, prefetch_factor=1, worker_threads=1)

    def draws(workers: bool, **kwargs: object) -> torch.Tensor:
        seed_everything(7, workers=workers, verbose=False)
        return torch.cat(list(build_dataloader(_Draws(), config, **kwargs)))

    lightning = draws(True, worker_init_fn=partial(pl_worker_init_function, rank=0))
    assert torch.equal(draws(True), lightning)
    assert not torch.equal(draws(False), lightning)  # not asked: torch's own seeding


_LEFT_OPEN = """
import sys, time
import torch
from torch.utils.data import Dataset
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.space import LoaderConfig


class Slow(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, index):
        time.sleep(0.002)
        return torch.full((64,), float(index))


config = LoaderConfig(batch_size=4, num_workers=2, prefetch_factor=2, workers="thread")
batches = iter(build_dataloader(Slow(), config))  # held to the end, as the README's loop
for step in range(3):
    next(batches)  # the loop stops before the epoch's end, and so does the program
print("trained")
"""


def test_a_program_that_stops_mid_epoch_exits_cleanly_with_thread_workers() -> None:
    """A training loop that breaks out of a thread loader's epoch and ends: the epoch's
    threads stop before the interpreter tears its modules down, so the program exits 0
    with nothing on stderr (it printed a traceback at exit, or aborted)."""
    import subprocess
    import sys

    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", _LEFT_OPEN], capture_output=True, text=True, timeout=120
        )
        assert (done.returncode, done.stdout.strip()) == (0, "trained"), done.stderr[-2000:]
        assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, (
            done.stderr[-2000:]
        )

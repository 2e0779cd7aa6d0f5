"""Datasets for the tests, used through ``--dataset datasets_for_tests:NAME``."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset


class TensorImages(Dataset):
    """Small random images with labels; ``delay_s`` of sleep per sample imitates costly decoding."""

    classes = list(range(10))

    def __init__(self, length: int = 256, size: int = 32, delay_s: float = 0.0) -> None:
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(length, 3, size, size, generator=generator)
        self.labels = torch.randint(0, 10, (length,), generator=generator)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.images[index], self.labels[index]


class Broken(TensorImages):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise ValueError(f"sample {index} is broken")


def fast() -> Dataset:
    return TensorImages()


def slow(data_root: str | None = None) -> Dataset:
    return TensorImages(delay_s=0.004)


def broken() -> Dataset:
    return Broken()


def not_a_dataset() -> object:
    return 42


class _DiesInWorker(TensorImages):
    """Kills the DataLoader worker process that loads it, as the OOM killer would."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        import os
        import signal

        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


class _HangsInWorker(TensorImages):
    """Never returns from a worker: a stalled network filesystem."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            time.sleep(3600)
        return super().__getitem__(index)


class _RankOneDies(TensorImages):
    """Rank 1 of a data-parallel measurement is killed mid-trial (the OOM killer)."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        import signal

        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


class _RankOneCorrupt(TensorImages):
    """Rank 1's shard holds a file that does not decode; rank 0's does not."""

    def __init__(self) -> None:
        import torch.distributed as dist

        super().__init__()
        self.rank = dist.get_rank() if dist.is_initialized() else 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        from raytune_loader.errors import CorruptSampleError

        if self.rank == 1:
            raise CorruptSampleError(f"corrupt sample {index}.JPEG: bad Huffman code")
        return super().__getitem__(index)


def rank_one_corrupt() -> Dataset:
    return _RankOneCorrupt()


def rank_one_dies() -> Dataset:
    return _RankOneDies()


class ShardLog(TensorImages):
    """Appends ``rank index start-method`` to ``log`` for every sample a rank (or its
    workers) reads; the start method is the reading process's default."""

    def __init__(self, log: str, length: int = 64) -> None:
        import torch.distributed as dist

        super().__init__(length)
        self.log = log
        self.rank = dist.get_rank()  # built in the rank's process

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        with open(self.log, "a") as handle:
            handle.write(f"{self.rank} {index} {multiprocessing.get_start_method()}\n")
        return super().__getitem__(index)


def shard_log(data_root: str) -> Dataset:
    return ShardLog(data_root)


def dies_in_worker() -> Dataset:
    return _DiesInWorker()


def hangs_in_worker() -> Dataset:
    return _HangsInWorker()


class _DictSamples(TensorImages):
    def __getitem__(self, index: int) -> dict:  # type: ignore[override]
        image, label = super().__getitem__(index)
        return {"image": image, "label": label}


def dict_samples() -> Dataset:
    return _DictSamples()


class ReaderPids(TensorImages):
    """Appends the reading process's id to ``log`` for every sample."""

    def __init__(self, log: str, length: int = 16) -> None:
        super().__init__(length)
        self.log = log

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        with open(self.log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        return super().__getitem__(index)


def linear_model(num_classes: int = 10) -> torch.nn.Module:
    """A model factory that takes ``num_classes=``."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))


def dense_cnn(num_classes: int = 10) -> torch.nn.Module:
    """About ten times small-cnn's step on 32-pixel images: a sample's few microseconds of
    loading are then a fraction of a percent of training, far inside the runs' noise."""
    layers: list[torch.nn.Module] = []
    for inputs, outputs, stride in ((3, 32, 1), (32, 64, 2), (64, 128, 2)):
        layers += [torch.nn.Conv2d(inputs, outputs, 3, stride, 1), torch.nn.BatchNorm2d(outputs)]
        layers.append(torch.nn.ReLU())
    head = [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, num_classes)]
    return torch.nn.Sequential(*layers, *head)


def not_a_model() -> object:
    return "a string"


class _Recording(torch.nn.Module):
    """small-cnn that appends, to the file named by $RECORD_TO, a checksum of its initial
    weights and of every input batch it trains on."""

    def __init__(self, num_classes: int) -> None:
        from raytune_loader.measuring.models import small_cnn

        super().__init__()
        self.net = small_cnn(num_classes)
        weights = sum(float(p.double().sum()) for p in self.net.parameters())
        self._write(f"init {weights:.10e}")

    def _write(self, line: str) -> None:
        with open(os.environ["RECORD_TO"], "a") as handle:
            handle.write(line + "\n")

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        out = self.net(inputs)
        layouts = (
            inputs.is_contiguous(memory_format=torch.channels_last),
            self.net[0][0].weight.is_contiguous(memory_format=torch.channels_last),
        )
        self._write(f"batch {float(inputs.double().sum()):.10e} {out.dtype} {layouts}")
        return out


def recording_model(num_classes: int = 10) -> torch.nn.Module:
    return _Recording(num_classes)


def make_step(device: torch.device, num_classes: int) -> object:
    """A user's --train-step factory: records how it was called and what each batch holds."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, num_classes))
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    log = os.environ["RECORD_TO"]
    with open(log, "a") as handle:
        handle.write(f"factory device={device} num_classes={num_classes}\n")

    def step(batch: dict) -> None:
        with open(log, "a") as handle:
            handle.write(f"step {batch['image'].device} {batch['label'].device} "
                         f"{tuple(batch['image'].shape)}\n")  # fmt: skip
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(batch["image"]), batch["label"])
        loss.backward()
        optimizer.step()

    return step


def step_factory_raises(device: torch.device) -> object:
    raise RuntimeError("no GPU budget today")


def step_factory_returns_a_number(device: torch.device) -> object:
    return 3


def step_that_raises(device: torch.device) -> object:
    def step(batch: object) -> None:
        raise ValueError("shapes do not match")

    return step


def step_oom_above_8(device: torch.device) -> object:
    """A step that runs out of CUDA memory on batches of more than 8 samples."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch: list) -> None:
        images, labels = batch
        if images.shape[0] > 8:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()

    return step


def counted(data_root: str) -> Dataset:
    """A factory that logs each call (its process id) to ``data_root``/calls."""
    with open(Path(data_root) / "calls", "a") as handle:
        handle.write(f"{os.getpid()}\n")
    return TensorImages(length=64)


def counted_with_transfer(data_root: str, transfer: str = "float32") -> Dataset:
    """``counted``, opting into pipeline search."""
    return counted(data_root)


def images_with_transfer(transfer: str = "float32") -> Dataset:
    """A factory that opts into pipeline search: uint8 images for transfer="uint8"."""
    images = TensorImages(length=64)
    if transfer == "uint8":
        images.images = (images.images.clamp(-2, 2) * 60 + 128).to(torch.uint8)
    return images


def step_oom_on_rank_one_above_4(device: torch.device) -> object:
    """A DDP rank's step that all-reduces a tensor the size of its batch (as gradient
    buckets of batch-shaped work would) and, on rank 1, runs out of CUDA memory on
    batches of more than 4 samples."""
    import torch.distributed as dist

    rank = dist.get_rank()

    def step(batch: list) -> None:
        images, _ = batch
        if rank == 1 and images.shape[0] > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        dist.all_reduce(torch.ones(images.shape[0]))  # peers at another size would not match

    return step


class _Stream(torch.utils.data.IterableDataset):
    """A user's stream of 64 tiny images; ``split``: each loader worker yields its own
    share (by get_worker_info), as a stream must; otherwise every worker yields all."""

    def __init__(self, split: bool, length: int = 64) -> None:
        self.split = split
        self.length = length

    def __iter__(self):  # noqa: ANN204
        info = torch.utils.data.get_worker_info()
        indices = range(self.length)
        if self.split and info is not None:
            indices = indices[info.id :: info.num_workers]
        for index in indices:
            noise = torch.rand(3, 8, 8)  # augmented: the same draws only from the same state
            yield torch.full((3, 8, 8), float(index)) + noise, index % 4


def stream_that_splits() -> torch.utils.data.IterableDataset:
    return _Stream(split=True)


def stream_that_repeats() -> torch.utils.data.IterableDataset:
    return _Stream(split=False)


class _Empty(torch.utils.data.IterableDataset):
    def __iter__(self):  # noqa: ANN204
        return iter(())


def empty_stream() -> torch.utils.data.IterableDataset:
    return _Empty()


class PythonObjects(TensorImages):
    """A dataset whose per-sample metadata is Python objects: a list of path strings and
    a list of label ints, as an ImageFolder keeps them, ``length`` of each. Read at
    random by worker processes, every worker copies the main process's pages their
    reference counts touch: its private memory grows with the samples it reads."""

    def __init__(self, length: int = 1_000_000) -> None:
        super().__init__(length=64)
        self.paths = [f"/data/train/n{i % 1000:08d}/{i:08d}.JPEG" for i in range(length)]
        self.targets = [1000 + i for i in range(length)]  # above 256: an object each

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, target = self.paths[index], self.targets[index]
        return self.images[len(path) % 64], target % 10


def python_objects() -> Dataset:
    """A million paths and a million labels: two million Python objects."""
    return PythonObjects()


class CollectsInWorker(TensorImages):
    """Each worker runs one full garbage collection at its 300th sample, as Python does
    on its own once a worker's allocations pass the thresholds it inherited; 2 ms a
    sample, so that the collection falls well inside a window of a few hundred
    batches of 8, between the watcher's private-memory readings (spaced by their cost:
    its first comes at 0.2 s)."""

    def __init__(self) -> None:
        super().__init__(length=1024, delay_s=0.002)
        self.served = 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        import gc

        self.served += 1  # in the worker's copy of the dataset
        if self.served == 300:
            gc.collect()
        return super().__getitem__(index)


def collects_in_worker() -> Dataset:
    return CollectsInWorker()


class BlasTransform(TensorImages):
    """Every sample runs a multi-threaded BLAS call (two 256 x 256 matrix products in
    numpy), as transforms built on numpy, SciPy or OpenCV do."""

    def __init__(self, length: int = 512) -> None:
        import numpy as np

        super().__init__(length=length)
        self.matrix = np.random.default_rng(0).standard_normal((256, 256))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        product = self.matrix @ self.matrix @ self.matrix
        image, label = super().__getitem__(index)
        return image + float(product[0, 0] * 0), label


def blas_transform() -> Dataset:
    return BlasTransform()


class Stragglers(TensorImages):
    """Samples take 1 ms to load, and one in a hundred (index 7, 107, ...) 200 times
    that: a few slow files on a network filesystem. At 200 ms a straggler stalls an
    in-order loop long enough (the other worker idles after its two batches) that out of
    order runs 1.2-1.5x faster in every round on a loaded 2-core machine; at 50 ms the
    gain (1.1-1.3x) sank below the noise in one round in six."""

    def __init__(self, length: int = 1024, base_s: float = 0.001) -> None:
        super().__init__(length=length)
        self.base_s = base_s

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.base_s * (200 if index % 100 == 7 else 1))
        return super().__getitem__(index)


def stragglers() -> Dataset:
    return Stragglers()


class Paced(TensorImages):
    """Each sample takes ``delay_s`` to make, sleeping: the input delivers exactly
    (workers or 1) / ``delay_s`` samples/s whatever the cores. From the ``slow_after``-th
    read of a process on, each takes ``slow_delay_s`` instead (a rate that changes)."""

    def __init__(
        self, length: int, delay_s: float, slow_after: int | None = None,
        slow_delay_s: float = 0.0,
    ) -> None:  # fmt: skip
        super().__init__(length, size=8)
        self.delay_s = delay_s
        self.slow_after = slow_after
        self.slow_delay_s = slow_delay_s
        self.reads = 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads += 1
        slow = self.slow_after is not None and self.reads > self.slow_after
        time.sleep(self.slow_delay_s if slow else self.delay_s)
        return self.images[index], self.labels[index]


class SlowFirstStep:
    """A training step whose first call takes ``first_s`` (cuDNN's autotuning, allocation
    or torch.compile on a GPU) and every later one ``every_s``."""

    def __init__(self, first_s: float, every_s: float = 0.0) -> None:
        self.first_s = first_s
        self.every_s = every_s
        self.calls = 0
        self.spans: list[tuple[float, float]] = []  # each call's start and end (perf_counter)

    def __call__(self, batch: object) -> None:
        self.calls += 1
        delay = self.first_s if self.calls == 1 else self.every_s
        started = time.perf_counter()
        if delay:
            time.sleep(delay)
        self.spans.append((started, time.perf_counter()))


class RankStream(torch.utils.data.IterableDataset):
    """A user's stream that splits itself by rank (read where it is iterated, from
    torchrun's ``RANK`` as MosaicML's and LitData's streams do, else from the process
    group) and by loader worker: rank r yields ``lengths[r]`` samples, labelled
    ``(rank, index)`` as ``rank * 1000 + index``; ``len`` says ``length`` per rank (or
    none with ``length=None``), as MosaicML's and LitData's streams do."""

    def __init__(self, lengths: tuple[int, ...], length: int | None) -> None:
        self.lengths = lengths
        self.length = length

    def __iter__(self):  # noqa: ANN204
        import torch.distributed as dist

        rank = int(os.environ.get("RANK", dist.get_rank() if dist.is_initialized() else 0))
        info = torch.utils.data.get_worker_info()
        indices = range(self.lengths[rank])
        if info is not None:
            indices = indices[info.id :: info.num_workers]
        for index in indices:
            yield torch.zeros(3), rank * 1000 + index

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("this stream has no length")
        return self.length

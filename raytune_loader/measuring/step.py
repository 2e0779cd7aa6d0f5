"""The training step every measurement repeats: the user's job, not a stand-in.

:class:`Trainer` trains one step on a batch as the loader yields it: the batch is
moved to the device (tensors at any depth of tuples, lists and dicts; 4-D image
batches in channels-last layout when asked), then either the built-in step runs
(the model, SGD, cross-entropy, in the chosen precision, optionally compiled) or
the user's own step from ``--train-step module:function``. Precision ``fp32`` and
``tf32`` set PyTorch's matmul and cuDNN flags explicitly; ``bf16`` and ``fp16``
run the forward pass under ``torch.autocast`` (``fp16`` with a gradient scaler).
A trial, the ceiling, verification and the bench all build their step here.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import ModelError
from raytune_loader.factories import import_factory
from raytune_loader.pipeline.device import to_device

StepFn = Callable[[Any], Any]


def default_precision(device: str) -> str:
    """bf16 autocast on a GPU, as people train conv nets on A100/H100-class cards; fp32
    on a CPU, PyTorch's own default there: bf16 pays off only on CPUs with bf16
    instructions and is slower than fp32 on those without (experiments/precision.py
    measures both)."""
    return "bf16" if device.startswith("cuda") else "fp32"


def set_matmul_precision(precision: str) -> None:
    """The process-wide TF32 switches, set explicitly for every measurement."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def batch_samples(batch: Any) -> int:
    """Samples in a batch: the leading size of its first tensor, at any depth (a list
    of file names or other values beside the tensors is passed over)."""
    found = _first_tensor(batch)
    if found is None:
        raise ValueError("a batch without a tensor")
    return int(found.shape[0]) if found.dim() else 1


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


class Trainer:
    """Moves a batch to the device and trains one step on it."""

    def __init__(
        self,
        step: StepFn,
        device: torch.device,
        channels_last: bool = False,
        name: str = "the training step",
    ) -> None:
        self._step = step
        self.device = device
        self.channels_last = channels_last
        self.name = name

    @classmethod
    def for_model(
        cls,
        model: nn.Module,
        device: torch.device,
        precision: str = "fp32",
        channels_last: bool = False,
        compile_model: bool = False,
    ) -> Trainer:
        """The built-in step: cross-entropy and SGD with momentum on ``model`` (the TF32
        switches are the caller's: :func:`set_matmul_precision`)."""
        memory_format = torch.channels_last if channels_last else torch.preserve_format
        model = model.to(device, memory_format=memory_format).train()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from torch.nn.parallel import DistributedDataParallel  # one rank of several

            ids = [_cuda_index(device)] if device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        forward = torch.compile(model) if compile_model else model
        scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None

        def step(batch: Any) -> None:
            inputs, targets = batch[0], batch[1]
            optimizer.zero_grad(set_to_none=True)
            with _autocast(device, precision):
                loss = nn.functional.cross_entropy(forward(inputs), targets)
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()

        return cls(step, device, channels_last, "the training step")

    def to_device(self, batch: Any, non_blocking: bool, config: LoaderConfig | None = None) -> Any:
        """The batch on the device, with the pipeline's device-side stages done."""
        transfer, decode = (config.transfer, config.decode) if config else ("float32", "pil")
        return to_device(
            batch, self.device, transfer=transfer, decode=decode,
            non_blocking=non_blocking, channels_last=self.channels_last,
        )  # fmt: skip

    def step(self, batch: Any) -> None:
        """One training step on ``batch``; the user's failure as a TrainStepError, out of
        memory as itself."""
        try:
            self._step(batch)
        except torch.cuda.OutOfMemoryError:
            raise  # the back-off's business
        except Exception as exc:
            raise TrainStepError(f"{self.name} raised {type(exc).__name__}: {exc}") from exc

    def sync(self) -> None:
        """Wait for the device's queued work (a no-op off CUDA)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _cuda_index(device: torch.device) -> int:
    """The index of a CUDA device; a bare ``cuda`` means the current one (index 0 is a
    device like any other, not a missing index)."""
    return torch.cuda.current_device() if device.index is None else device.index


class TrainStepError(ModelError):
    """The training step raised (not out of memory): the user's model or step is broken."""


@contextlib.contextmanager
def _autocast(device: torch.device, precision: str) -> Iterator[None]:
    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        with torch.autocast(device.type, dtype=dtype):
            yield
    else:
        yield


def user_trainer(
    spec: str, device: torch.device, num_classes: int, channels_last: bool = False
) -> Trainer:
    """The step built by the user's ``module:function`` factory (``--train-step``).

    The factory is called with ``device=`` (and ``num_classes=`` when it accepts it),
    builds its own model and optimizer and returns a callable that trains one step on
    a batch already on the device.
    """
    factory = import_factory(spec, kind="train step", error=ModelError)
    params = inspect.signature(factory).parameters
    kwargs: dict[str, Any] = {"device": device}
    if "num_classes" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs["num_classes"] = num_classes
    try:
        step = factory(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the user's code: say whose and what
        raise ModelError(
            f"--train-step {spec} raised {type(exc).__name__}: {exc}; it is called with "
            "device= (and num_classes=) and must return a callable step(batch)"
        ) from None
    if not callable(step):
        raise ModelError(
            f"--train-step {spec} returned {type(step).__name__}, not a callable step(batch)"
        )
    return Trainer(step, device, channels_last, f"--train-step {spec}")

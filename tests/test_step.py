"""The training step: batches moved to the device whatever their nesting, counted right."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from raytune_loader.measuring.step import Trainer, batch_samples, set_matmul_precision
from raytune_loader.pipeline.device import move

Pair = namedtuple("Pair", ["image", "label"])


@pytest.mark.parametrize(
    ("batch", "samples"),
    [
        (torch.zeros(5, 3), 5),
        ([["a.jpg", "b.jpg"], torch.zeros(2, 3)], 2),  # file names beside the tensors
        ({"idx": [1, 2, 3], "x": torch.zeros(3, 4)}, 3),
        (Pair(torch.zeros(7, 3, 8, 8), torch.zeros(7)), 7),
        ((torch.tensor(1.0),), 1),
    ],
)
def test_the_samples_of_a_batch_are_its_first_tensor_s_rows(batch: object, samples: int) -> None:
    assert batch_samples(batch) == samples


def test_a_batch_without_a_tensor_is_an_error() -> None:
    with pytest.raises(ValueError, match="without a tensor"):
        batch_samples({"names": ["a", "b"]})


def test_moving_keeps_the_structure_and_makes_images_channels_last() -> None:
    batch = {"pair": Pair(torch.zeros(2, 3, 8, 8), torch.zeros(2, dtype=torch.long)), "n": 2}
    moved = move(batch, torch.device("cpu"), non_blocking=False, channels_last=True)
    assert isinstance(moved["pair"], Pair) and moved["n"] == 2
    assert moved["pair"].image.is_contiguous(memory_format=torch.channels_last)
    assert moved["pair"].label.dtype == torch.long  # only 4-D float tensors change layout


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_tf32_switches_are_set_explicitly(precision: str) -> None:
    set_matmul_precision(precision)
    tf32 = precision == "tf32"
    assert torch.backends.cuda.matmul.allow_tf32 is tf32
    assert torch.backends.cudnn.allow_tf32 is tf32
    assert torch.get_float32_matmul_precision() == ("high" if tf32 else "highest")
    set_matmul_precision("fp32")


def test_fp16_trains_with_a_gradient_scaler_on_the_cpu() -> None:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer.for_model(model, torch.device("cpu"), precision="fp16")
    trainer.step([torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 2, 0])])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


class _StaysOnTheCpu(torch.nn.Linear):
    """A model whose move to the GPU is a no-op: the only CUDA call it stands in for."""

    def to(self, *args: object, **kwargs: object) -> _StaysOnTheCpu:
        return self


@pytest.mark.parametrize(("device", "expected"), [("cuda:0", 0), ("cuda:2", 2), ("cuda", 3)])
def test_a_rank_s_ddp_model_is_placed_on_its_own_cuda_device(
    monkeypatch: pytest.MonkeyPatch, device: str, expected: int
) -> None:
    placed: list[list[int] | None] = []

    def ddp(model: torch.nn.Module, device_ids: list[int] | None = None) -> torch.nn.Module:
        placed.append(device_ids)
        return model

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", ddp)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)  # not 0: a fallback shows
    Trainer.for_model(_StaysOnTheCpu(4, 2), torch.device(device))
    assert placed == [[expected]]

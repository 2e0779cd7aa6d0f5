"""Memory a configuration needs: refused before it starts when it would not fit."""

from __future__ import annotations

import pytest
import torch

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.engines import engine_of
from raytune_loader.errors import TrialRefusedError
from raytune_loader.measuring.memory import cap_gpu_memory, check_bytes, sample_nbytes


def test_a_sample_s_bytes_count_its_tensors_and_its_numbers() -> None:
    assert sample_nbytes((torch.zeros(3, 224, 224), torch.tensor(1))) == 3 * 224 * 224 * 4 + 8
    assert sample_nbytes({"image": torch.zeros(2, dtype=torch.uint8), "label": 3}) == 2 + 8


def test_refuses_what_would_not_fit_in_shm_or_ram() -> None:
    config = LoaderConfig(256, 8, 8, False, True)
    held = engine_of(config).held(3 * 224 * 224 * 4)
    with pytest.raises(TrialRefusedError) as shm:
        check_bytes(config.label(), held, available_ram=64 << 30, free_shm=64 << 20)
    assert shm.value.reason == "shm" and "--shm-size" in str(shm.value)
    assert "fewer workers or a smaller prefetch_factor" in str(shm.value)
    with pytest.raises(TrialRefusedError) as ram:
        check_bytes(config.label(), held, available_ram=1 << 30, free_shm=None)
    assert ram.value.reason == "host_memory"
    small = engine_of(LoaderConfig(8)).held(100)
    assert check_bytes("small", small, 64 << 30, 64 << 20) == 8 * 100


@pytest.mark.parametrize(("share", "expected"), [(0.25, 0.25), (0.5, 0.5), (1.0, 1.0), (0, 1.0)])
def test_a_fractional_gpu_share_caps_the_allocator(
    monkeypatch: pytest.MonkeyPatch, share: float, expected: float
) -> None:
    """The CUDA boundary: --gpus-per-trial below 1 becomes the allocator's memory cap, on
    the current device's index (torch refuses a "cuda" device without one); the whole
    GPU is a cap of 1, set too."""
    applied: list[tuple[float, int]] = []

    def set_fraction(fraction: float, device: int) -> None:
        assert isinstance(device, int), "torch needs a device index"
        applied.append((fraction, device))

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)  # e.g. rank 3's GPU
    assert cap_gpu_memory(share, torch.device("cuda")) == expected
    assert applied == [(expected, 3)]
    cap_gpu_memory(share, torch.device("cuda:1"))
    assert applied[-1] == (expected, 1)
    assert cap_gpu_memory(share, torch.device("cpu")) is None
    assert len(applied) == 2  # nothing set off CUDA


def test_a_reused_process_gets_the_whole_gpu_back_after_a_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ray worker measures a 0.5-GPU trial, then a verification run with the whole GPU:
    the allocator's cap is the process's, so the second measurement must lift it."""
    cap = {0: 1.0}  # the allocator's state, as torch keeps it per device for the process
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device: cap.__setitem__(device, fraction))  # fmt: skip
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cap_gpu_memory(0.5, torch.device("cuda"))
    assert cap[0] == 0.5
    cap_gpu_memory(1.0, torch.device("cuda"))
    assert cap[0] == 1.0

"""Tests for raytune_loader.machine.nvml through a scripted stand-in for the pynvml binding.

The stand-in raises the real `pynvml.NVMLError` with the real error constants, so
the sampler is exercised against the same failure modes it meets on a GPU host.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
import torch

from raytune_loader.machine import nvml

OUR_PID = 4242
OTHER_PID = 777
UUID = "GPU-12345678-1234-1234-1234-123456789abc"
LONG_INTERVAL_S = 60.0  # the thread never polls on its own; tests drive _poll_once


def sample(pid: int, ts: int, sm: int) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeNvml:
    """Stand-in for the pynvml module: same functions, scripted answers, call log."""

    NVMLError = pynvml.NVMLError
    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND

    def __init__(
        self,
        process: Iterable[Any] = (),
        device: Iterable[Any] = (),
        init_error: Exception | None = None,
        handle_error: Exception | None = None,
    ) -> None:
        # Each process/device entry answers one call; an exception entry is raised.
        # Once a script runs out, process calls say NOT_FOUND and device calls repeat 0%.
        self.process_script = list(process)
        self.device_script = list(device)
        self.init_error = init_error
        self.handle_error = handle_error
        self.init_calls = 0
        self.shutdown_calls = 0
        self.uuids_seen: list[str | bytes] = []
        self.timestamps_passed: list[int] = []
        self.handle = object()

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> object:
        self.uuids_seen.append(uuid)
        if self.handle_error is not None:
            raise self.handle_error
        return self.handle

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        raise AssertionError(f"looked up device by index {index}; must use the UUID")

    def nvmlDeviceGetProcessUtilization(self, handle: object, timestamp: int) -> list[Any]:
        assert handle is self.handle
        self.timestamps_passed.append(timestamp)
        answer = (
            self.process_script.pop(0)
            if self.process_script
            else nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        )
        if isinstance(answer, Exception):
            raise answer
        return answer

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> SimpleNamespace:
        assert handle is self.handle
        answer = self.device_script.pop(0) if self.device_script else 0
        if isinstance(answer, Exception):
            raise answer
        return SimpleNamespace(gpu=answer, memory=0)


def run_window(fake: FakeNvml, polls: int, uuid: str | None = UUID) -> nvml.UtilReading:
    """start(), `polls` explicit polls, then stop() (which adds one final poll)."""
    sampler = nvml.UtilizationSampler(uuid, pid=OUR_PID, interval_s=LONG_INTERVAL_S, binding=fake)  # type: ignore[arg-type]
    sampler.start()
    for _ in range(polls):
        sampler._poll_once()
    return sampler.stop()


def test_only_samples_of_our_pid_count() -> None:
    fake = FakeNvml(
        process=[
            [],  # baseline: nothing buffered before start
            [sample(OUR_PID, 10, 40), sample(OTHER_PID, 11, 100)],
            [sample(OTHER_PID, 20, 100), sample(OUR_PID, 21, 60)],
            [sample(OTHER_PID, 30, 90)],
        ],
        device=[80, 90, 100],
    )
    reading = run_window(fake, polls=2)
    assert reading.source == "nvml-process"
    assert reading.samples == 2
    assert reading.util == pytest.approx(0.50)
    assert reading.device_util == pytest.approx(0.90)


def test_samples_before_start_and_repeats_are_not_counted() -> None:
    before = sample(OUR_PID, 100, 0)
    fresh = sample(OUR_PID, 200, 80)
    fake = FakeNvml(
        process=[
            [sample(OUR_PID, 50, 0), before],  # baseline: buffered before start()
            [before, fresh],  # a stand-in that ignores lastSeen returns old ones again
            [fresh],  # the same sample a second time
            [sample(OUR_PID, 150, 0), sample(OUR_PID, 300, 40)],  # 150 is stale
        ],
    )
    reading = run_window(fake, polls=2)
    assert reading.samples == 2
    assert reading.util == pytest.approx(0.60)
    assert fake.timestamps_passed == [0, 100, 200, 200]


def test_not_found_means_no_sample_and_device_mean_is_used() -> None:
    not_found = nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
    fake = FakeNvml(process=[not_found] * 4, device=[20, 40, 90])
    reading = run_window(fake, polls=2)
    assert reading.source == "nvml-device"
    assert reading.samples == 0
    assert reading.util == pytest.approx(0.50)
    assert reading.device_util == pytest.approx(0.50)
    # NOT_FOUND is not a failure: the per-process call was retried on every poll.
    assert len(fake.timestamps_passed) == 4


def test_samples_only_of_other_pids_give_a_warning_and_say_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # In a PID namespace NVML reports host pids: this process's own pid never matches.
    fake = FakeNvml(
        process=[
            [],
            [sample(OTHER_PID, 10, 70), sample(OTHER_PID + 1, 11, 30)],
            [sample(OTHER_PID, 20, 90)],
        ],
        device=[60, 80],
    )
    with caplog.at_level(logging.WARNING, logger="raytune_loader.machine.nvml"):
        reading = run_window(fake, polls=1)
    assert reading.source == "nvml-device-other-pids"
    assert reading.util == pytest.approx(0.70)  # the device-wide mean, neighbours included
    assert reading.samples == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"{[OTHER_PID, OTHER_PID + 1]}" in warnings[0].getMessage()
    assert f"pid {OUR_PID}" in warnings[0].getMessage()


def test_no_per_process_sample_at_all_is_device_wide_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeNvml(process=[[], [], []], device=[40, 60])
    with caplog.at_level(logging.WARNING, logger="raytune_loader.machine.nvml"):
        reading = run_window(fake, polls=1)
    assert reading.source == "nvml-device"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_zero_count_success_error_means_no_sample() -> None:
    # nvidia-ml-py raises NVMLError(NVML_SUCCESS) when the sizing call finds no samples.
    empty = nvml_error(pynvml.NVML_SUCCESS)
    fake = FakeNvml(process=[empty, empty, [sample(OUR_PID, 5, 70)]], device=[10, 10])
    reading = run_window(fake, polls=1)
    assert reading.source == "nvml-process"
    assert reading.util == pytest.approx(0.70)


def test_a_sample_landing_between_the_binding_s_two_calls_skips_only_that_poll(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """nvidia-ml-py sizes the buffer, then reads: a sample arriving in between makes the
    read fail with INSUFFICIENT_SIZE. The next poll answers; the window stays per-process."""
    fake = FakeNvml(
        process=[
            [],
            [sample(OUR_PID, 10, 40)],
            nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE),
            [sample(OTHER_PID, 20, 100), sample(OUR_PID, 21, 80)],
        ],
        device=[90, 90, 90],
    )
    with caplog.at_level(logging.INFO, logger="raytune_loader.machine.nvml"):
        reading = run_window(fake, polls=2)
    assert reading.source == "nvml-process"
    assert reading.util == pytest.approx(0.60)  # 40 and 80: the neighbour's 100 not counted
    assert len(fake.timestamps_passed) == 4  # still asked after the failed poll
    assert fake.timestamps_passed[-1] == 10  # from the last sample seen, none lost or re-read
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert said == ["NVML polls skipped in this window: 1 per-process (Insufficient Size)"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    "refusal", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION]
)
def test_nvml_s_refusal_switches_per_process_sampling_off_and_says_so(
    caplog: pytest.LogCaptureFixture, refusal: int
) -> None:
    fake = FakeNvml(
        process=[[], [sample(OUR_PID, 10, 90)], nvml_error(refusal), [sample(OUR_PID, 20, 90)]],
        device=[30, 50, 70],
    )
    with caplog.at_level(logging.WARNING, logger="raytune_loader.machine.nvml"):
        reading = run_window(fake, polls=2)
    assert reading.source == "nvml-device"  # the part-window of per-process samples is not used
    assert reading.util == pytest.approx(0.50)
    assert len(fake.timestamps_passed) == 3  # never asked again
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "device-wide" in warning and "every process on this GPU" in warning


@pytest.mark.parametrize(
    "passing", [pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_TIMEOUT]
)
def test_any_other_nvml_error_costs_its_poll_only(passing: int) -> None:
    fake = FakeNvml(
        process=[[], nvml_error(passing), [sample(OUR_PID, 10, 30)]],
        device=[nvml_error(passing), 40],
    )
    reading = run_window(fake, polls=1)
    assert reading.source == "nvml-process" and reading.util == pytest.approx(0.30)
    assert reading.device_util == pytest.approx(0.40)  # the device-wide query kept going too


def test_a_skipped_baseline_is_taken_by_the_first_poll_that_answers() -> None:
    before = sample(OUR_PID, 100, 0)  # buffered before start(): never counted
    fake = FakeNvml(
        process=[
            nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE),  # the baseline's query
            [before],  # the first poll answers: the baseline
            [before, sample(OUR_PID, 200, 50)],
        ],
    )
    reading = run_window(fake, polls=1)
    assert reading.samples == 1 and reading.util == pytest.approx(0.50)
    assert fake.timestamps_passed == [0, 0, 100]


def test_init_library_not_found_falls_back_to_step_timing() -> None:
    fake = FakeNvml(init_error=nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    reading = run_window(fake, polls=0)
    assert reading == nvml.UtilReading(util=None, device_util=None, source="step-timing", samples=0)
    assert fake.shutdown_calls == 0
    assert fake.uuids_seen == []


def test_missing_binding_module_falls_back_to_step_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    sampler = nvml.UtilizationSampler(UUID, interval_s=LONG_INTERVAL_S)
    sampler.start()
    assert sampler.stop().source == "step-timing"


def test_none_uuid_falls_back_without_touching_nvml() -> None:
    fake = FakeNvml()
    reading = run_window(fake, polls=1, uuid=None)
    assert reading.source == "step-timing"
    assert reading.util is None
    assert fake.init_calls == 0


def test_unknown_uuid_falls_back_and_still_shuts_down() -> None:
    fake = FakeNvml(handle_error=nvml_error(pynvml.NVML_ERROR_NOT_FOUND))
    reading = run_window(fake, polls=1)
    assert reading.source == "step-timing"
    assert fake.shutdown_calls == 1


def test_handle_is_looked_up_by_the_given_uuid() -> None:
    fake = FakeNvml()
    run_window(fake, polls=0)
    assert fake.uuids_seen == [UUID]


def test_shutdown_once_even_when_stop_is_repeated() -> None:
    fake = FakeNvml(process=[[], [sample(OUR_PID, 1, 10)]])
    sampler = nvml.UtilizationSampler(UUID, pid=OUR_PID, interval_s=LONG_INTERVAL_S, binding=fake)  # type: ignore[arg-type]
    with sampler:
        pass
    first = sampler.reading
    assert sampler.stop() is first
    assert fake.init_calls == 1
    assert fake.shutdown_calls == 1
    assert first is not None and first.source == "nvml-process"


def test_final_poll_fills_a_short_window() -> None:
    fake = FakeNvml(process=[[], [sample(OUR_PID, 3, 25)]], device=[25])
    reading = run_window(fake, polls=0)
    assert reading.source == "nvml-process"
    assert reading.samples == 1


def test_unexpected_binding_failure_mid_window_degrades_quietly() -> None:
    fake = FakeNvml(
        process=[[], [sample(OUR_PID, 1, 50)], RuntimeError("driver gone")], device=[60]
    )
    reading = run_window(fake, polls=2)  # second poll raises; stop() must not
    assert reading.source == "nvml-process"
    assert reading.util == pytest.approx(0.50)
    assert fake.shutdown_calls == 1


def test_background_thread_polls_until_stopped() -> None:
    polled = threading.Event()
    fake = FakeNvml(process=[[]] + [[sample(OUR_PID, ts, 20)] for ts in range(1, 50)])
    original = fake.nvmlDeviceGetUtilizationRates
    calls = 0

    def counting(handle: object) -> SimpleNamespace:
        nonlocal calls
        calls += 1
        if calls >= 3:
            polled.set()
        return original(handle)

    fake.nvmlDeviceGetUtilizationRates = counting  # type: ignore[method-assign]
    sampler = nvml.UtilizationSampler(UUID, pid=OUR_PID, interval_s=0.005, binding=fake)  # type: ignore[arg-type]
    sampler.start()
    assert polled.wait(timeout=0.2)
    reading = sampler.stop()
    assert reading.source == "nvml-process"
    assert reading.samples >= 3
    assert reading.util == pytest.approx(0.20)


def test_start_twice_is_a_usage_error() -> None:
    sampler = nvml.UtilizationSampler(None)
    sampler.start()
    with pytest.raises(RuntimeError):
        sampler.start()


def test_non_positive_interval_is_rejected() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        nvml.UtilizationSampler(UUID, interval_s=0)


def test_uuid_is_none_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert nvml.device_uuid_for_torch_device(0) is None


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        (
            "NVIDIA H100 80GB HBM3",
            "0a1b2c3d-0000-1111-2222-333344445555",
            "GPU-0a1b2c3d-0000-1111-2222-333344445555",
        ),
        (
            "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
            "0a1b2c3d-0000-1111-2222-333344445555",
            "MIG-0a1b2c3d-0000-1111-2222-333344445555",
        ),
        (
            "NVIDIA H100 80GB HBM3",
            "GPU-0a1b2c3d-0000-1111-2222-333344445555",
            "GPU-0a1b2c3d-0000-1111-2222-333344445555",
        ),
    ],
)
def test_uuid_is_formatted_for_nvml(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    raw: str,
    expected: str,
) -> None:
    class TorchUuid:  # torch's _CUuuid prints the bare 8-4-4-4-12 form
        def __str__(self) -> str:
            return raw

    seen: list[int] = []

    def properties(index: int) -> SimpleNamespace:
        seen.append(index)
        return SimpleNamespace(name=name, uuid=TorchUuid())

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    assert nvml.device_uuid_for_torch_device(1) == expected
    assert seen == [1]


def test_real_binding_never_raises_for_an_unknown_device() -> None:
    # No GPU: nvmlInit fails with LIBRARY_NOT_FOUND. GPU: the bogus UUID is not found.
    sampler = nvml.UtilizationSampler(UUID, interval_s=LONG_INTERVAL_S)
    sampler.start()
    assert sampler.stop().source == "step-timing"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and NVML")
def test_real_uuid_resolves_to_the_same_nvml_device() -> None:
    uuid = nvml.device_uuid_for_torch_device(torch.cuda.current_device())
    assert uuid is not None
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        assert pynvml.nvmlDeviceGetUUID(handle) == uuid
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and NVML")
def test_real_sampler_sees_a_busy_gpu() -> None:
    uuid = nvml.device_uuid_for_torch_device(torch.cuda.current_device())
    x = torch.randn(4096, 4096, device="cuda")
    with nvml.UtilizationSampler(uuid, interval_s=0.05) as sampler:
        for _ in range(400):
            x = (x @ x).tanh()
        torch.cuda.synchronize()
    reading = sampler.reading
    assert reading is not None
    assert reading.source in ("nvml-process", "nvml-device")
    assert reading.util is not None and reading.util > 0.2

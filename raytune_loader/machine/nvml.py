"""GPU utilization sampling through NVML; every NVML call in the project lives here.

A `UtilizationSampler` polls NVML in a background thread between `start()` and
`stop()` and reports how busy the GPU was for *this* process over that window
(per-process SM samples, attributed by pid so another trial sharing the GPU is not
counted), with the device-wide utilization recorded beside it. When per-process
samples are unavailable it falls back to the device-wide figure (`nvml-device`).
When NVML has per-process samples but none for this pid (a PID namespace, as in a
container, shows NVML's host pids, not ours) it falls back too, but with a warning
and `source="nvml-device-other-pids"`: that figure counts every process sharing the
GPU, such as a neighbouring 0.5-GPU trial. When NVML itself is unusable (no
driver, no library, no device UUID) it reports `source="step-timing"` so the
caller can substitute its own compute-time share.
A query that fails for a moment (``INSUFFICIENT_SIZE``: a sample landed between
nvidia-ml-py's sizing call and its reading call) skips that poll only; NVML's
refusals (``NOT_SUPPORTED``, ``NO_PERMISSION``) switch that query off for the
window, with a warning, since the device-wide figure then stands for this process.
The sampler never raises because of NVML. The binding module is injectable so the
whole path can be exercised on a CPU with a stand-in.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

logger = logging.getLogger(__name__)

_BINDING_MODULE = "pynvml"
# Values in nvml.h; read from the binding when present.
_NOT_FOUND_DEFAULT = 6
_SUCCESS_DEFAULT = 0
# the errors that say a query will never answer here (the driver or this user cannot);
# any other is taken as passing and costs only its poll
_REFUSALS_DEFAULT = {"NVML_ERROR_NOT_SUPPORTED": 3, "NVML_ERROR_NO_PERMISSION": 4}
_MIN_JOIN_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class UtilReading:
    """Utilization over one sampling window; fractions are in 0..1."""

    util: float | None
    device_util: float | None
    source: str
    samples: int


_STEP_TIMING = UtilReading(util=None, device_util=None, source="step-timing", samples=0)


def driver_version(binding: str = _BINDING_MODULE) -> str | None:
    """The NVIDIA driver's version, or None where NVML is unusable."""
    try:
        nvml = importlib.import_module(binding)
        nvml.nvmlInit()
        try:
            version = nvml.nvmlSystemGetDriverVersion()
        finally:
            nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - any NVML failure just means "unknown"
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def device_uuid_for_torch_device(index: int) -> str | None:
    """UUID string NVML understands for torch CUDA device `index`; None without CUDA.

    NVML ignores CUDA_VISIBLE_DEVICES, so the UUID (not the index) is what ties a
    torch device to an NVML handle. torch prints the bare 8-4-4-4-12 hex form;
    NVML wants it prefixed with "GPU-" (or "MIG-" for a MIG instance).
    """
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(index)
    raw = getattr(props, "uuid", None)
    if raw is None:
        return None
    text = str(raw).strip()
    if text.startswith(("GPU-", "MIG-")):
        return text
    prefix = "MIG-" if "MIG" in str(props.name).split() else "GPU-"
    return prefix + text


class UtilizationSampler:
    """Samples NVML utilization for one process on one device between start() and stop()."""

    def __init__(
        self,
        device_uuid: str | None,
        pid: int | None = None,
        interval_s: float = 0.1,
        binding: ModuleType | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        self.device_uuid = device_uuid
        self.pid = os.getpid() if pid is None else pid
        self.interval_s = interval_s
        self.reading: UtilReading | None = None
        self._binding = binding
        self._nvml: Any = None  # the binding, set only once nvmlInit succeeded
        self._handle: Any = None
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._polling = False
        self._process_supported = True
        self._device_supported = True
        self._last_seen_us: int | None = None  # None until a query marks what came before
        self._skipped: dict[str, int] = {}  # polls skipped, by the error that skipped them
        self._process_sm: list[int] = []
        self._other_pids: set[int] = set()
        self._device_gpu: list[int] = []

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Open NVML, take the baseline timestamp and begin polling in a daemon thread."""
        if self._started:
            raise RuntimeError("UtilizationSampler.start() called twice; use a new sampler")
        self._started = True
        if not self._open():
            return
        self._polling = True
        self._guarded(self._take_baseline)
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> UtilReading:
        """Stop polling, take one final poll, close NVML and return the window's reading."""
        if self.reading is not None:
            return self.reading
        self._stop_event.set()
        if self._thread_stopped():
            # A final poll so a window shorter than interval_s still gets a sample.
            self._poll_once()
        self._polling = False
        self.reading = self._summarize()
        self._close()
        return self.reading

    def _thread_stopped(self) -> bool:
        if self._thread is None:
            return True
        self._thread.join(timeout=max(_MIN_JOIN_TIMEOUT_S, 5 * self.interval_s))
        if self._thread.is_alive():
            # Stuck inside an NVML call: skip the final poll rather than wait on it.
            logger.warning("NVML sampler thread did not stop in time; using samples so far")
            return False
        return True

    def __enter__(self) -> UtilizationSampler:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- NVML session --------------------------------------------------------------

    def _open(self) -> bool:
        """Initialise NVML and find the device handle; False means step-timing."""
        if self.device_uuid is None:
            logger.info("No CUDA device UUID; GPU utilization falls back to step timing")
            return False
        binding = self._load_binding()
        if binding is None:
            return False
        try:
            binding.nvmlInit()
        except binding.NVMLError as err:
            logger.info("NVML unavailable (%s); GPU utilization falls back to step timing", err)
            return False
        self._nvml = binding
        try:
            # The UUID is passed as given: nvidia-ml-py encodes str to bytes itself.
            self._handle = binding.nvmlDeviceGetHandleByUUID(self.device_uuid)
        except binding.NVMLError as err:
            logger.info(
                "NVML has no device %s (%s); falling back to step timing", self.device_uuid, err
            )
            self._close()
            return False
        return True

    def _load_binding(self) -> Any:
        if self._binding is not None:
            return self._binding
        try:
            return importlib.import_module(_BINDING_MODULE)
        except ImportError as err:
            logger.info(
                "%s not importable (%s); GPU utilization falls back to step timing",
                _BINDING_MODULE,
                err,
            )
            return None

    def _close(self) -> None:
        nvml, self._nvml, self._handle = self._nvml, None, None
        if nvml is None:
            return
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as err:
            logger.debug("nvmlShutdown failed: %s", err)

    # -- polling -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self._poll_once()

    def _poll_once(self) -> None:
        """One guarded poll; the thread and stop() both call this."""
        self._guarded(self._poll)

    def _guarded(self, action: Callable[[], None]) -> None:
        """Run a polling step; an unexpected binding failure stops polling, never raises."""
        if not self._polling:
            return
        try:
            action()
        except Exception:  # noqa: BLE001 - a background thread has no caller to raise to
            logger.warning("NVML polling failed; keeping samples so far", exc_info=True)
            self._polling = False

    def _take_baseline(self) -> None:
        """Mark every sample NVML already holds as seen, so pre-start samples never count.
        A skipped query leaves it to the first poll that answers."""
        samples = self._query_process_samples(0)
        if samples is not None:
            self._last_seen_us = max((int(s.timeStamp) for s in samples), default=0)

    def _poll(self) -> None:
        """One poll: new per-process samples for our pid, plus one device-wide reading."""
        with self._lock:
            if self._handle is None:
                return
            self._poll_process()
            self._poll_device()

    def _poll_process(self) -> None:
        if self._last_seen_us is None:  # the baseline's query was skipped: this is it
            self._take_baseline()
            return
        previous = self._last_seen_us
        samples = self._query_process_samples(previous)
        fresh = [s for s in samples or () if int(s.timeStamp) > previous]
        if not fresh:
            return
        self._last_seen_us = max(int(s.timeStamp) for s in fresh)
        self._process_sm.extend(int(s.smUtil) for s in fresh if int(s.pid) == self.pid)
        self._other_pids.update(int(s.pid) for s in fresh if int(s.pid) != self.pid)

    def _query_process_samples(self, last_seen_us: int) -> list[Any] | None:
        """Samples newer than `last_seen_us`; [] when there are none or the query is
        refused here, None when this poll's query failed and was skipped."""
        if not self._process_supported:
            return []
        nvml = self._nvml
        try:
            return list(nvml.nvmlDeviceGetProcessUtilization(self._handle, last_seen_us))
        except nvml.NVMLError as err:
            if _is_no_sample(nvml, err):
                return []
            if _is_refusal(nvml, err):
                logger.warning(
                    "NVML refuses per-process GPU utilization (%s): util is device-wide from "
                    "here on, and counts every process on this GPU (a trial sharing it too)",
                    err,
                )
                self._process_supported = False
                return []
            self._skip("per-process", err)
            return None

    def _poll_device(self) -> None:
        if not self._device_supported:
            return
        nvml = self._nvml
        try:
            rates = nvml.nvmlDeviceGetUtilizationRates(self._handle)
        except nvml.NVMLError as err:
            if _is_refusal(nvml, err):
                logger.warning("NVML refuses device-wide GPU utilization: %s", err)
                self._device_supported = False
            else:
                self._skip("device-wide", err)
            return
        self._device_gpu.append(int(rates.gpu))

    def _skip(self, query: str, err: Exception) -> None:
        """One poll of ``query`` lost to a passing error; counted, said at the window's end."""
        key = f"{query} ({err})"
        self._skipped[key] = self._skipped.get(key, 0) + 1
        logger.debug("NVML %s query failed (%s); this poll is skipped", query, err)

    # -- result --------------------------------------------------------------------

    def _summarize(self) -> UtilReading:
        if self._skipped:
            logger.info(
                "NVML polls skipped in this window: %s",
                ", ".join(f"{count} {key}" for key, count in self._skipped.items()),
            )
        device_util = _mean_fraction(self._device_gpu)
        if self._process_supported and self._process_sm:
            return UtilReading(
                util=_mean_fraction(self._process_sm),
                device_util=device_util,
                source="nvml-process",
                samples=len(self._process_sm),
            )
        if device_util is None:
            return _STEP_TIMING
        source = "nvml-device"
        if self._process_supported and self._other_pids:
            source = "nvml-device-other-pids"
            logger.warning(
                "NVML has per-process GPU samples for pids %s but none for this process "
                "(pid %d; a PID namespace hides it): util is device-wide and counts "
                "every process on this GPU",
                sorted(self._other_pids),
                self.pid,
            )
        return UtilReading(util=device_util, device_util=device_util, source=source, samples=0)


def _is_no_sample(nvml: Any, err: Exception) -> bool:
    # NOT_FOUND is NVML's "nothing newer than lastSeen"; nvidia-ml-py raises
    # NVMLError(NVML_SUCCESS) when the sizing call reports zero samples.
    value = getattr(err, "value", None)
    no_sample = {
        getattr(nvml, "NVML_ERROR_NOT_FOUND", _NOT_FOUND_DEFAULT),
        getattr(nvml, "NVML_SUCCESS", _SUCCESS_DEFAULT),
    }
    return value in no_sample


def _is_refusal(nvml: Any, err: Exception) -> bool:
    """NOT_SUPPORTED or NO_PERMISSION: the query will not answer in this window."""
    refusals = {getattr(nvml, name, value) for name, value in _REFUSALS_DEFAULT.items()}
    return getattr(err, "value", None) in refusals


def _mean_fraction(percents: list[int]) -> float | None:
    if not percents:
        return None
    return sum(percents) / len(percents) / 100.0

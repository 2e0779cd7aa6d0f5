"""What this machine offers a data loader: usable CPUs, memory, accelerator.

Usable CPUs are the smallest of the CPU affinity set and the cgroup CPU quota
(v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``), because in
containers ``os.cpu_count()`` reports the host's cores, not the ones we may use.
:func:`hardware_info` is what ``best_config.json`` records so that a config can
warn when it is loaded on a different machine.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import socket
from pathlib import Path
from typing import Any

import psutil

from raytune_loader.machine import nvml

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _affinity_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs allowed by the cgroup quota under ``root``, or None when unlimited."""
    cpu_max = _read(root / "cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"
    if cpu_max:
        quota, _, period = cpu_max.partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    quota_v1 = _read(root / "cpu" / "cpu.cfs_quota_us") or _read(root / "cpu.cfs_quota_us")
    period_v1 = _read(root / "cpu" / "cpu.cfs_period_us") or _read(root / "cpu.cfs_period_us")
    if quota_v1 and period_v1 and int(quota_v1) > 0:
        return int(quota_v1) / int(period_v1)
    return None


def usable_cpus(cgroup_root: Path = CGROUP_ROOT) -> int:
    """Smallest of the affinity set and the cgroup quota (rounded up), at least 1."""
    cpus = _affinity_cpus()
    quota = cgroup_cpu_limit(cgroup_root)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def shm_bytes(path: str = "/dev/shm") -> int | None:
    """Free bytes in the shared-memory filesystem DataLoader workers send batches through."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _cpuinfo_field(key: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The first CPU's ``key`` in ``/proc/cpuinfo``; None where there is none (not Linux)."""
    text = _read(cpuinfo) or ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith(key)), None)  # fmt: skip


def _cpu_model() -> str:
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


# the x86 flags (/proc/cpuinfo) of instructions that compute in each half precision
HALF_PRECISION_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}


def cpu_computes_in(precision: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Whether this CPU has instructions for ``precision`` (``bf16`` or ``fp16``); None
    where its flags cannot be read (not Linux on x86). Without them PyTorch emulates
    the format, and a model's step runs several times slower than in fp32."""
    flags = _cpuinfo_field("flags", cpuinfo)
    if flags is None:
        return None
    return any(flag in flags.split() for flag in HALF_PRECISION_FLAGS[precision])


def cuda_available() -> bool:
    """Whether torch sees a CUDA device."""
    import torch

    return torch.cuda.is_available()


def gpu_info() -> dict[str, Any]:
    """Name, memory and count of the visible CUDA devices (empty values without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu_name": None, "gpu_count": 0, "gpu_memory_bytes": None, "cuda": None}
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu_name": props.name,
        "gpu_count": torch.cuda.device_count(),
        "gpu_memory_bytes": props.total_memory,
        "cuda": torch.version.cuda,
    }


def hardware_info() -> dict[str, Any]:
    """The machine facts recorded in best_config.json."""
    import torch

    info: dict[str, Any] = {
        "node": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "usable_cpus": usable_cpus(),
        "logical_cpus": os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
        "shm_bytes": shm_bytes(),
        "torch": torch.__version__,
    }
    info.update(gpu_info())
    info["driver"] = nvml.driver_version() if info["gpu_count"] else None
    return info


_CPU_TIMES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_time_stolen() -> tuple[float, float]:
    """(seconds the hypervisor ran other guests on this machine's CPUs, seconds of CPU
    time in all) since boot, summed over its CPUs: Linux's ``steal``, 0 elsewhere. A
    cloud VM whose neighbours are busy loses that share of every measurement's time."""
    times = psutil.cpu_times()
    total = sum(getattr(times, name, 0.0) for name in _CPU_TIMES)  # guest is within user
    return getattr(times, "steal", 0.0), total


def stolen_share(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """The share of the CPU time between two :func:`cpu_time_stolen` readings that the
    hypervisor gave to other guests (None: no time passed)."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else None


def cpu_and_gpu_summary() -> dict[str, Any]:
    """The facts that decide whether a tuned config still applies on this machine."""
    info = gpu_info()
    return {
        "cpu_model": _cpu_model(),
        "usable_cpus": usable_cpus(),
        "gpu_name": info["gpu_name"],
        "gpu_count": info["gpu_count"],
    }


def hardware_class(facts: dict[str, Any]) -> str:
    """A folder-safe name for a kind of node: the best loader depends on it."""
    import re

    gpu = facts.get("gpu_name") or "cpu"
    gpus = int(facts.get("node_gpus") or 0)
    ram_gb = round((facts.get("ram_bytes") or 0) / 2**30)
    text = f"{facts.get('cpu_model', 'cpu')}-{int(facts.get('node_cpus') or 0)}cpu-{gpu}"
    text += f"-x{gpus}-{ram_gb}gb" if gpus else f"-{ram_gb}gb"
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()

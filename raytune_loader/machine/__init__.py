"""What this machine offers a data loader, and its processes watched.

:mod:`~raytune_loader.machine.hardware` says what a loader can use here (usable CPUs
under affinity and cgroup quotas, RAM, ``/dev/shm``, the accelerator, the hardware
class a result is tied to); :mod:`~raytune_loader.machine.nvml` holds every NVML call
(per-process GPU utilization); :mod:`~raytune_loader.machine.watch` reads a measurement's
processes while it trains (memory, threads, CPU time). Nothing here knows a candidate.

May import: the foundations (``errors``, ``progress``, ``factories``, ``files``).
"""

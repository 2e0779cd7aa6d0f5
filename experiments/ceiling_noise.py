"""How much the ceiling moves on this machine, and how much of that its hypervisor took.

    python experiments/ceiling_noise.py [--measurements 8]

The default job's ceiling (the model on a resident batch, the best of three windows,
as the search measures it) measured again and again in one quiet process, each
measurement with the share of the machine's CPU time the hypervisor gave other guests
meanwhile (Linux's CPU steal, :func:`~raytune_loader.machine.hardware.stolen_share`).
Recorded: each ceiling and its steal share, the spread (the highest over the lowest),
and the first measurement's share of the highest, which is what a search's progress
lines divide by until verification measures the ceiling again. Writes
results/benchmarks/ceiling_noise.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import default_job, save
from raytune_loader.machine import hardware
from raytune_loader.measuring.measure import measure_ceiling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measurements", type=int, default=8)
    args = parser.parse_args()
    job = default_job(steps=48)
    batch = 32 if job.device == "cpu" else 256
    measured = []
    started = time.monotonic()
    for i in range(args.measurements):
        before = hardware.cpu_time_stolen()
        _, rate = measure_ceiling(job, batch)
        steal = hardware.stolen_share(before, hardware.cpu_time_stolen()) or 0.0
        at = round(time.monotonic() - started, 1)
        measured.append(
            {"at_s": at, "samples_per_s": round(rate, 1), "steal_frac": round(steal, 4)}
        )
        print(f"{i + 1}/{args.measurements}: {rate:.0f} samples/s, steal {steal:.1%}", flush=True)
    rates = [m["samples_per_s"] for m in measured]
    steals = [m["steal_frac"] for m in measured]
    save("ceiling_noise", {
        "model": job.model, "device": job.device, "batch_size": batch,
        "measurements": measured,
        "highest_over_lowest": round(max(rates) / min(rates), 3),
        "first_of_highest": round(rates[0] / max(rates), 3),
        "median_steal_frac": round(statistics.median(steals), 4),
        "steal_rate_correlation": round(statistics.correlation(steals, rates), 3)
        if len(set(steals)) > 1 and len(set(rates)) > 1 else None,
    })  # fmt: skip


if __name__ == "__main__":
    main()

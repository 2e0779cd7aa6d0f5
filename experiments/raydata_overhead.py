"""What the object store costs per sample: Ray Data against the tuned DataLoader with
the same CPUs, on one node.

    python experiments/raydata_overhead.py [--rounds 3] [--window 384]

The default job on synthetic-imagenet (the per-device model, batch 32), a local Ray
with this machine's CPUs. Each candidate has the training process and one maker of
batches: the tuned DataLoader of results/benchmarks/baselines.json (one thread
worker, decoded to tensors), the same pipeline with one worker process (its batches
cross shared memory), and Ray Data with one actor of one CPU making the same samples
(:mod:`raytune_loader.raydata`): uint8 or float32 across the object store, and the
pipeline as Ray's documentation writes it (``ray_docs_default``: whole blocks per map
call, float32, PIL, prefetch 1).

Two measurements per candidate and round, in rotated rounds:

* the input alone: ``--window`` samples read and not trained on, after a warm-up;
  its rate, and the CPU time every process of this run spent on them (this process,
  the DataLoader's worker, the actor, Ray's daemons and idle workers: the whole
  process tree), per sample. The **object store's cost per sample** is a candidate's
  CPU time per sample beyond the worker side's own (one core decoding and augmenting
  the same variant, ``worker_side_rate``), less the same for the DataLoader whose
  batches cross the same way (a worker process, shared memory) or not at all (the
  tuned thread worker); the training process's share of it is what the trainer's node
  pays to receive a sample from a remote CPU;
* trained: the steady window of the default segment (``measure.run_trial``, for the
  DataLoader and for Ray Data as a candidate of the search: the same warm-up, drain
  and steady-rate rules).

Writes results/benchmarks/raydata_overhead.json. On two cores the training process
and the maker share the machine with Ray's daemons: report what is true.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator
from typing import Any

import psutil
import torch

from _common import RESULTS, default_job, save
from raytune_loader import raydata
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.measure import prepare, run_trial, worker_side_rate
from raytune_loader.measuring.step import batch_samples
from raytune_loader.raydata.config import RayDataConfig
from raytune_loader.verdict.selection import rotated

BATCH = 32
WARMUP_BATCHES = 6
STORE_BYTES = 2**30  # the local Ray's object store: this machine is shared
CROSSING = {"raydata uint8": 3 * 224 * 224, "raydata float32": 3 * 224 * 224 * 4}  # bytes a sample


def tuned_loader() -> LoaderConfig:
    """The tuned DataLoader of the last recorded search on this machine."""
    recorded = json.loads((RESULTS / "baselines.json").read_text())
    pipeline = recorded["pipelines"]["tuned"]
    stages = {k: pipeline[k] for k in ("transfer", "decode", "workers")}
    return LoaderConfig.from_dict({**recorded["configs"]["tuned"], **stages})


def candidates() -> dict[str, LoaderConfig | RayDataConfig]:
    tuned = tuned_loader()
    same = {"batch_size": BATCH, "max_actors": 1, "map_batch_size": BATCH,
            "prefetch_batches": tuned.prefetch_factor or 2, "decoder": tuned.decode}  # fmt: skip
    return {
        "dataloader tuned": tuned,
        "dataloader process worker": LoaderConfig.from_dict(
            {**tuned.values(), "workers": "process", "persistent_workers": False}
        ),
        "raydata uint8": RayDataConfig(**same, crosses="uint8"),
        "raydata float32": RayDataConfig(**same, crosses="float32"),
        "raydata docs default": raydata.ray_docs_default(BATCH, max_actors=1),
    }


def tree_cpu() -> dict[int, tuple[str, float]]:
    """Each process of this run (this one and all it started) by pid: its role and its
    CPU seconds so far. A DataLoader worker is a fork of this process (the same command
    line), the actor runs SampleMaker, the rest is Ray's (daemons, idle workers)."""
    me = psutil.Process()
    mine = me.cmdline()
    found = {}
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
            line = process.cmdline()
        except psutil.Error:
            continue  # ended meanwhile
        if process.pid == me.pid:
            role = "training process"
        elif line == mine:
            role = "loader worker"
        elif "SampleMaker" in " ".join(line):
            role = "actor"
        else:
            role = "ray other"
        found[process.pid] = (role, times.user + times.system)
    return found


def spent(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds by role between two readings: each process's own difference (one
    started meanwhile counts from zero; one that ended meanwhile, the last candidate's
    actor say, is left out rather than counted as negative)."""
    groups = {"training process": 0.0, "loader worker": 0.0, "actor": 0.0, "ray other": 0.0}
    for pid, (role, seconds) in after.items():
        groups[role] += seconds - before.get(pid, (role, 0.0))[1]
    return groups


def settle(limit_s: float = 60.0) -> None:
    """Wait until the last candidate's actors have exited, so that none of its CPU time
    falls in the next one's window."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and "actor" in {r for r, _ in tree_cpu().values()}:
        time.sleep(0.5)


def read_window(batches: Iterator[Any], window: int) -> dict[str, Any]:
    """Read a warm-up, then ``window`` samples of stamped batches: the rate, the makers'
    own time and every process's CPU time, per sample."""
    for _ in range(WARMUP_BATCHES):
        next(batches)
    before, started = tree_cpu(), time.monotonic()
    samples, made = 0, 0.0
    while samples < window:
        stamped = next(batches)
        samples += batch_samples(stamped.batch)
        made += stamped.made - stamped.started
    wall = time.monotonic() - started
    cpu = {role: 1e3 * seconds / samples for role, seconds in spent(before, tree_cpu()).items()}
    return {"samples_per_s": samples / wall, "maker_ms_per_sample": 1e3 * made / samples,
            "cpu_ms_per_sample": {**cpu, "all": sum(cpu.values())}}  # fmt: skip


def input_alone(job: TrialJob, config: LoaderConfig | RayDataConfig, window: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    variant = LoaderConfig(BATCH, transfer=config.transfer, decode=config.decode)
    subset, _ = prepare(job, 0, variant)
    samples = BATCH * (WARMUP_BATCHES + 2) + window
    if isinstance(config, RayDataConfig):
        rows = raydata.image_rows(subset)
        loader: Any = raydata.RayDataLoader(
            raydata.build_dataset(rows, config, seed=job.seed, samples=samples), config, stamp=True
        )
    else:
        loader = build_dataloader(
            subset, config, seed=job.seed, samples_per_epoch=samples, stamp=True
        )
    batches = iter(loader)
    try:
        return read_window(batches, window)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def trained(job: TrialJob, config: LoaderConfig | RayDataConfig) -> dict[str, Any]:
    """The trial's segment (``measure.run_trial``), for a DataLoader and for Ray Data as a
    candidate of the search alike."""
    candidate = config.candidate() if isinstance(config, RayDataConfig) else config
    outcome = run_trial(job, candidate)
    assert outcome.metrics is not None, outcome.detail
    return {"samples_per_s": outcome.metrics.samples_per_s, "steady": outcome.metrics.steady}


def summary(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [run[key] for run in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def cost_figures(
    alone: dict[str, list[dict[str, Any]]], worker_side_ms: dict[str, float]
) -> dict[str, Any]:
    """CPU milliseconds per sample beyond the worker side's own, per candidate (medians),
    the object store's cost against each DataLoader, and the training process's cost to
    receive a sample as a share of the worker side's to make it."""
    beyond, receiving = {}, {}
    for name, runs in alone.items():
        variant = runs[0]["variant"]
        beyond[name] = (
            statistics.median(r["cpu_ms_per_sample"]["all"] for r in runs) - worker_side_ms[variant]
        )
        receiving[name] = statistics.median(
            r["cpu_ms_per_sample"]["training process"] for r in runs
        )
    store = {}
    for name in (n for n in alone if n.startswith("raydata")):
        store[name] = {
            f"against {dl}": beyond[name] - beyond[dl]
            for dl in ("dataloader process worker", "dataloader tuned")
        }
    per_mib = {name: against["against dataloader process worker"] / CROSSING[name] * 2**20
               for name, against in store.items() if name in CROSSING}  # fmt: skip
    share = {name: receiving[name] / worker_side_ms[alone[name][0]["variant"]]
             for name in CROSSING}  # fmt: skip
    return {"cpu_ms_per_sample_beyond_worker_side": beyond,
            "training_process_cpu_ms_per_sample": receiving,
            "object_store_cpu_ms_per_sample": store,
            "object_store_cpu_ms_per_mib_against_process_worker": per_mib,
            "receiving_share_of_making": share}  # fmt: skip


def ratios(
    alone: dict[str, list[dict[str, Any]]], trains: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """The best Ray Data candidate of the grid (by its trained median) over Ray's
    documented pipeline and over the tuned DataLoader, alone and trained (medians)."""

    def median(runs: dict[str, list[dict[str, Any]]], name: str) -> float:
        return statistics.median(r["samples_per_s"] for r in runs[name])

    best = max(CROSSING, key=lambda name: median(trains, name))
    return {"best_raydata": best, **{
        f"over {other}": {"input_alone": median(alone, best) / median(alone, other),
                          "trained": median(trains, best) / median(trains, other)}
        for other in ("raydata docs default", "dataloader tuned")}}  # fmt: skip


def described(config: LoaderConfig | RayDataConfig) -> dict[str, Any]:
    if isinstance(config, RayDataConfig):
        return {"kind": "raydata", "label": config.label(), **config.values()}
    return {"kind": "dataloader", "label": config.label(), **config.kwargs(), **config.pipeline()}


def cpu_medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {
        k: statistics.median(r["cpu_ms_per_sample"][k] for r in runs)
        for k in runs[0]["cpu_ms_per_sample"]
    }


def main() -> None:
    import ray

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=384, help="samples read alone per run")
    args = parser.parse_args()
    job = default_job()
    configs = candidates()
    started = time.perf_counter()
    ray.init(num_cpus=psutil.cpu_count(), include_dashboard=False, object_store_memory=STORE_BYTES,
             log_to_driver=False, logging_level="WARNING")  # fmt: skip
    try:
        worker_side_ms = {}
        for config in configs.values():
            key = f"{config.transfer}/{config.decode}"
            if key not in worker_side_ms:
                variant = LoaderConfig(BATCH, transfer=config.transfer, decode=config.decode)
                rate = worker_side_rate(prepare(job, 0, variant)[0], samples=128)
                worker_side_ms[key] = 1e3 / rate
        alone: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
        trains: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
        for repeat, name in rotated(list(configs), args.rounds):
            config = configs[name]
            settle()
            read = input_alone(job, config, args.window)
            alone[name].append({**read, "variant": f"{config.transfer}/{config.decode}"})
            settle()
            trains[name].append(trained(job, config))
            print(f"round {repeat + 1}: {name:<28} alone {read['samples_per_s']:6.1f}/s "
                  f"({read['cpu_ms_per_sample']['all']:5.2f} CPU-ms a sample), "
                  f"trained {trains[name][-1]['samples_per_s']:6.1f}/s", flush=True)  # fmt: skip
    finally:
        ray.shutdown()
    figures: dict[str, Any] = {
        "dataset": job.dataset.name, "model": job.model, "batch_size": BATCH, "rounds": args.rounds,
        "window_samples": args.window, "ray": ray.__version__,
        "candidates": {name: described(config) for name, config in configs.items()},
        "worker_side_cpu_ms_per_sample": worker_side_ms,
        "input_alone_samples_per_s": {n: summary(r, "samples_per_s") for n, r in alone.items()},
        "trained_samples_per_s": {n: summary(r, "samples_per_s") for n, r in trains.items()},
        "trained_steady": {n: [r["steady"] for r in runs] for n, runs in trains.items()},
        "input_alone_cpu_ms_per_sample": {n: cpu_medians(runs) for n, runs in alone.items()},
        "maker_ms_per_sample": {n: statistics.median(r["maker_ms_per_sample"] for r in runs)
                               for n, runs in alone.items()},
        **cost_figures(alone, worker_side_ms),
        "best_raydata_ratios": ratios(alone, trains),
        "runs": {"input_alone": alone, "trained": trains},
        "wall_s": time.perf_counter() - started,
        "how": (__doc__ or "").split("Two measurements")[1].strip(),
    }  # fmt: skip
    save("raydata_overhead", figures)


if __name__ == "__main__":
    main()

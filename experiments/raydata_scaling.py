"""Scaling with remote CPUs: a node held to one CPU, a CPU-only node with one more, a
costly decode and a cheap step.

    python experiments/raydata_scaling.py [--num-samples 8] [--steps 48]

A Ray cluster on this machine, each node on a core of its own (the processes of each
node pinned to one core, as their CPU count says): the trial's node (1 CPU, a custom
resource that pins the trials there, the search's driver beside them) and a CPU-only
node (1 CPU, the resource that pins Ray Data's actors there). The default job on the
embedded dataset (ImageNet-sized JPEG files decoded with PIL or to tensors, RandomResizedCrop
and a flip: ~2 ms a sample on a core) and the CPU's model (small-cnn, a step of ~1 ms a
sample), batch 32: the trial's one core cannot both decode and train at the step's pace.

One real search (``run_search`` joined to the cluster, ``--objective throughput``)
offers Ray Data candidates beside the DataLoaders; it verifies the best of each kind
and Ray's documented pipeline. Written: the tuned Ray Data pipeline against the best
single-node loader, measured (verified medians) and as the cost model predicted them
(each trial's prediction in trials.csv), and the physical limit of each from the
profile's measured costs: the one core doing both, against the slower of the trial's
core (the step and taking batches out of the object store) and the remote core
(decoding and putting them in). Writes results/benchmarks/raydata_scaling.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
import time
from typing import Any

import psutil

from _common import save
from raytune_loader import SearchOptions, run_search
from raytune_loader.console import freeze_at_exit
from raytune_loader.costmodel import OBJECT_STORE, crossing_bytes
from raytune_loader.results import config_from_sections
from raytune_loader.space import LoaderConfig, structure

TRAINER = "scaling_trainer"  # the trial's node's resource
CPU_NODE = "scaling_cpu_node"  # the CPU-only node's
TARGET_ERROR = 0.15  # the cost model's prediction within this of the measured rate


def start_cluster() -> Any:
    """Two nodes, each of one CPU on a core of its own: a process started while this one
    is pinned to a core stays there, and so do the workers its raylet starts."""
    from ray.cluster_utils import Cluster

    me = psutil.Process()
    cores = me.cpu_affinity()
    if len(cores) < 2:
        raise SystemExit("this experiment needs two cores: one per node")
    store = 300 * 2**20
    me.cpu_affinity([cores[0]])
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {TRAINER: 1}, "include_dashboard": False,
                        "object_store_memory": store},
    )  # fmt: skip
    me.cpu_affinity([cores[1]])
    cluster.add_node(num_cpus=1, resources={CPU_NODE: 1}, object_store_memory=store)
    me.cpu_affinity([cores[0]])  # the driver sits on the trial's node
    cluster.wait_for_nodes()
    return cluster


def verified(best: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every verified candidate by name: its configuration and verified samples/s
    (the objective is samples/s: the runners-up's figures are too)."""
    found = {}
    chosen = best["selection"]["chosen"]
    winner = best["raydata"]["config"] if best["engine"] == "raydata" else None
    found[chosen] = {
        "config": config_from_sections(best["loader"], best.get("pipeline"),
                                       best.get("worker_init"), winner),
        "samples_per_s": best["metrics"]["samples_per_s"],
    }  # fmt: skip
    for runner in best["selection"]["runners_up"]:
        config = config_from_sections(runner.get("loader"), runner.get("pipeline"),
                                      runner.get("worker_init"), runner.get("raydata"))  # fmt: skip
        found[runner["name"]] = {"config": config, "samples_per_s": runner["objective"]}
    return found


def predicted(trials: list[dict[str, str]], config: LoaderConfig) -> float | None:
    """The cost model's prediction for ``config``'s trial (the search recorded it)."""
    for row in trials:
        known = {k: v for k, v in row.items() if k in LoaderConfig.__dataclass_fields__}
        typed = {k: _plain(v) for k, v in known.items() if v != ""}
        try:
            if LoaderConfig.from_trial_config(typed) == config and row["predicted_samples_per_s"]:
                return float(row["predicted_samples_per_s"])
        except (ValueError, TypeError):
            continue
    return None


def _plain(value: str) -> Any:
    if value in ("True", "False"):
        return value == "True"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return value


def figure(name: str, entry: dict[str, Any], trials: list[dict[str, str]]) -> dict[str, Any]:
    config: LoaderConfig = entry["config"]
    measured = entry["samples_per_s"]["median"]
    guess = predicted(trials, config)
    return {
        "name": name,
        "label": config.label(),
        "measured_samples_per_s": measured,
        "measured_range": [entry["samples_per_s"]["min"], entry["samples_per_s"]["max"]],
        "predicted_samples_per_s": guess,
        "prediction_error": None if guess is None else guess / measured - 1,
    }


def limits(best: dict[str, Any], raydata: LoaderConfig, loader: LoaderConfig) -> dict[str, Any]:
    """What the two nodes' cores allow, from the profile's measured costs: one core both
    decoding and training; or the trial's core training and taking batches out of the
    store (as the profile timed it there), the remote core decoding and putting them in
    (the slower sets the pace)."""
    profile = best["search"]["model"]["profile"]
    ceiling = best["metrics"]["ceiling_samples_per_s"]
    per_core = {key: profile["per_core"][structure(c).worker_side] for key, c in
                (("raydata", raydata), ("loader", loader))}  # fmt: skip
    one_core = 1 / (1 / ceiling + 1 / per_core["loader"])
    crossing = crossing_bytes(raydata)
    timed = profile["receive_s"].get(structure(raydata).receiving)
    receive = timed / profile["batch_size"] if timed else OBJECT_STORE.receive.seconds(crossing)
    trainer = 1 / (1 / ceiling + receive)
    remote = 1 / (1 / per_core["raydata"] + OBJECT_STORE.put.seconds(crossing))
    return {
        "ceiling_samples_per_s": ceiling,
        "decode_per_core_samples_per_s": per_core,
        "single_node_samples_per_s": one_core,
        "raydata_trainer_core_samples_per_s": trainer,
        "raydata_remote_core_samples_per_s": remote,
        "receive_ms_per_sample": receive * 1e3,
        "receive_timed_on_the_trial_node": bool(timed),
        "raydata_samples_per_s": min(trainer, remote),
        "raydata_bound": "the remote core's decode" if remote < trainer else "the trial's core",
    }


def main() -> None:
    freeze_at_exit()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    started = time.perf_counter()
    cluster = start_cluster()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            opts = SearchOptions(
                address=cluster.address, node_type=TRAINER, cpu_node_type=CPU_NODE,
                num_samples=args.num_samples, steps=args.steps, objective="samples_per_s",
                verify_top=2, verify_repeats=2, out=tmp,
            )  # fmt: skip
            result = run_search(opts)
            best = json.loads((result.out_dir / "best_config.json").read_text())
            trials = list(csv.DictReader((result.out_dir / "trials.csv").open()))
    finally:
        cluster.shutdown()
    everyone = verified(best)
    loaders = {n: e for n, e in everyone.items() if e["config"].engine == "dataloader"}
    rays = {n: e for n, e in everyone.items() if e["config"].engine == "raydata"}
    tuned = best["raydata"]["name"]
    single = max(loaders, key=lambda n: loaders[n]["samples_per_s"]["median"])
    ours, theirs = figure(tuned, rays[tuned], trials), figure(single, loaders[single], trials)
    docs = figure("ray-docs-default", rays["ray-docs-default"], trials)
    errors = [f["prediction_error"] for f in (ours, theirs) if f["prediction_error"] is not None]
    figures = {
        "setup": {
            "trial_node_cpus": 1,
            "cpu_node_cpus": 1,
            "batch_size": best["job"]["requested_batch_size"],
            "model": best["model"],
            "dataset": best["dataset"],
            "pinned": "each node's processes to a core of its own",
        },  # fmt: skip
        "tuned_raydata": ours,
        "best_single_node_loader": theirs,
        "ray_docs_default": docs,
        "raydata_over_single_node": {
            "measured": ours["measured_samples_per_s"] / theirs["measured_samples_per_s"],
            "predicted": (
                ours["predicted_samples_per_s"] / theirs["predicted_samples_per_s"]
                if ours["predicted_samples_per_s"] and theirs["predicted_samples_per_s"]
                else None
            ),  # fmt: skip
        },
        "tuned_over_ray_docs_default": (
            ours["measured_samples_per_s"] / docs["measured_samples_per_s"]
        ),
        "prediction_within_target": bool(errors) and all(abs(e) <= TARGET_ERROR for e in errors),
        "target_error": TARGET_ERROR,
        "physical_limit": limits(best, rays[tuned]["config"], loaders[single]["config"]),
        "remote_cpus_to_ceiling": best["raydata"].get("remote_cpus_to_ceiling"),
        "engine_chosen": best["engine"],
        "model_median_error": best["search"]["model"].get("model_median_error"),
        "search_wall_s": best["search"]["wall_time_s"],
        "trials": len(trials),
        "raydata_trials": sum(1 for row in trials if row["engine"] == "raydata"),
        "wall_s": time.perf_counter() - started,
        "medians_note": "measured: verified medians of 2 rounds; predicted: the cost model's "
        "prediction for the same configuration's trial",
    }
    figures["median_abs_prediction_error"] = (
        statistics.median(abs(e) for e in errors) if errors else None
    )
    save("raydata_scaling", figures)


if __name__ == "__main__":
    main()

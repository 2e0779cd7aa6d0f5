"""Scaling with remote CPUs: a trial's node of few CPUs, Ray Data's actors on a CPU node.

    python experiments/raydata_scaling.py [--trial-cpus 1] [--cpu-node-cpus 1]
        [--device cpu|cuda] [--object-store-mib 300] [SEARCH FLAGS...]

A Ray cluster on this machine, each node on cores of its own (the processes of each
node pinned to as many cores as its CPU count says): the trial's node (--trial-cpus,
a custom resource that pins the trials there, the search's driver beside them; with
--device cuda, the machine's GPU too) and a CPU-only node (--cpu-node-cpus, the
resource that pins Ray Data's actors there). Every other flag is the search's own
(``python -m raytune_loader.search --help``: --model, --precision, --batch-sizes,
--synthetic-images, --num-samples, --steps...), with these defaults: 8 trials, 48
steps, the top 2 verified in 2 rounds; ``--out`` keeps the search's folder (by default
a temporary one).

By default, one core each: the default job on the embedded dataset (ImageNet-sized
JPEG files decoded with PIL or to tensors, RandomResizedCrop and a flip: ~2 ms a
sample on a core) and the CPU's model (small-cnn, a step of ~1 ms a sample), batch 32:
the trial's one core cannot both decode and train at the step's pace. On a GPU
(experiments/gpu_check.sh's raydata_scaling stage): ``--trial-cpus 4 --cpu-node-cpus 12
--device cuda --model resnet50 --precision bf16``, the trials' node too few CPUs to
feed an H200, the CPU node the rest of its cores; there the tuned Ray Data pipeline is
also set against decoding on the device (nvJPEG: the other way to spare the node's
CPUs), the best trial that decoded there (its verified figure where it was verified).

One real search (``run_search`` joined to the cluster, ``--objective throughput``)
offers Ray Data candidates beside the DataLoaders; it verifies the best of each kind
and Ray's documented pipeline. Written: the tuned Ray Data pipeline against the best
single-node loader, measured (verified medians) and as the cost model predicted them
(each trial's prediction in trials.csv), and the physical limit of each from the
profile's measured costs: the trial's cores doing both, against the slower of the
training process (the step and taking batches out of the object store) and the remote
cores (decoding and putting them in). Writes raydata_scaling.json under $BENCH_DIR
(default results/benchmarks/).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import statistics
import tempfile
import time
from dataclasses import replace
from typing import Any

import psutil

from _common import save
from raytune_loader import SearchOptions, load_best_config, run_search
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.candidates.structure import structure
from raytune_loader.engines import config_from_settings
from raytune_loader.machine import hardware
from raytune_loader.outputs.console import freeze_at_exit
from raytune_loader.outputs.reader import chosen_settings
from raytune_loader.search import get_args_parser, options_from_args
from raytune_loader.tuning.costmodel import OBJECT_STORE, crossing_bytes

TRAINER = "scaling_trainer"  # the trial's node's resource
CPU_NODE = "scaling_cpu_node"  # the CPU-only node's
TARGET_ERROR = 0.15  # the cost model's prediction within this of the measured rate
# the experiment's own defaults for the search's flags
SEARCH_DEFAULTS = {"num_samples": 8, "steps": 48, "verify_top": 2, "verify_repeats": 2,
                   "out": None}  # fmt: skip


def start_cluster(trial_cpus: int, cpu_node_cpus: int, gpus: int, store_mib: int) -> Any:
    """Two nodes on cores of their own, as many as their CPUs: a process started while
    this one is pinned to some cores stays there, and so do the workers its raylet
    starts. The trial's node has the ``gpus``."""
    from ray.cluster_utils import Cluster

    me = psutil.Process()
    cores = me.cpu_affinity()
    if len(cores) < trial_cpus + cpu_node_cpus:
        raise SystemExit(f"this experiment needs {trial_cpus + cpu_node_cpus} cores: "
                         f"{trial_cpus} for the trial's node, {cpu_node_cpus} for the CPU "
                         f"node; this process has {len(cores)}")  # fmt: skip
    trial, remote = cores[:trial_cpus], cores[trial_cpus : trial_cpus + cpu_node_cpus]
    store = store_mib * 2**20
    me.cpu_affinity(trial)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": trial_cpus, "num_gpus": gpus, "resources": {TRAINER: 1},
                        "include_dashboard": False, "object_store_memory": store},
    )  # fmt: skip
    me.cpu_affinity(remote)
    cluster.add_node(num_cpus=cpu_node_cpus, num_gpus=0, resources={CPU_NODE: 1},
                     object_store_memory=store)  # fmt: skip
    me.cpu_affinity(trial)  # the driver sits on the trial's node
    cluster.wait_for_nodes()
    return cluster


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, SearchOptions]:
    """The experiment's own flags, and the search's options from the rest (the
    experiment's defaults where they are not given)."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Any other flag is the search's: python -m raytune_loader.search --help",
    )
    parser.add_argument("--trial-cpus", type=int, default=1, help="the trial's node's CPUs")
    parser.add_argument("--cpu-node-cpus", type=int, default=1, help="the CPU node's CPUs")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: the trial's node has the GPU (default cpu: none)")  # fmt: skip
    parser.add_argument("--object-store-mib", type=int, default=300,
                        help="each node's object store (default 300)")  # fmt: skip
    args, rest = parser.parse_known_args(argv)
    search = get_args_parser()
    search.set_defaults(**SEARCH_DEFAULTS)
    opts = options_from_args(search.parse_args(rest))
    if min(args.trial_cpus, args.cpu_node_cpus) < 1:
        parser.error("each node needs a CPU at least")
    return args, opts


def verified(best: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every verified candidate by name: its configuration and verified samples/s
    (the objective is samples/s: the runners-up's figures are too)."""
    found = {}
    chosen = best["selection"]["chosen"]
    found[chosen] = {
        "config": config_from_settings(chosen_settings(best)),
        "samples_per_s": best["metrics"]["samples_per_s"],
    }  # fmt: skip
    for runner in best["selection"]["runners_up"]:
        config = config_from_settings(runner)
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


def device_decode(
    trials: list[dict[str, str]], everyone: dict[str, dict[str, Any]]
) -> tuple[str, dict[str, Any]] | None:
    """The best trial that decoded on the device (a DataLoader), by its name and entry:
    its verified figures where it was verified, else its trial's. None if none ran."""
    ran = [row for row in trials if row.get("decode") == "device" and row["samples_per_s"]
           and row.get("engine", "dataloader") == "dataloader"]  # fmt: skip
    if not ran:
        return None
    row = max(ran, key=lambda r: float(r["samples_per_s"]))
    typed = {k: _plain(v) for k, v in row.items()
             if k in LoaderConfig.__dataclass_fields__ and v != ""}  # fmt: skip
    config = LoaderConfig.from_trial_config(typed)
    for name, entry in everyone.items():
        if entry["config"] == config:
            return name, {**entry, "source": "verified"}
    rate = float(row["samples_per_s"])
    return f"trial {row['trial_id']}", {
        "config": config,
        "samples_per_s": {"median": rate, "min": rate, "max": rate},
        "source": "its trial (one run; not verified)",
    }


def limits(
    best: dict[str, Any], raydata: LoaderConfig, loader: LoaderConfig, cores: tuple[int, int]
) -> dict[str, Any]:
    """What the two nodes' cores allow, from the profile's measured costs: the trial's
    cores both decoding and training (on a CPU the step takes a core's time; on a GPU
    the cores only decode, up to the ceiling); or the training process training and
    taking batches out of the store (as the profile timed it there), the remote cores
    decoding and putting them in (the slower sets the pace)."""
    profile = best["search"]["model"]["profile"]
    ceiling = best["metrics"]["ceiling_samples_per_s"]
    trial_cpus, remote_cpus = cores
    cuda = str(best["job"].get("device", "cpu")).startswith("cuda")
    per_core = {key: profile["per_core"][structure(c).worker_side] for key, c in
                (("raydata", raydata), ("loader", loader))}  # fmt: skip
    if cuda:
        one_node = min(ceiling, trial_cpus * per_core["loader"])
    else:
        one_node = min(ceiling, trial_cpus / (1 / ceiling + 1 / per_core["loader"]))
    crossing = crossing_bytes(raydata)
    timed = profile["receive_s"].get(structure(raydata).receiving)
    receive = timed / profile["batch_size"] if timed else OBJECT_STORE.receive.seconds(crossing)
    trainer = min(ceiling, 1 / receive) if cuda else 1 / (1 / ceiling + receive)
    remote = remote_cpus / (1 / per_core["raydata"] + OBJECT_STORE.put.seconds(crossing))
    return {
        "ceiling_samples_per_s": ceiling,
        "decode_per_core_samples_per_s": per_core,
        "single_node_samples_per_s": one_node,
        "raydata_trainer_core_samples_per_s": trainer,
        "raydata_remote_core_samples_per_s": remote,
        "receive_ms_per_sample": receive * 1e3,
        "receive_timed_on_the_trial_node": bool(timed),
        "raydata_samples_per_s": min(trainer, remote),
        "raydata_bound": "the remote cores" if remote < trainer else "the training process",
    }


def main() -> None:
    freeze_at_exit()
    args, opts = parse()
    if args.device == "cuda" and not hardware.cuda_available():
        raise SystemExit("error: --device cuda: torch sees no GPU here")
    started = time.perf_counter()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the nodes' processes see no GPU either
    cluster = start_cluster(args.trial_cpus, args.cpu_node_cpus, int(args.device == "cuda"),
                            args.object_store_mib)  # fmt: skip
    try:
        with contextlib.ExitStack() as stack:
            out = opts.out or stack.enter_context(tempfile.TemporaryDirectory())
            opts = replace(opts, address=cluster.address, node_type=TRAINER,
                           cpu_node_type=CPU_NODE, objective="samples_per_s", out=out)  # fmt: skip
            result = run_search(opts)
            best = load_best_config(result.out_dir / "best_config.json").data
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
    cores = (args.trial_cpus, args.cpu_node_cpus)
    on_device = device_decode(trials, everyone)
    device = None
    if on_device is not None:
        name, entry = on_device
        device = {**figure(name, entry, trials), "source": entry["source"]}
    figures = {
        "setup": {
            "trial_node_cpus": args.trial_cpus,
            "cpu_node_cpus": args.cpu_node_cpus,
            "device": best["job"].get("device", args.device),
            "precision": best["job"].get("precision"),
            "batch_size": best["job"]["requested_batch_size"],
            "model": best["model"],
            "dataset": best["dataset"],
            "object_store_mib_per_node": args.object_store_mib,
            "pinned": "each node's processes to cores of their own, as many as its CPUs",
        },  # fmt: skip
        "tuned_raydata": ours,
        "best_single_node_loader": theirs,
        "ray_docs_default": docs,
        "device_decode": device,
        "raydata_over_device_decode": (
            ours["measured_samples_per_s"] / device["measured_samples_per_s"] if device else None
        ),
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
        "physical_limit": limits(best, rays[tuned]["config"], loaders[single]["config"], cores),
        "remote_cpus_to_ceiling": best["raydata"].get("remote_cpus_to_ceiling"),
        "engine_chosen": best["engine"],
        "model_median_error": best["search"]["model"].get("model_median_error"),
        "search_wall_s": best["search"]["wall_time_s"],
        "trials": len(trials),
        "raydata_trials": sum(1 for row in trials if row["engine"] == "raydata"),
        "wall_s": time.perf_counter() - started,
        "medians_note": f"measured: verified medians of {opts.verify_repeats} rounds (device "
        "decode: its trial's figure where it was not verified, or null where no trial decoded "
        "on the device); predicted: the cost model's prediction for the same configuration's "
        "trial",
    }
    figures["median_abs_prediction_error"] = (
        statistics.median(abs(e) for e in errors) if errors else None
    )
    save("raydata_scaling", figures)


if __name__ == "__main__":
    main()

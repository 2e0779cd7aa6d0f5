"""The GPU check's plan: each stage's flags, its time limit on the device, and the calls.

    python experiments/gpu_plan.py [--dry-run] [--stages first|second|raydata|all|NAME,...]

experiments/gpu_check.sh reads this plan (shell assignments on stdout, run with eval)
and runs each stage with the flags given here. The table of estimates, limits and the
calls' totals goes to stderr.

The device's minutes come as calls of at most BUDGET_S (8 minutes) each, and a call's
total is all of it: the setup before its first stage (installing the wheels, the module
check, machine.txt, this plan: rates.setup_s), and per stage its limit, the KILL_AFTER_S
a stage past its limit may take to end after its SIGINT, and the archive made after it
(PACK_S). A stage's limit is its estimate times MARGIN, and at least its estimate plus
FLOOR_S (one slow CUDA start: a stage of a few seconds otherwise gets a limit of a few
seconds more). The estimate counts what the stage runs with these flags (images
generated, batches trained, the drain before each window, processes and measurements
started) at the rates and fixed costs the last GPU runs measured, kept with their
sources in results/gpu/rates.json.

CALLS are the next device run: ``first``, the search and the bench (its winner re-
measured standalone, no Ray, in the same session); ``second``, the stages that read the
first call's search (``gpu_check.sh --from``) or need none, with room left in it to
rerun a stage of the first call but the search (whose rerun, with its bench, is a first
call again); ``raydata``, a call of its own (a search on a cluster of two nodes: the
trial's 4 CPUs and the GPU, 12 more CPUs for Ray Data's actors), which two full calls
leave no device time for in one loan of 15 minutes: the loan after them, or the only
call of one. The other stages answered their question in an earlier run (precision,
decoders_agree, limits) or are not asked this time (shared_gpu): ``--stages`` names
them. A dry run (``--dry-run``) has tiny flags for a CPU and DRY_RUN_LIMIT_S per stage,
runs every stage, and still checks every call against the budget.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from compile_backoff import config as compile_config
from raydata_scaling import parse as raydata_scaling_args
from structures import best_of
from structures import structures as measured_structures

from _common import in_flight
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.candidates.rules import DECODES
from raytune_loader.measuring.job import SegmentSpec
from raytune_loader.measuring.measure import CEILING_WINDOWS
from raytune_loader.measuring.profile import Profile
from raytune_loader.raydata.config import ray_docs_default
from raytune_loader.search import get_args_parser, options_from_args
from raytune_loader.tuning.costmodel import CostModel
from raytune_loader.tuning.options import GPU_BATCH_SIZE, SearchOptions
from raytune_loader.tuning.space import SearchSpace
from shared_gpu import candidates, pairings

RATES = Path(__file__).resolve().parent.parent / "results" / "gpu" / "rates.json"
# the last device search: its cost model's profile sizes the structures stage
LAST_SEARCH = RATES.parent / "search" / "synthetic-imagenet" / "best_config.json"
BUDGET_S = 480  # one call on the device: 8 minutes, everything in it
MARGIN = 1.25
FLOOR_S = 15  # at least this over the estimate: a slow CUDA start, a cold cache
KILL_AFTER_S = 10  # timeout's --kill-after: a stage past its limit gets SIGINT, then this
PACK_S = 2  # the archive of the outputs, refreshed after every stage
DRY_RUN_LIMIT_S = 240  # a guard against a hang; the slowest tiny stage takes ~100 s here
EXPERIMENT_WARMUP = SegmentSpec().warmup_steps  # the experiments' default_job
PRECISIONS_ON_CUDA = 4  # fp32, tf32, bf16, bf16 + channels-last
DEVICE_CORES = 16  # the H200 machine's (results/gpu/machine.txt)
PROBES = 1  # the findings' probes of the winner counted (see search())
COMPILES = 2  # compile_backoff: the first compile, and the one after the back-off
WINDOW_S = 1.5  # the search's measured window at the ceiling: halves of 0.75 s
# raydata_scaling, not measured on the device yet (estimates): the CPU node's start
# beside the head's, and the start of a Ray Data candidate's actors in each measurement
# (a pool of up to 12 actors importing torch at once, on 12 cores)
NODE_START_S = 10
RAYDATA_START_S = 10
Flags = dict[str, str]

# the order they run in; bench, limits and structures read the search's best_config.json
STAGES = (
    "precision", "decoders_agree", "search", "bench", "limits", "structures",
    "compile_backoff", "ranks_one_gpu", "shared_gpu", "raydata_scaling",
)  # fmt: skip
NEEDS_SEARCH = ("bench", "limits", "structures")
CALLS = {
    "first": ("search", "bench"),
    "second": ("structures", "compile_backoff", "ranks_one_gpu"),
    "raydata": ("raydata_scaling",),  # a search of its own, on a loan of its own
}

IMAGES = "2048"  # the one dataset of every stage: 8 batches of 256
DEVICE: dict[str, Flags] = {
    "precision": {"--synthetic-images": IMAGES, "--rounds": "1", "--steps": "10"},
    "decoders_agree": {"--synthetic-images": IMAGES, "--samples": "16"},
    # bf16, channels-last, batch 256 (the GPU's defaults); a window of 32 steps: 1.7 s at
    # the ceiling, halves of 16 batches; 4 trials: the baselines and the cost model's
    # two best structures (every structure is the structures stage's)
    "search": {
        "--synthetic-images": IMAGES, "--samples-per-trial": "2048", "--batch-sizes": "256",
        "--gpus-per-trial": "0.5", "--num-samples": "4", "--steps": "32",
        "--report-every": "16", "--warmup-steps": "3", "--verify-top": "1",
        "--verify-repeats": "1",
    },
    "bench": {"--repeats": "1"},  # the search's steps: a run as the verification's
    "limits": {"--synthetic-images": IMAGES, "--steps": "32"},
    "structures": {},  # all from the search's best_config.json
    # resnet18 (the recompiles are dynamo's, whatever the model; its compiles are shorter):
    # at 256 its activations in bf16 should take ~3 GB (an estimate: compile_backoff.json
    # says what happened), so a 1 GiB cap should back it off to 64 or 32
    "compile_backoff": {"--synthetic-images": IMAGES, "--model": "resnet18",
                        "--batch-size": "256", "--gpu-memory-gib": "1", "--steps": "16"},
    "ranks_one_gpu": {"--synthetic-images": IMAGES, "--ranks": "2", "--batch-size": "128",
                      "--steps": "16"},  # fmt: skip
    "shared_gpu": {"--synthetic-images": IMAGES, "--steps": "6", "--configs": "4",
                   "--batch-size": "128"},
    # a search on two nodes: the trial's (4 CPUs, the GPU, the whole of it a trial) and a
    # CPU node (12 CPUs, Ray Data's actors); resnet50 in bf16 (channels-last: the GPU's
    # default), a window of 32 steps as the search's but at batch 128 (at 256 the
    # estimate is 490 s: no call holds it); 5 trials: the three baselines
    # (pytorch-default, the rule of thumb, Ray's documented pipeline), the cost model's
    # best Ray Data candidate, then its best other structure (decoding on the device,
    # where the model predicts it best of the DataLoaders, as it should with 4 CPUs)
    "raydata_scaling": {
        "--trial-cpus": "4", "--cpu-node-cpus": "12", "--device": "cuda",
        "--object-store-mib": "8192", "--model": "resnet50", "--precision": "bf16",
        "--synthetic-images": IMAGES, "--samples-per-trial": "2048", "--batch-sizes": "128",
        "--gpus-per-trial": "1", "--num-samples": "5", "--steps": "32",
        "--report-every": "16", "--warmup-steps": "3", "--verify-top": "1",
        "--verify-repeats": "1",
    },
}  # fmt: skip

TINY_IMAGES = "64"  # at least one batch of the experiments' CPU default (32)
GPU_ONLY = ("--gpus-per-trial", "--gpu-memory-gib")  # refused, or meaningless, on a CPU
TINY: dict[str, Flags] = {
    "precision": {"--synthetic-images": TINY_IMAGES, "--steps": "2", "--batch-size": "8"},
    "decoders_agree": {"--synthetic-images": TINY_IMAGES, "--samples": "2"},
    "search": {
        "--synthetic-images": TINY_IMAGES, "--samples-per-trial": "64", "--batch-sizes": "8",
        "--min-batch-size": "4", "--num-samples": "1", "--time-budget": "10", "--steps": "2",
        "--report-every": "1", "--warmup-steps": "1", "--verify-top": "0",
    },
    "bench": {},
    "limits": {"--synthetic-images": TINY_IMAGES, "--steps": "2"},
    "structures": {},
    "compile_backoff": {"--synthetic-images": TINY_IMAGES, "--model": "small-cnn",
                        "--batch-size": "8", "--steps": "2"},
    "ranks_one_gpu": {"--synthetic-images": TINY_IMAGES, "--batch-size": "4", "--steps": "2"},
    "shared_gpu": {"--synthetic-images": TINY_IMAGES, "--steps": "2", "--configs": "2",
                   "--batch-size": "8"},
    "raydata_scaling": {
        "--trial-cpus": "1", "--cpu-node-cpus": "1", "--device": "cpu",
        "--object-store-mib": "300", "--model": "small-cnn", "--precision": "fp32",
        "--synthetic-images": TINY_IMAGES, "--samples-per-trial": "64", "--batch-sizes": "8",
        "--min-batch-size": "4", "--num-samples": "3", "--steps": "2", "--report-every": "1",
        "--warmup-steps": "1", "--verify-top": "0",
    },
}  # fmt: skip
# the device's flags at tiny sizes, so a dry run proves every command still takes them
DRY_RUN: dict[str, Flags] = {
    stage: {k: v for k, v in {**DEVICE[stage], **TINY[stage]}.items() if k not in GPU_ONLY}
    for stage in STAGES
}


@dataclass(frozen=True)
class Rates:
    """The last device runs' figures (results/gpu/rates.json); seconds and samples/s."""

    ceiling_samples_per_s: float
    loader_0_workers_samples_per_s: float
    loader_workers_samples_per_s: float
    decode_per_core_samples_per_s: float
    generate_images_per_s: float
    measurement_s: float  # a process's start: imports, CUDA, the model, the data checked
    run_s: float  # a measurement's own start in a process that has all that
    trial_s: float  # a measurement in a Ray task or trial, its samples aside
    ray_start_s: float
    tune_tail_s: float
    profile_s_per_batch_sample: float
    compile_s: float
    rank_start_s: float
    setup_s: float

    @classmethod
    def load(cls, path: Path = RATES) -> Rates:
        figures = json.loads(path.read_text())["rates"]
        return cls(**{f.name: figures[f.name]["value"] for f in fields(cls)})

    def loader(self, workers: int) -> float:
        """A loader's samples/s at batch 256: without workers, one core's; with them, the
        slowest any configuration with workers was measured at, at most the ceiling."""
        if workers == 0:
            return self.loader_0_workers_samples_per_s
        return min(self.loader_workers_samples_per_s, self.ceiling_samples_per_s)


def _int(flags: Flags, name: str, default: int) -> int:
    return int(flags.get(name, default))


def _ceiling_s(rates: Rates, batch: int, warmup: int, steps: int, windows: int) -> float:
    return (warmup + windows * steps) * batch / rates.ceiling_samples_per_s


def _run_s(batch: int, warmup: int, drain: int, steps: int, samples_per_s: float) -> float:
    """A segment: the warm-up steps, the drain of what the loader holds, the window."""
    return (warmup + drain + steps) * batch / samples_per_s


def search_options(flags: Flags) -> SearchOptions:
    """The options the search stage runs with on the device (its own parser's)."""
    args = get_args_parser().parse_args([part for pair in flags.items() for part in pair])
    return options_from_args(args).for_device(True)


def rule_of_thumb_drain(batch: int) -> int:
    """What the heuristic (min(cores, 8) workers, prefetch 2) holds before a window."""
    return in_flight(LoaderConfig(batch, min(DEVICE_CORES, 8), 2))


def best_drain(batch: int) -> int:
    """What a structure's best holds: up to a worker per core at prefetch 2 (the
    searcher's usual choice among the configurations the model cannot tell apart)."""
    return in_flight(LoaderConfig(batch, DEVICE_CORES, 2))


def _makespan(durations: list[float], slots: int) -> float:
    """Trials run in the order given, each on the slot that frees first."""
    free = [0.0] * max(1, slots)
    for duration in durations:
        free[free.index(min(free))] += duration
    return max(free)


def _segment_s(opts: SearchOptions, rates: Rates, drain: int, rate: float) -> float:
    """One measurement of a search (a trial, a verification run), at its smallest batch."""
    batch = min(opts.batch_sizes or (GPU_BATCH_SIZE,))
    return rates.trial_s + _run_s(batch, opts.warmup_steps, drain, opts.steps, rate)


def _search_s(
    opts: SearchOptions, rates: Rates, trials: float, verified: float, whole: float
) -> float:
    """A search around its trials (``trials`` s, as they run) and a verification round's
    configurations (``verified`` s): this process, Ray's start, the ceilings, the profile
    at the trials' smallest batch, Tune's tail past the time budget; each verification
    round's ceiling; the winner's input pipeline alone and the findings' probes (at
    ``whole`` samples/s)."""
    sizes = opts.batch_sizes or (GPU_BATCH_SIZE,)
    batch, warmup, steps = min(sizes), opts.warmup_steps, opts.steps

    def ceilings(windows: int) -> float:
        return sum(rates.trial_s + _ceiling_s(rates, b, warmup, steps, windows) for b in sizes)

    if opts.time_budget_s:  # proposals stop at the budget; those running finish (the tail)
        trials = min(trials, opts.time_budget_s + rates.tune_tail_s)
    profile = rates.trial_s + rates.profile_s_per_batch_sample * batch
    input_alone = (
        rates.trial_s
        + _run_s(batch, warmup, best_drain(batch), CEILING_WINDOWS * steps, whole)
        + 64 / rates.decode_per_core_samples_per_s
    )
    return (
        rates.measurement_s  # this process: the dataset checked and pre-warmed
        + rates.ray_start_s
        + ceilings(CEILING_WINDOWS)
        + (profile if opts.search == "model" else 0.0)
        + trials
        + opts.verify_repeats * (ceilings(1) + verified)
        + input_alone
        + PROBES * _segment_s(opts, rates, best_drain(batch), whole)
    )


def search(plan: dict[str, Flags], rates: Rates) -> float:
    """Ray's start, the ceilings, the profile at the trials' smallest batch, the trials
    (the baselines, then the cost model's structure bests, two at a time on half the
    GPU each), Tune's tail; then each verification round (the ceiling, pytorch-default,
    the heuristic and the top configurations, alone with the whole GPU), the winner's
    input pipeline alone, and the findings' probes. Each segment drains what its loader
    holds before its window. PROBES counts the persistent_workers flip of a process
    winner; the straggler probe needs more steps than one run of 32 has
    (findings.MIN_STEPS), and the worker-threads probe oversubscribed process workers,
    which the last run did not have (0 busy threads a worker)."""
    opts = search_options(plan["search"])
    batch = min(opts.batch_sizes or (GPU_BATCH_SIZE,))
    share = opts.gpus_per_trial or 0.5
    shared = min(rates.loader(1), rates.ceiling_samples_per_s * share)
    durations = [_segment_s(opts, rates, 0, rates.loader(0)),
                 _segment_s(opts, rates, rule_of_thumb_drain(batch), shared)]  # fmt: skip
    best = _segment_s(opts, rates, best_drain(batch), shared)
    durations += [best] * (opts.num_samples - len(durations))
    whole = rates.loader(1)
    verified = (
        _segment_s(opts, rates, 0, rates.loader(0))
        + _segment_s(opts, rates, rule_of_thumb_drain(batch), whole)
        + opts.verify_top * _segment_s(opts, rates, best_drain(batch), whole)
    )
    return _search_s(opts, rates, _makespan(durations, int(1 / share)), verified, whole)


def raydata_scaling(plan: dict[str, Flags], rates: Rates) -> float:
    """A search on the two nodes' cluster (the CPU node's start counted beside Ray's),
    its trials one at a time (the trial's node has one GPU, each trial all of it): the
    baselines (Ray's documented pipeline among them), the cost model's best Ray Data
    candidate, then structure bests; each verification round the baselines, the top
    configurations and the best Ray Data candidate. Not measured on the device yet, so
    at the slowest rates that can be argued: a DataLoader with workers at what the
    trial's CPUs but the training process's decode (at most the slowest 16-core loader
    measured), Ray's documented pipeline at one actor's pace (its pool starts at one),
    every other Ray Data candidate as slow as the DataLoader, each Ray Data measurement
    RAYDATA_START_S more for its actors."""
    flags = [part for pair in plan["raydata_scaling"].items() for part in pair]
    args, opts = raydata_scaling_args(flags)
    opts = opts.for_device(args.device == "cuda")
    batch = min(opts.batch_sizes or (GPU_BATCH_SIZE,))
    node = min(rates.loader(1), (args.trial_cpus - 1) * rates.decode_per_core_samples_per_s)
    docs = in_flight(ray_docs_default(batch, args.cpu_node_cpus).candidate())
    pytorch = _segment_s(opts, rates, 0, rates.loader(0))
    rule = _segment_s(opts, rates, rule_of_thumb_drain(batch), node)
    one_actor = rates.decode_per_core_samples_per_s
    documented = RAYDATA_START_S + _segment_s(opts, rates, docs, one_actor)
    best = _segment_s(opts, rates, best_drain(batch), node)
    durations = [pytorch, rule, documented, RAYDATA_START_S + best]
    durations += [best] * (opts.num_samples - len(durations))
    verified = pytorch + rule + documented + opts.verify_top * best + RAYDATA_START_S + best
    return NODE_START_S + _search_s(opts, rates, _makespan(durations, 1), verified, node)


def bench(plan: dict[str, Flags], rates: Rates) -> float:
    """In one process: the ceiling, then each round the ceiling again and the tuned
    configuration and both baselines, at the search's segment."""
    opts = search_options(plan["search"])
    batch, warmup, steps = min(opts.batch_sizes or (GPU_BATCH_SIZE,)), opts.warmup_steps, opts.steps
    ceiling = rates.run_s + _ceiling_s(rates, batch, warmup, steps, CEILING_WINDOWS)
    whole = rates.loader(1)
    one_round = (
        ceiling
        + rates.run_s + _run_s(batch, warmup, 0, steps, rates.loader(0))
        + rates.run_s + _run_s(batch, warmup, rule_of_thumb_drain(batch), steps, whole)
        + rates.run_s + _run_s(batch, warmup, best_drain(batch), steps, whole)
    )  # fmt: skip
    return rates.measurement_s + ceiling + _int(plan["bench"], "--repeats", 3) * one_round


def structures(plan: dict[str, Flags], rates: Rates) -> float:
    """In one process: the ceiling, then each measured structure's best, alone, at the
    search's segment (the structures of the device's space: experiments/structures.py).
    Each best and its rate are the cost model's from the last device search's profile
    (LAST_SEARCH), as the stage chooses them from the new one's; at most the ceiling."""
    opts = search_options(plan["search"])
    batch, warmup, steps = min(opts.batch_sizes or (GPU_BATCH_SIZE,)), opts.warmup_steps, opts.steps
    space = SearchSpace(max_workers=DEVICE_CORES, batch_sizes=(batch,), cuda=True,
                        usable_cpus=DEVICE_CORES, pipeline=True, decodes=DECODES,
                        thread_workers=True)  # fmt: skip
    profile = json.loads(LAST_SEARCH.read_text())["search"]["model"]["profile"]
    model = CostModel(Profile.from_dict(profile), {batch: rates.ceiling_samples_per_s}, cuda=True)
    runs = 0.0
    for configs in measured_structures(space).values():
        config, predicted = best_of(model, configs)
        rate = min(predicted.samples_per_s, rates.ceiling_samples_per_s)
        runs += rates.run_s + _run_s(batch, warmup, in_flight(config), steps, rate)
    ceiling = rates.run_s + _ceiling_s(rates, batch, warmup, steps, CEILING_WINDOWS)
    return rates.measurement_s + ceiling + runs


def precision(plan: dict[str, Flags], rates: Rates) -> float:
    """Each precision's ceiling (best of CEILING_WINDOWS windows) in each round."""
    flags = plan["precision"]
    rounds, steps = _int(flags, "--rounds", 3), _int(flags, "--steps", 30)
    batch = _int(flags, "--batch-size", GPU_BATCH_SIZE)
    ceiling = _ceiling_s(rates, batch, EXPERIMENT_WARMUP, steps, CEILING_WINDOWS)
    return rounds * PRECISIONS_ON_CUDA * (rates.measurement_s + ceiling)


def decoders_agree(plan: dict[str, Flags], rates: Rates) -> float:
    """The reference and three variants decode each sample (bounded by a CPU core)."""
    samples = _int(plan["decoders_agree"], "--samples", 32)
    return rates.measurement_s + 4 * samples / rates.decode_per_core_samples_per_s


def limits(plan: dict[str, Flags], rates: Rates) -> float:
    """One core decoding, the ceiling at the tuned batch size, the tuned loader."""
    steps = _int(plan["limits"], "--steps", 60)
    return (
        2 * rates.measurement_s
        + (256 + 8) / rates.decode_per_core_samples_per_s  # decode_rate's, warm-up too
        + _ceiling_s(rates, GPU_BATCH_SIZE, EXPERIMENT_WARMUP, steps, CEILING_WINDOWS)
        + _run_s(GPU_BATCH_SIZE, EXPERIMENT_WARMUP, best_drain(GPU_BATCH_SIZE), steps,
                 rates.loader(1))
    )  # fmt: skip


def compile_backoff(plan: dict[str, Flags], rates: Rates) -> float:
    """One process: COMPILES compiles of the model, and the trial at the batch asked
    (an upper bound on the one that fits)."""
    flags = plan["compile_backoff"]
    batch, steps = _int(flags, "--batch-size", 512), _int(flags, "--steps", 16)
    drain = in_flight(compile_config(batch, DEVICE_CORES, True))
    return (
        rates.measurement_s
        + COMPILES * rates.compile_s
        + _run_s(batch, EXPERIMENT_WARMUP, drain, steps, rates.loader(1))
    )


def ranks_one_gpu(plan: dict[str, Flags], rates: Rates) -> float:
    """Three starts of the ranks (the backend, the ceiling, the trial); the ranks' ceiling
    and their trial share the one GPU, so they take as long as the node's samples at its
    rate."""
    flags = plan["ranks_one_gpu"]
    ranks, batch = _int(flags, "--ranks", 2), _int(flags, "--batch-size", 128)
    steps = _int(flags, "--steps", 16)
    drain = in_flight(LoaderConfig(batch, min(DEVICE_CORES // ranks, 8), 2))
    return (
        rates.measurement_s
        + 3 * rates.rank_start_s
        + _ceiling_s(rates, ranks * batch, EXPERIMENT_WARMUP, steps, CEILING_WINDOWS)
        + _run_s(ranks * batch, EXPERIMENT_WARMUP, drain, steps, rates.loader(1))
    )


def shared_gpu(plan: dict[str, Flags], rates: Rates) -> float:
    """Each configuration alone, then the pairs two at a time (a pair lasts as long as
    its slower run), after the two pool processes start."""
    flags = plan["shared_gpu"]
    steps, count = _int(flags, "--steps", 15), _int(flags, "--configs", 6)
    batch = _int(flags, "--batch-size", GPU_BATCH_SIZE)
    configs = candidates(True, batch, count)

    def run(name: str) -> float:
        config = configs[name]
        rate = rates.loader(config.num_workers)
        return _run_s(batch, EXPERIMENT_WARMUP, in_flight(config), steps, rate)

    alone = sum(rates.measurement_s + run(name) for name in configs)
    paired = sum(rates.measurement_s + max(run(a), run(b)) for a, b in pairings(list(configs)))
    return alone + rates.measurement_s + paired


ESTIMATES: dict[str, Callable[[dict[str, Flags], Rates], float]] = {
    "precision": precision,
    "decoders_agree": decoders_agree,
    "search": search,
    "bench": bench,
    "limits": limits,
    "structures": structures,
    "compile_backoff": compile_backoff,
    "ranks_one_gpu": ranks_one_gpu,
    "shared_gpu": shared_gpu,
    "raydata_scaling": raydata_scaling,
}


@dataclass(frozen=True)
class StageLimit:
    name: str
    estimate_s: float
    limit_s: int

    @property
    def margin_s(self) -> float:
        return self.limit_s - self.estimate_s

    @property
    def worst_s(self) -> int:
        """What the stage may take of its call: its limit, the kill's grace, the archive."""
        return self.limit_s + KILL_AFTER_S + PACK_S


def limit_of(estimate: float) -> int:
    return math.ceil(max(estimate * MARGIN, estimate + FLOOR_S))


def device_limits(
    rates: Rates, stages: tuple[str, ...], plan: dict[str, Flags] = DEVICE
) -> dict[str, StageLimit]:
    """Each stage's estimate on the device and its limit. The first of ``stages`` also
    generates the dataset (a device starts bare, and every call is a new device)."""
    out = {}
    for name in plan:
        estimate = ESTIMATES[name](plan, rates)
        if stages and name == stages[0] and "--synthetic-images" in plan[name]:
            estimate += int(plan[name]["--synthetic-images"]) / rates.generate_images_per_s
        elif stages and name == stages[0]:  # the bench and structures read the search's
            estimate += int(IMAGES) / rates.generate_images_per_s
        out[name] = StageLimit(name, estimate, limit_of(estimate))
    return out


def call_total_s(limits: dict[str, StageLimit], stages: tuple[str, ...], rates: Rates) -> int:
    """A call's worst time: the setup, then each stage's limit, grace and archive."""
    return math.ceil(rates.setup_s) + sum(limits[name].worst_s for name in stages)


def rerun_s(rates: Rates) -> int:
    """The room a second call keeps: a stage of the first call but the search run again
    in it, from the first call's search (``--from``), after the second call's own stages
    (its dataset there already). A failed search is a first call again, with its bench."""
    limits = device_limits(rates, ())
    return max(limits[name].worst_s for name in CALLS["first"] if name != "search")


def table(limits: dict[str, StageLimit], stages: tuple[str, ...], rates: Rates) -> str:
    """The selected stages' estimates, limits and margins, and the call's total."""
    lines = [f"  {'stage':<16} {'estimate':>8} {'limit':>6} {'margin':>7} {'+grace':>7}",
             f"  {'setup':<16} {rates.setup_s:7.0f}s {'':>6} {'':>7} {'':>7}"]  # fmt: skip
    for name in stages:
        s = limits[name]
        lines.append(f"  {s.name:<16} {s.estimate_s:7.0f}s {s.limit_s:5d}s {s.margin_s:6.0f}s "
                     f"{s.worst_s:6d}s")  # fmt: skip
    total = call_total_s(limits, stages, rates)
    lines.append(f"  {'total':<16} {'':>8} {'':>6} {'':>7} {total:6d}s of {BUDGET_S}s"
                 f" (setup, limits, {KILL_AFTER_S}s kill grace and {PACK_S}s archive a "
                 "stage)")  # fmt: skip
    return "\n".join(lines)


def check_calls(rates: Rates) -> list[str]:
    """The calls' tables, or an error line per call that does not fit."""
    out, errors = [], []
    for call, stages in CALLS.items():
        limits = device_limits(rates, stages)
        total = call_total_s(limits, stages, rates)
        out.append(f"the {call} call (--stages {call}):\n{table(limits, stages, rates)}")
        room = BUDGET_S - total
        if call == "second":
            out.append(f"  room left: {room}s, for a rerun of a first call's stage but the "
                       f"search (the longest needs {rerun_s(rates)}s)")  # fmt: skip
            if room < rerun_s(rates):
                errors.append(f"the second call leaves {room}s, less than a rerun's "
                              f"{rerun_s(rates)}s")  # fmt: skip
        if total > BUDGET_S:
            errors.append(f"the {call} call takes up to {total}s, over {BUDGET_S}s")
    return out + [f"error: {e}: cut the counts in {Path(__file__).name}" for e in errors]


def shell(plan: dict[str, Flags], limits: dict[str, StageLimit], stages: tuple[str, ...],
          dry_run: bool) -> str:  # fmt: skip
    """stages=(the selected ones), all_stages=(...), needs_search=(...), kill_after,
    setup_s; for every stage NAME=(flags...), limit_NAME=seconds and note_NAME='where the
    limit comes from'."""
    lines = [f"stages=({' '.join(stages)})", f"all_stages=({' '.join(STAGES)})",
             f"needs_search=({' '.join(NEEDS_SEARCH)})", f"kill_after={KILL_AFTER_S}",
             f"setup_s={math.ceil(Rates.load().setup_s)}"]  # fmt: skip
    for name in STAGES:
        stage = limits[name]
        flags = [part for pair in plan[name].items() for part in pair]
        device = f"estimate {stage.estimate_s:.0f}s, margin {stage.margin_s:.0f}s"
        limit = DRY_RUN_LIMIT_S if dry_run else stage.limit_s
        note = f"dry run; on the device {stage.limit_s}s: {device}" if dry_run else device
        lines.append(f"{name}=({shlex.join(flags)})")
        lines.append(f"limit_{name}={limit}")
        lines.append(f"note_{name}={shlex.quote(note)}")
    return "\n".join(lines)


def selected(text: str | None, dry_run: bool) -> tuple[str, ...]:
    """The stages asked for, in the order they run: names, a call's name standing for its
    stages, or all; by default the first call (a dry run: all)."""
    text = text or ("all" if dry_run else "first")
    names = [n for item in text.split(",") if item
             for n in (STAGES if item == "all" else CALLS.get(item, (item,)))]  # fmt: skip
    unknown = sorted(set(names) - set(STAGES))
    if unknown or not names:
        sys.exit(f"error: --stages takes first, second, all or names among "
                 f"{','.join(STAGES)}, got {text!r}")  # fmt: skip
    return tuple(name for name in STAGES if name in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny flags for a CPU")
    parser.add_argument("--stages", help="first, second (the next device run's two calls), "
                        "all, or names (default: first; a dry run: all)")  # fmt: skip
    args = parser.parse_args()
    stages = selected(args.stages, args.dry_run)
    rates = Rates.load()
    print(f"time on the device (rates: results/gpu/{RATES.name}, margin x{MARGIN}, "
          f"floor +{FLOOR_S}s):", file=sys.stderr)  # fmt: skip
    lines = check_calls(rates)
    if not args.dry_run and stages not in CALLS.values():
        limits = device_limits(rates, stages)
        lines.append(f"this call (--stages {','.join(stages)}):\n{table(limits, stages, rates)}")
        if call_total_s(limits, stages, rates) > BUDGET_S:
            lines.append(f"error: these stages take up to {call_total_s(limits, stages, rates)}s "
                         f"of a call, over {BUDGET_S}s: run fewer --stages")  # fmt: skip
    print("\n".join(lines), file=sys.stderr)
    if any(line.startswith("error:") for line in lines):
        sys.exit(2)
    limits = device_limits(rates, stages)
    print(shell(DRY_RUN if args.dry_run else DEVICE, limits, stages, args.dry_run))


if __name__ == "__main__":
    main()

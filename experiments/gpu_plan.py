"""The GPU check's plan: each stage's flags, and its time limit on the device.

    python experiments/gpu_plan.py [--dry-run] [--stages NAME,NAME...|all]

experiments/gpu_check.sh reads this plan (shell assignments on stdout, run with
eval) and runs each stage with the flags given here. On the device each stage's
limit is its estimate times MARGIN: the estimate counts what the stage runs with
these flags (images generated, samples trained or decoded, measurements started)
at the rates and fixed costs the last GPU run measured, kept with their sources
in results/gpu/rates.json. The table of estimates, limits and margins goes to
stderr, and a selection of stages whose limits add up to more than BUDGET_S
fails. All seven stages do not fit in it (their fixed costs alone, Ray's start
and every measurement's, take most of it), so DEFAULT_STAGES are what a run
does unless told otherwise; the others run in a second session, after a search
(``--stages baselines,limits,ranks``). A dry run (``--dry-run``) has tiny flags
for a CPU and DRY_RUN_LIMIT_S per stage, runs every stage, and still checks the
device's default selection against the budget.
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

from raytune_loader.job import SegmentSpec
from raytune_loader.measure import CEILING_WINDOWS
from raytune_loader.options import GPU_BATCH_SIZE, SearchOptions
from shared_gpu import candidates, pairings

RATES = Path(__file__).resolve().parent.parent / "results" / "gpu" / "rates.json"
BUDGET_S = 480  # the stage limits of one run on the device: 8 minutes
MARGIN = 1.25
DRY_RUN_LIMIT_S = 240  # a guard against a hang; the slowest tiny stage takes ~110 s here
EXPERIMENT_WARMUP = SegmentSpec().warmup_steps  # the experiments' default_job
PRECISIONS_ON_CUDA = 4  # fp32, tf32, bf16, bf16 + channels-last
Flags = dict[str, str]

# the order they run in; baselines and limits read the search's best_config.json
STAGES = ("precision", "decoders_agree", "search", "baselines", "limits", "shared_gpu", "ranks")
DEFAULT_STAGES = ("precision", "decoders_agree", "search", "shared_gpu")

IMAGES = "2048"  # the one dataset of every stage: one batch of the search's largest size
DEVICE: dict[str, Flags] = {
    "precision": {"--synthetic-images": IMAGES, "--rounds": "1", "--steps": "10"},
    "decoders_agree": {"--synthetic-images": IMAGES, "--samples": "16"},
    "search": {
        "--synthetic-images": IMAGES, "--samples-per-trial": "2048",
        "--batch-sizes": "256,2048", "--min-batch-size": "128", "--gpus-per-trial": "0.5",
        "--num-samples": "10", "--time-budget": "30", "--steps": "10", "--report-every": "5",
        "--warmup-steps": "3", "--verify-top": "1", "--verify-repeats": "1",
    },
    "baselines": {"--synthetic-images": IMAGES, "--repeats": "2", "--steps": "20"},
    "limits": {"--synthetic-images": IMAGES, "--steps": "20"},
    "shared_gpu": {"--synthetic-images": IMAGES, "--steps": "6", "--configs": "4",
                   "--batch-size": "128"},
    "ranks": {
        "--synthetic-images": IMAGES, "--ranks-per-node": "2", "--gpus-per-trial": "1",
        "--batch-size": "128", "--samples-per-trial": "1024", "--num-samples": "3",
        "--time-budget": "20", "--steps": "6", "--report-every": "3", "--warmup-steps": "2",
        "--verify-top": "1", "--verify-repeats": "1",
    },
}  # fmt: skip

TINY_IMAGES = "64"  # at least one batch of the experiments' CPU default (32)
GPU_ONLY = ("--gpus-per-trial",)  # refused on a machine without a GPU
TINY: dict[str, Flags] = {
    "precision": {"--synthetic-images": TINY_IMAGES, "--steps": "2", "--batch-size": "8"},
    "decoders_agree": {"--synthetic-images": TINY_IMAGES, "--samples": "2"},
    "search": {
        "--synthetic-images": TINY_IMAGES, "--samples-per-trial": "64", "--batch-sizes": "8",
        "--min-batch-size": "4", "--num-samples": "1", "--time-budget": "10", "--steps": "2",
        "--report-every": "1", "--warmup-steps": "1", "--verify-top": "0",
    },
    "baselines": {"--synthetic-images": TINY_IMAGES, "--repeats": "1", "--steps": "2"},
    "limits": {"--synthetic-images": TINY_IMAGES, "--steps": "2"},
    "shared_gpu": {"--synthetic-images": TINY_IMAGES, "--steps": "2", "--configs": "2",
                   "--batch-size": "8"},
    "ranks": {
        "--synthetic-images": TINY_IMAGES, "--batch-size": "8", "--samples-per-trial": "64",
        "--num-samples": "1", "--time-budget": "10", "--steps": "2", "--report-every": "1",
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
    """The last device run's figures (results/gpu/rates.json); seconds and samples/s."""

    ceiling_samples_per_s: float
    loader_0_workers_samples_per_s: float
    loader_8_workers_samples_per_s: float
    decode_per_core_samples_per_s: float
    generate_images_per_s: float
    half_gpu_batch: int
    measurement_s: float
    trial_s: float
    ray_start_s: float
    tune_tail_s: float

    @classmethod
    def load(cls, path: Path = RATES) -> Rates:
        figures = json.loads(path.read_text())["rates"]
        return cls(**{f.name: figures[f.name]["value"] for f in fields(cls)})

    def loader(self, workers: int) -> float:
        """A loader's samples/s at batch 256: each worker at least the rate of the loader
        without workers (which decodes and trains in one process), at most 8 workers'."""
        if workers == 0:
            return self.loader_0_workers_samples_per_s
        return min(
            self.loader_8_workers_samples_per_s, workers * self.loader_0_workers_samples_per_s
        )


def _int(flags: Flags, name: str, default: int) -> int:
    return int(flags.get(name, default))


def _ceiling_s(rates: Rates, batch: int, warmup: int, steps: int, windows: int) -> float:
    return (warmup + windows * steps) * batch / rates.ceiling_samples_per_s


def _run_s(batch: int, warmup: int, steps: int, samples_per_s: float) -> float:
    return (warmup + steps) * batch / samples_per_s


def precision(flags: Flags, rates: Rates) -> float:
    """Each precision's ceiling (best of CEILING_WINDOWS windows) in each round."""
    rounds, steps = _int(flags, "--rounds", 3), _int(flags, "--steps", 30)
    batch = _int(flags, "--batch-size", GPU_BATCH_SIZE)
    ceiling = _ceiling_s(rates, batch, EXPERIMENT_WARMUP, steps, CEILING_WINDOWS)
    return rounds * PRECISIONS_ON_CUDA * (rates.measurement_s + ceiling)


def decoders_agree(flags: Flags, rates: Rates) -> float:
    """The reference and three variants decode each sample (bounded by a CPU core)."""
    samples = _int(flags, "--samples", 32)
    return rates.measurement_s + 4 * samples / rates.decode_per_core_samples_per_s


def search(flags: Flags, rates: Rates) -> float:
    """Ray's start, a ceiling per batch size (the largest backs off under the GPU share),
    the time budget and Tune's tail, then verification: the baselines and the top
    configurations, a ceiling per batch size each round, and the winner's input alone.
    With several ranks the ranks share the GPU, so the ceilings take that much longer."""
    defaults = SearchOptions()
    warmup = _int(flags, "--warmup-steps", defaults.warmup_steps)
    steps = _int(flags, "--steps", defaults.steps)
    ranks = _int(flags, "--ranks-per-node", 1)
    sizes = flags.get("--batch-sizes") or flags.get("--batch-size") or str(GPU_BATCH_SIZE)
    batches = [min(int(b), rates.half_gpu_batch) for b in sizes.split(",")]
    batch = batches[0]  # what the baselines and the winner train at

    def ceilings(windows: int) -> float:
        return sum(
            rates.trial_s + ranks * _ceiling_s(rates, b, warmup, steps, windows) for b in batches
        )

    # pytorch-default, the rule of thumb (and with ranks its per-rank share), the top ones
    baselines = 3 if ranks > 1 else 2
    top = _int(flags, "--verify-top", defaults.verify_top)
    configs = [rates.loader(0)] + [rates.loader(8)] * (baselines - 1 + top)
    verify_round = ceilings(1) + sum(
        rates.trial_s + _run_s(batch, warmup, steps, rate) for rate in configs
    )
    return (
        rates.measurement_s  # this process: the dataset checked and pre-warmed
        + rates.ray_start_s
        + ceilings(CEILING_WINDOWS)
        + float(flags["--time-budget"])
        + rates.tune_tail_s
        + _int(flags, "--verify-repeats", defaults.verify_repeats) * verify_round
        + rates.trial_s
        + _run_s(batch, warmup, steps, rates.loader(8))  # the input pipeline alone
    )


def baselines(flags: Flags, rates: Rates) -> float:
    """pytorch-default, heuristic and tuned (8 workers at most) in each round."""
    repeats, steps = _int(flags, "--repeats", 5), _int(flags, "--steps", 60)
    one_round = sum(
        rates.measurement_s + _run_s(GPU_BATCH_SIZE, EXPERIMENT_WARMUP, steps, rates.loader(w))
        for w in (0, 8, 8)
    )
    return repeats * one_round


def limits(flags: Flags, rates: Rates) -> float:
    """One core decoding, the ceiling at the tuned batch size, the tuned loader."""
    steps = _int(flags, "--steps", 60)
    return (
        2 * rates.measurement_s
        + (256 + 8) / rates.decode_per_core_samples_per_s  # decode_rate's, warm-up too
        + _ceiling_s(rates, GPU_BATCH_SIZE, EXPERIMENT_WARMUP, steps, CEILING_WINDOWS)
        + _run_s(GPU_BATCH_SIZE, EXPERIMENT_WARMUP, steps, rates.loader(8))
    )


def shared_gpu(flags: Flags, rates: Rates) -> float:
    """Each configuration alone, then the pairs two at a time (a pair lasts as long as
    its slower run), after the two pool processes start."""
    steps, count = _int(flags, "--steps", 15), _int(flags, "--configs", 6)
    batch = _int(flags, "--batch-size", GPU_BATCH_SIZE)
    configs = candidates(True, batch, count)

    def run(name: str) -> float:
        rate = rates.loader(configs[name].num_workers)
        return _run_s(batch, EXPERIMENT_WARMUP, steps, rate)

    alone = sum(rates.measurement_s + run(name) for name in configs)
    paired = sum(rates.measurement_s + max(run(a), run(b)) for a, b in pairings(list(configs)))
    return alone + rates.measurement_s + paired


ESTIMATES: dict[str, Callable[[Flags, Rates], float]] = {
    "precision": precision,
    "decoders_agree": decoders_agree,
    "search": search,
    "baselines": baselines,
    "limits": limits,
    "shared_gpu": shared_gpu,
    "ranks": search,
}


@dataclass(frozen=True)
class StageLimit:
    name: str
    estimate_s: float
    limit_s: int

    @property
    def margin_s(self) -> float:
        return self.limit_s - self.estimate_s


def device_limits(
    rates: Rates, stages: tuple[str, ...], plan: dict[str, Flags] = DEVICE
) -> dict[str, StageLimit]:
    """Each stage's estimate on the device and its limit, MARGIN over it (whole seconds).
    The first of ``stages`` also generates the dataset (a device starts bare)."""
    out = {}
    for name, flags in plan.items():
        estimate = ESTIMATES[name](flags, rates)
        if stages and name == stages[0]:
            estimate += int(flags["--synthetic-images"]) / rates.generate_images_per_s
        out[name] = StageLimit(name, estimate, math.ceil(estimate * MARGIN))
    return out


def total_s(limits: dict[str, StageLimit], stages: tuple[str, ...]) -> int:
    return sum(limits[name].limit_s for name in stages)


def table(limits: dict[str, StageLimit], stages: tuple[str, ...]) -> str:
    """Every stage's estimate, limit and margin; ``*`` marks the selected ones."""
    lines = [f"  {'stage':<15} {'estimate':>8} {'limit':>6} {'margin':>7}"]
    for s in limits.values():
        mark = "*" if s.name in stages else " "
        lines.append(f"{mark} {s.name:<15} {s.estimate_s:7.0f}s {s.limit_s:5d}s {s.margin_s:6.0f}s")
    lines.append(f"  {'* selected':<15} {'':>8} {total_s(limits, stages):5d}s of {BUDGET_S}s")
    return "\n".join(lines)


def shell(plan: dict[str, Flags], limits: dict[str, StageLimit], stages: tuple[str, ...],
          dry_run: bool) -> str:  # fmt: skip
    """stages=(the selected ones), all_stages=(...); for every stage NAME=(flags...),
    limit_NAME=seconds and note_NAME='where the limit comes from'."""
    lines = [f"stages=({' '.join(stages)})", f"all_stages=({' '.join(STAGES)})"]
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
    """The stages asked for, in the order they run; a dry run runs all by default."""
    if text is None:
        return STAGES if dry_run else DEFAULT_STAGES
    names = STAGES if text == "all" else tuple(n for n in text.split(",") if n)
    unknown = sorted(set(names) - set(STAGES))
    if unknown or not names:
        sys.exit(f"error: --stages takes names among {','.join(STAGES)} or all, "
                 f"got {text!r}")  # fmt: skip
    return tuple(name for name in STAGES if name in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dry-run", action="store_true", help="tiny flags for a CPU")
    parser.add_argument("--stages", help=f"comma-separated, or all (default: "
                        f"{','.join(DEFAULT_STAGES)}; a dry run: all)")  # fmt: skip
    args = parser.parse_args()
    stages = selected(args.stages, args.dry_run)
    on_device = DEFAULT_STAGES if args.dry_run else stages
    limits = device_limits(Rates.load(), on_device)
    print(f"stage limits on the device (rates: results/gpu/{RATES.name}, margin x{MARGIN}):",
          file=sys.stderr)  # fmt: skip
    print(table(limits, on_device), file=sys.stderr)
    if total_s(limits, on_device) > BUDGET_S:
        sys.exit(f"error: the stage limits add up to {total_s(limits, on_device)}s on the "
                 f"device, over {BUDGET_S}s: run fewer --stages or cut the counts in "
                 f"{Path(__file__).name}")  # fmt: skip
    print(shell(DRY_RUN if args.dry_run else DEVICE, limits, stages, args.dry_run))


if __name__ == "__main__":
    main()

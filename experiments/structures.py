"""Every structure of a search's space measured once: the cost model's best of each.

    python experiments/structures.py --config results/<dataset>/best_config.json

A search runs the few trials its budget allows, and its cost model leaves out the
structures it predicts far below the best: which structures were measured depends on
both. This measures the best configuration of every structure, the cost model's own
choice (its prediction first, then the usual choice, as the searcher orders them),
from the search's ``best_config.json``: its job (rebuilt as the bench rebuilds it:
dataset, model, precision, memory format, segment, device) and the profile its cost
model was built from. The space is the search's on this machine (on a GPU: nvJPEG
decode, thread workers). Each configuration is trained alone, one after another, in
this process, without Ray, after the ceiling.

Left out (MEASURED): the structures without workers that decode on the CPU, which one
core bounds (the profile's per-core rate says how fast; ``pytorch-default`` is one,
measured by the search itself). Decoding on the device without workers is measured.

Writes structures.json: per structure the configuration, the predicted and measured
samples/s, the window's steadiness, the share of the ceiling and the model's error.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from _common import save
from raytune_loader import load_best_config
from raytune_loader.bench import plan_from_config
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.candidates.structure import Structure
from raytune_loader.machine import hardware
from raytune_loader.measuring.measurer import LocalMeasurer, measure_ceilings
from raytune_loader.measuring.prepare import prepare_data
from raytune_loader.measuring.profile import Profile
from raytune_loader.outputs.console import freeze_at_exit
from raytune_loader.outputs.reader import recorded_options
from raytune_loader.progress import LogProgress
from raytune_loader.tuning.bounds import search_space
from raytune_loader.tuning.costmodel import CostModel, Prediction
from raytune_loader.tuning.space import SearchSpace


def measured(structure: Structure) -> bool:
    """Whether the experiment measures ``structure`` (see MEASURED in the docstring)."""
    return structure.kind != "none" or structure.decode == "device"


def structures(space: SearchSpace) -> dict[Structure, list[LoaderConfig]]:
    """The space's structures this experiment measures, with their configurations."""
    return {s: configs for s, configs in space.structures().items() if measured(s)}


def best_of(model: CostModel, configs: list[LoaderConfig]) -> tuple[LoaderConfig, Prediction]:
    """The configuration the cost model predicts fastest, the usual choice among equals."""
    from raytune_loader.tuning.searcher import _preference

    scored = [(p.samples_per_s, _preference(c), c, p) for c in configs
              if (p := model.predict(c)) is not None]  # fmt: skip
    if not scored:
        raise SystemExit(
            "error: the search's profile predicts none of a structure's configurations"
        )
    _, _, config, prediction = max(scored, key=lambda item: item[:2])
    return config, prediction


def main() -> None:
    freeze_at_exit()  # a stage of gpu_check.sh: it exits as quickly as the command lines
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the search's best_config.json")
    args = parser.parse_args()
    best = load_best_config(args.config)
    profile = ((best.data.get("search") or {}).get("model") or {}).get("profile")
    if not profile:
        raise SystemExit(f"error: {args.config} has no cost model's profile: run the search "
                         "with --search model (its default)")  # fmt: skip
    plan = plan_from_config(best)  # the job as the bench rebuilds it, on this machine
    cuda = plan.job.device.startswith("cuda")
    opts = recorded_options(best.data, str(best.path)).for_device(cuda)
    assert opts.batch_sizes is not None  # filled in for the device
    job = prepare_data(plan.job, max(opts.batch_sizes))
    space = search_space(opts, hardware.usable_cpus(), cuda, LogProgress(), job=job)
    measurer = LocalMeasurer()
    ceilings = measure_ceilings(job, space.batch_sizes, measurer, LogProgress())
    job = replace(job, ceilings=ceilings)
    model = CostModel(Profile.from_dict(profile), ceilings, cuda=cuda, ranks=job.ranks)
    rows: dict[str, Any] = {}
    for structure, configs in structures(space).items():
        config, predicted = best_of(model, configs)
        outcome = measurer.measure(job, config)
        metrics = outcome.metrics
        speed = metrics.samples_per_s if metrics else None
        rows[structure.words()] = {
            "config": config.kwargs() | config.pipeline(),
            "predicted_samples_per_s": predicted.samples_per_s,
            "predicted_bound": predicted.bound,
            "samples_per_s": speed,
            "steady": metrics.steady if metrics else None,
            "efficiency": outcome.efficiency,
            "data_wait_frac": metrics.data_wait_frac if metrics else None,
            "model_error": abs(predicted.samples_per_s - speed) / speed if speed else None,
            "failure": outcome.failure,
            "detail": outcome.detail,
        }
        said = f"{speed:.0f}" if speed else f"failed ({outcome.failure}: {outcome.detail})"
        print(f"{config.label():<70} predicted {predicted.samples_per_s:6.0f}, measured {said}",
              flush=True)  # fmt: skip
    save("structures", {"device": job.device, "ceilings": ceilings, "structures": rows})


if __name__ == "__main__":
    main()

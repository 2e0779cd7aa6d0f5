"""What Lightning's Trainer costs the tuned loader: the same loader, model and step in
Lightning (one device) and in a plain loop, rotated in one run.

    python experiments/trainer_overhead.py [--config best_config.json] [--steps 300]

Without --config it uses the loader the default search chose in a fresh clone on 2
cores (results/benchmarks/default_run.txt: 2 thread workers decoding to tensors,
uint8) and the same settings with worker processes. Each run trains small-cnn in
fp32 with one compute thread, as the search does, on the embedded default dataset
with its ImageNet transforms; warm-up steps are not timed. Writes
results/benchmarks/trainer_overhead.json: samples/s of each (median and range) and
Lightning over plain per round (target: Lightning costs at most 5%), and the training
process's minor page faults per step: where glibc's allocator hands batch-sized buffers
back to the system, every step touches fresh pages (run it again with
MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ set to see what that costs; the
environment is recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from _common import default_job, save
from raytune_loader import load_best_config
from raytune_loader.measuring.models import build_model
from raytune_loader.outputs.reader import BestConfig
from raytune_loader.verdict.selection import rotated

DEFAULT_RUN = {  # the fresh-clone default run's winner, and its worker-process twin
    "thread": ({"batch_size": 32, "num_workers": 2, "prefetch_factor": 1, "pin_memory": False,
                "persistent_workers": False, "in_order": True, "multiprocessing_context": None},
               {"transfer": "uint8", "decode": "tensor", "workers": "thread"}),
    "process": ({"batch_size": 32, "num_workers": 2, "prefetch_factor": 1, "pin_memory": False,
                 "persistent_workers": True, "in_order": True, "multiprocessing_context": None},
                {"transfer": "uint8", "decode": "tensor", "workers": "process"}),
}  # fmt: skip


def default_configs(folder: Path) -> dict[str, BestConfig]:
    from raytune_loader.machine.hardware import cpu_and_gpu_summary

    configs = {}
    for kind, (loader, pipeline) in DEFAULT_RUN.items():
        path = folder / f"{kind}.json"
        path.write_text(json.dumps({
            "schema_version": 1, "dataset": "synthetic-imagenet", "model": "small-cnn",
            "objective": "util", "loader": loader, "pipeline": pipeline, "metrics": {},
            "baselines": {}, "speedup": {}, "hardware": cpu_and_gpu_summary(), "search": {},
            "created": "", "job": {"channels_last": False},
        }))  # fmt: skip
        configs[kind] = load_best_config(path)
    return configs


def plain(tuned: BestConfig, dataset: Any, classes: int, warmup: int, steps: int) -> float:
    torch.manual_seed(0)
    model = build_model("small-cnn", classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = tuned.dataloader(dataset)  # once, as Lightning calls train_dataloader once
    done, samples, started = 0, 0, 0.0
    while done < warmup + steps:
        for batch in loader:
            if done == warmup:
                started = time.perf_counter()
            images, labels = tuned.to_device(batch, "cpu")
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
            samples += len(labels) if done >= warmup else 0
            done += 1
            if done == warmup + steps:
                break
    return samples / (time.perf_counter() - started)


def lightning(tuned: BestConfig, dataset: Any, classes: int, warmup: int, steps: int) -> float:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = build_model("small-cnn", classes)
            self.samples, self.started = 0, 0.0

        def train_dataloader(self) -> Any:
            return tuned.dataloader(dataset)

        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            return tuned.to_device(batch, self.device)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.global_step == warmup:
                self.started = time.perf_counter()
            if self.global_step >= warmup:
                self.samples += len(batch[1])
            return torch.nn.functional.cross_entropy(self.model(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    module = Module()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=warmup + steps, max_epochs=-1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module)
    return module.samples / (time.perf_counter() - module.started)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", help="a best_config.json (default: the default run's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--name", default="trainer_overhead", help="the results file's name")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # Lightning's advice on workers and logging
    torch.set_num_threads(1)  # the search's compute threads
    if args.config:
        configs = {"tuned": load_best_config(args.config)}
    else:
        configs = default_configs(Path(tempfile.mkdtemp(prefix="trainer-overhead-")))
    job = default_job()
    root = Path(job.dataset.resolved_root() or "") / "train"
    runners = {"plain": plain, "lightning": lightning}
    speed: dict[str, list[float]] = {}
    faults: dict[str, list[float]] = {}
    for kind, tuned in configs.items():
        dataset = tuned.image_dataset(root)
        classes = len(dataset.classes)  # type: ignore[attr-defined]
        for rnd, name in rotated(list(runners), args.rounds):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            rate = runners[name](tuned, dataset, classes, args.warmup, args.steps)
            per_step = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / (
                args.warmup + args.steps
            )
            speed.setdefault(f"{kind} {name}", []).append(rate)
            faults.setdefault(f"{kind} {name}", []).append(per_step)
            print(f"round {rnd + 1}: {kind:<8} {name:<10} {rate:7.1f} samples/s, "
                  f"{per_step:6.0f} page faults a step", flush=True)  # fmt: skip
    ratios = {
        kind: [
            lt / pl
            for lt, pl in zip(speed[f"{kind} lightning"], speed[f"{kind} plain"], strict=True)
        ]  # fmt: skip
        for kind in configs
    }
    save(
        args.name,
        {
            "samples_per_s": {name: spread(values) for name, values in speed.items()},
            "lightning_over_plain": {kind: spread(values) for kind, values in ratios.items()},
            "minor_page_faults_per_step": {name: spread(v) for name, v in faults.items()},
            "malloc_environment": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
            "loaders": {
                kind: {**tuned.data["loader"], **tuned.data.get("pipeline", {})}
                for kind, tuned in configs.items()
            },  # fmt: skip
            "target": "Lightning's Trainer costs at most 5% (lightning_over_plain >= 0.95)",
            "rounds": args.rounds,
            "steps": args.steps,
            "warmup_steps": args.warmup,
            "model": "small-cnn, fp32, 1 compute thread",
        },
    )


if __name__ == "__main__":
    main()

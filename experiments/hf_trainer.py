"""What the Hugging Face Trainer gains from a search tuned for it (``--trainer hf``).

    python experiments/hf_trainer.py [--config best_config.json] [--steps 160] [--rounds 3]

Without --config it first runs the default search with ``--trainer hf`` (the embedded
default dataset, small-cnn on the CPU) and takes its best_config.json. Then, in rotated
rounds in one process, it trains small-cnn in fp32 with one compute thread (as the
search does) on the tuned image dataset three ways:

- ``hf-defaults``: ``transformers.Trainer`` with its default loader arguments
  (``dataloader_num_workers=0``, pinning on, no prefetch), the tuned batch size, over
  the dataset a user has without the search (torchvision's ``ImageFolder``, PIL
  decoding, the same ImageNet transforms: the search's ``pytorch-default``);
- ``hf-defaults-tuned-data``: the same arguments over the tuned dataset (its decoder),
  which isolates what the arguments alone gain;
- ``hf-tuned``: the same Trainer with ``TrainingArguments(**tuned.training_arguments())``;
- ``plain-tuned``: the tuned loader (``tuned.dataloader``) in a plain loop.

The Trainer is set up as lean as a plain loop (SGD, no clipping, no logging, no
checkpoints), so the comparisons are of loaders, not of the Trainer's extras. Warm-up
steps are not timed. Writes results/benchmarks/hf_trainer.json: samples/s of each
(median and range), hf-tuned over hf-defaults (target at least 2x) and over
hf-defaults-tuned-data, and hf-tuned over plain-tuned (target within 5%) per round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from _common import default_job, save
from raytune_loader import load_best_config
from raytune_loader.measuring.models import build_model
from raytune_loader.outputs.reader import BestConfig
from raytune_loader.sources.datasets import DatasetSpec, build_dataset
from raytune_loader.verdict.selection import rotated

LR = 0.01


class AsDicts(Dataset):
    """``(image, class)`` samples as the Trainer hands them to its model."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> dict[str, Any]:
        image, label = self.dataset[index]
        return {"pixel_values": image, "labels": label}


class WithLoss(torch.nn.Module):
    """small-cnn as the Trainer calls a model: keyword inputs, a loss out."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = build_model("small-cnn", classes)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        logits = self.net(pixel_values)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def hugging_face(tuned: BestConfig, dataset: Any, classes: int, warmup: int, steps: int,
                 arguments: dict[str, Any]) -> float:  # fmt: skip
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Clock(TrainerCallback):
        started, samples = 0.0, 0

        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            if state.global_step == warmup:
                Clock.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
            if state.global_step > warmup:
                Clock.samples += args.per_device_train_batch_size

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, max_steps=warmup + steps, report_to="none", save_strategy="no",
            logging_strategy="no", use_cpu=True, disable_tqdm=True, seed=0, optim="sgd",
            learning_rate=LR, max_grad_norm=0.0, lr_scheduler_type="constant",
            dataloader_drop_last=True, **arguments,
        )  # fmt: skip
        Trainer(model=WithLoss(classes), args=args, train_dataset=AsDicts(dataset),
                callbacks=[Clock()]).train()  # fmt: skip
    return Clock.samples / (time.perf_counter() - Clock.started)


def plain(tuned: BestConfig, dataset: Any, classes: int, warmup: int, steps: int) -> float:
    model = WithLoss(classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = tuned.dataloader(dataset)
    done, samples, started = 0, 0, 0.0
    while done < warmup + steps:
        for images, labels in loader:
            if done == warmup:
                started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            model(images, labels)["loss"].backward()
            optimizer.step()
            samples += len(labels) if done >= warmup else 0
            done += 1
            if done == warmup + steps:
                break
    return samples / (time.perf_counter() - started)


def search(out: Path) -> Path:
    """The default search with --trainer hf; its best_config.json."""
    command = [sys.executable, "-m", "raytune_loader.search", "--trainer", "hf", "--out", str(out)]
    print("searching:", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return out / "synthetic-imagenet" / "best_config.json"


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="a best_config.json searched with --trainer hf "
                        "(default: search now)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=160, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=16)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    path = Path(args.config) if args.config else search(Path(tempfile.mkdtemp(prefix="hf-")))
    tuned = load_best_config(path)
    torch.set_num_threads(1)  # the search's compute threads
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    root = Path(default_job().dataset.resolved_root() or "") / "train"
    dataset = tuned.image_dataset(root)
    usual = build_dataset(DatasetSpec("imagefolder", str(root)), "float32", "pil")
    classes = len(dataset.classes)  # type: ignore[attr-defined]
    batch = {"per_device_train_batch_size": tuned.loader.batch_size}
    runners = {
        "hf-defaults": lambda: hugging_face(
            tuned, usual, classes, args.warmup, args.steps, batch
        ),  # fmt: skip
        "hf-defaults-tuned-data": lambda: hugging_face(
            tuned, dataset, classes, args.warmup, args.steps, batch
        ),  # fmt: skip
        "hf-tuned": lambda: hugging_face(
            tuned, dataset, classes, args.warmup, args.steps, tuned.training_arguments()
        ),  # fmt: skip
        "plain-tuned": lambda: plain(tuned, dataset, classes, args.warmup, args.steps),
    }
    speed: dict[str, list[float]] = {}
    for rnd, name in rotated(list(runners), args.rounds):
        rate = runners[name]()
        speed.setdefault(name, []).append(rate)
        print(f"round {rnd + 1}: {name:<12} {rate:7.1f} samples/s", flush=True)
    over_defaults = [t / d for t, d in zip(speed["hf-tuned"], speed["hf-defaults"], strict=True)]
    over_arguments = [t / d for t, d in zip(speed["hf-tuned"], speed["hf-defaults-tuned-data"],
                                            strict=True)]  # fmt: skip
    over_plain = [t / p for t, p in zip(speed["hf-tuned"], speed["plain-tuned"], strict=True)]
    best = load_best_config(path).data
    save("hf_trainer", {
        "samples_per_s": {name: spread(values) for name, values in speed.items()},
        "hf_tuned_over_hf_defaults": spread(over_defaults),
        "hf_tuned_over_hf_defaults_tuned_data": spread(over_arguments),
        "hf_tuned_over_plain_tuned": spread(over_plain),
        "training_arguments": tuned.training_arguments(),
        "pipeline": best.get("pipeline"),
        "best_left_out": (best.get("trainer") or {}).get("best_left_out"),
        "search_speedup": best.get("speedup"),
        "config": str(path) if args.config else "searched in this run",
        "targets": "hf-tuned at least 2x hf-defaults; within 5% of plain-tuned",
        "rounds": args.rounds, "steps": args.steps, "warmup_steps": args.warmup,
        "model": "small-cnn, fp32, 1 compute thread; Trainer with SGD, no clipping or logging",
    })  # fmt: skip


if __name__ == "__main__":
    main()

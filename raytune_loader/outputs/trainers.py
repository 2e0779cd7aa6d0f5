"""The trainers whose way of using the tuned loader this release checks.

``tests/test_trainers.py`` trains with the tuned loader, the README's way, in each of
these (two ranks, worker processes and thread workers), and checks that each rank
reads its own shard of every epoch with the tuned settings; with a tuned stream
(webdataset, Parquet; workers started by fork, spawn or forkserver, or threads; ranks
also started by ``torch.multiprocessing.spawn``), that every rank reads as many
batches as every other, disjoint samples, another order each epoch. It also checks
that the installed versions are the ones named here, so this list stays what was
really tried; ``best_config.json`` carries it in its ``trainers`` section.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raytune_loader.errors import ConfigError

if TYPE_CHECKING:
    from raytune_loader.candidates.config import LoaderConfig
    from raytune_loader.tuning.costmodel import CostModel
    from raytune_loader.tuning.space import SearchSpace

CHECKED = {  # distribution name: release series checked
    "lightning": "2.6",  # Trainer(strategy="ddp"), train_dataloader + on_after_batch_transfer
    "transformers": "5.25",  # Trainer(args=TrainingArguments(**tuned.training_arguments()))
    "accelerate": "1.15",  # Accelerator.prepare(model, optimizer, loader)
    "ray": "2.60",  # Ray Train: TorchTrainer + ray.train.torch.prepare_data_loader
    "torch": "2.14",  # a DDP loop under torchrun or torch.multiprocessing.spawn
}


def section() -> dict[str, Any]:
    """``best_config.json``'s ``trainers`` section."""
    return {
        "checked": {
            "lightning": CHECKED["lightning"],
            "accelerate": CHECKED["accelerate"],
            "ray_train": CHECKED["ray"],
            "torchrun_ddp": CHECKED["torch"],
            "hf_trainer": CHECKED["transformers"],
        },
        "usage": "each rank reads its own shard of every epoch, a stream as many batches "
        "on every rank: see docs/trainers.md and docs/streams.md",
    }


HF_ARGUMENTS = {  # LoaderConfig's field: the TrainingArguments field that sets it
    "batch_size": "per_device_train_batch_size",
    "num_workers": "dataloader_num_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
}
# what the Hugging Face Trainer's DataLoader has, whatever TrainingArguments say (4.x and
# 5.x alike): a configuration that differs is not one it can build
HF_FIXED = {"engine": "dataloader", "workers": "process", "batching": "loader",
            "worker_threads": None, "in_order": True, "multiprocessing_context": None,
            "transfer": "float32"}  # fmt: skip


def hf_arguments(config: LoaderConfig) -> dict[str, Any]:
    """The keyword arguments of ``transformers.TrainingArguments`` that build ``config``'s
    loader (a rank's: ``per_device_train_batch_size``); a ConfigError in one line naming
    what the Trainer's own DataLoader cannot take."""
    refused = [f"{name}={getattr(config, name)!r}" for name, want in HF_FIXED.items()
               if getattr(config, name) != want]  # fmt: skip
    if config.decode == "device":
        refused.append("decode='device'")
    if refused:
        raise ConfigError(
            f"the Hugging Face Trainer builds its own DataLoader, which cannot take "
            f"{', '.join(refused)}: re-run the search with --trainer hf"
        )
    out = {hf: getattr(config, name) for name, hf in HF_ARGUMENTS.items()}
    if not config.num_workers:  # what DataLoader accepts without workers
        out.update(dataloader_prefetch_factor=None, dataloader_persistent_workers=False)
    return out


def hf_section(config: LoaderConfig, space: SearchSpace, model: CostModel | None) -> dict[str, Any]:
    """``best_config.json``'s ``trainer`` section for a search with ``--trainer hf``: the
    TrainingArguments, what the space left out, and, from the profile, the best
    configuration outside it and what it would have gained (an estimate)."""
    from raytune_loader.tuning.space import LEFT_OUT

    out: dict[str, Any] = {
        "name": "hf",
        "training_arguments": hf_arguments(config),
        "left_out": list(LEFT_OUT["hf"].values()),
        "best_left_out": None,
    }
    tuned = model.predict(config) if model is not None else None
    if model is None or tuned is None:
        return out
    inside = set(space.grid())
    best, rate = None, tuned.samples_per_s
    for other in space.unrestricted().grid():
        if other in inside or other.batch_size != config.batch_size:
            continue
        found = model.predict(other)
        if found is not None and found.samples_per_s > rate:
            best, rate = other, found.samples_per_s
    if best is not None:
        out["best_left_out"] = {
            "settings": best.label(),
            "predicted_samples_per_s": rate,
            "predicted_gain": rate / tuned.samples_per_s,
            "note": "the cost model's estimate from the profile, not a measurement",
        }
    return out

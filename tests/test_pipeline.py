"""The pipeline around the DataLoader: uint8 transfer finished on the device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from raytune_loader import load_best_config
from raytune_loader.datasets import DatasetSpec, build_dataset, pipeline_searchable
from raytune_loader.pipeline import finish_on_device, normalize

TOLERANCE = 1e-5  # the same decoder (PIL) on both sides: only float rounding differs


def test_every_transfer_gives_the_same_augmented_tensor(tiny_imagenet: Path) -> None:
    """RandomResizedCrop(224), the flip and ImageNet normalization mean the same in both
    variants: with the crop box and flip fixed by the seed, the tensors agree."""
    spec = DatasetSpec("synthetic-imagenet", str(tiny_imagenet))
    in_workers, on_device = build_dataset(spec, "float32"), build_dataset(spec, "uint8")
    for index in range(8):
        torch.manual_seed(index)
        expected, label = in_workers[index]
        torch.manual_seed(index)
        raw, same_label = on_device[index]
        assert raw.dtype == torch.uint8 and raw.shape == expected.shape == (3, 224, 224)
        assert label == same_label
        assert (normalize(raw[None])[0] - expected).abs().max() < TOLERANCE


def test_only_uint8_image_batches_are_finished() -> None:
    images = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    labels = torch.tensor([1, 2])
    finished, same = finish_on_device([images, labels], "uint8")
    assert finished.dtype == torch.float32 and torch.equal(same, labels)
    assert finish_on_device({"x": images, "y": labels}, "uint8")["x"].dtype == torch.float32
    assert finish_on_device([images, labels], "float32")[0] is images


@pytest.mark.parametrize(
    ("name", "searched"),
    [
        ("synthetic-imagenet", True),
        ("imagefolder", True),
        ("cifar10", False),
        ("datasets_for_tests:fast", False),
        ("datasets_for_tests:images_with_transfer", True),  # opts in with transfer=
    ],
)
def test_which_datasets_have_their_pipeline_searched(name: str, searched: bool) -> None:
    assert pipeline_searchable(DatasetSpec(name)) is searched


def test_a_training_loop_with_the_tuned_pipeline(tiny_imagenet: Path, tmp_path: Path) -> None:
    """The README's loop: the dataset, the loader and the device-side stages in 3 lines."""
    loader = {
        "batch_size": 8,
        "num_workers": 2,
        "prefetch_factor": 2,
        "pin_memory": False,
        "persistent_workers": True,
        "in_order": False,
        "multiprocessing_context": None,
    }
    best = {
        "schema_version": 1, "dataset": "synthetic-imagenet", "model": "small-cnn",
        "objective": "util", "loader": loader, "metrics": {}, "baselines": {}, "speedup": {},
        "hardware": {}, "search": {}, "created": "2026-01-01T00:00:00+00:00",
        "pipeline": {"transfer": "uint8", "decode": "cpu", "workers": "process",
                     "in_order": False, "start_method": "default"},
    }  # fmt: skip
    (tmp_path / "best_config.json").write_text(json.dumps(best))

    tuned = load_best_config(tmp_path / "best_config.json")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 8, 8), torch.nn.Flatten(),
                                torch.nn.LazyLinear(8))  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dataset = tuned.image_dataset(tiny_imagenet / "train")
    for step, batch in enumerate(tuned.dataloader(dataset)):
        images, labels = tuned.to_device(batch, "cpu")
        assert images.dtype == torch.float32 and images.shape == (8, 3, 224, 224)
        assert -3 < images.mean() < 3  # normalized, not 0..255
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        if step == 2:
            break
    assert tuned.loader.transfer == "uint8" and tuned.loader.in_order is False

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from PIL import Image

from raytune_loader.datasets import DatasetSpec, build_dataset, num_classes
from raytune_loader.errors import DatasetError
from raytune_loader.synthetic import ensure_synthetic_imagenet


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.JPEG")):
        h.update(path.relative_to(root).as_posix().encode() + path.read_bytes())
    return h.hexdigest()


def test_synthetic_imagenet_is_real_deterministic_jpeg(tiny_imagenet: Path, tmp_path: Path) -> None:
    files = sorted((tiny_imagenet / "train").rglob("*.JPEG"))
    assert len(files) == 96
    assert len({f.parent.name for f in files}) == 8
    with Image.open(files[0]) as image:
        assert image.format == "JPEG"
        assert 300 <= image.width <= 640 and 300 <= image.height <= 500
    assert 20_000 < files[0].stat().st_size < 300_000  # ImageNet-like file sizes
    again = ensure_synthetic_imagenet(tmp_path / "again", num_images=96, num_classes=8)
    assert _digest(again) == _digest(tiny_imagenet)


def test_synthetic_imagenet_is_reused_not_regenerated(tiny_imagenet: Path) -> None:
    calls: list[int] = []
    ensure_synthetic_imagenet(tiny_imagenet, 96, 8, progress=lambda done, total: calls.append(done))
    assert calls == []


def test_generation_reports_progress(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    ensure_synthetic_imagenet(tmp_path / "p", 40, 4, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (40, 40) and len(calls) >= 2


def test_synthetic_dataset_uses_imagenet_transforms(tiny_imagenet: Path) -> None:
    dataset = build_dataset(DatasetSpec("synthetic-imagenet", str(tiny_imagenet)))
    image, label = dataset[0]
    assert tuple(image.shape) == (3, 224, 224)
    assert -3 < float(image.mean()) < 3 and 0 <= label < 8
    assert num_classes(DatasetSpec("synthetic-imagenet", str(tiny_imagenet)), dataset) == 8


def test_unknown_dataset_lists_the_known_ones() -> None:
    with pytest.raises(DatasetError, match="synthetic-imagenet, imagenet, imagefolder, cifar10"):
        DatasetSpec("imagenet-22k")


def test_missing_and_empty_folders_explain_the_layout(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist; expected the ImageFolder layout"):
        build_dataset(DatasetSpec("imagenet", str(tmp_path / "nowhere")))
    (tmp_path / "train").mkdir()
    with pytest.raises(DatasetError, match="no images under"):
        build_dataset(DatasetSpec("imagenet", str(tmp_path)))


def test_torchvision_dataset_absent_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="--download"):
        build_dataset(DatasetSpec("cifar10", str(tmp_path)))


def test_factory_datasets(tmp_path: Path) -> None:
    assert len(build_dataset(DatasetSpec("datasets_for_tests:fast"))) == 256
    assert len(build_dataset(DatasetSpec("datasets_for_tests:slow", str(tmp_path)))) == 256
    with pytest.raises(DatasetError, match="not a map-style torch Dataset"):
        build_dataset(DatasetSpec("datasets_for_tests:not_a_dataset"))
    with pytest.raises(DatasetError, match="cannot import"):
        build_dataset(DatasetSpec("no_such_module:make"))


def test_never_overwrites_a_folder_that_is_not_ours(tmp_path: Path, tiny_imagenet: Path) -> None:
    mine = tmp_path / "my-photos"
    mine.mkdir()
    (mine / "holiday.jpg").write_bytes(b"precious")
    with pytest.raises(DatasetError, match="is not a synthetic-imagenet folder"):
        ensure_synthetic_imagenet(mine, 40, 4)
    assert (mine / "holiday.jpg").read_bytes() == b"precious"
    with pytest.raises(DatasetError, match="pass --synthetic-images 96"):
        ensure_synthetic_imagenet(tiny_imagenet, 40, 4)
    assert len(list((tiny_imagenet / "train").rglob("*.JPEG"))) == 96

"""The dataset registry: from a --dataset name to a Dataset, and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from raytune_loader.errors import DatasetError
from raytune_loader.sources.datasets import (
    DatasetSpec,
    build_dataset,
    dataset_for_trial,
    num_classes,
)


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
    """Each layout's own advice: imagenet reads --data-root/train/<class>/, imagefolder
    the classes under --data-root itself (its images of any extension ImageFolder reads)."""
    with pytest.raises(DatasetError, match="does not exist; expected the ImageFolder layout") as e:
        build_dataset(DatasetSpec("imagenet", str(tmp_path / "nowhere")))
    assert str(e.value).endswith(
        "train/<class>/<image>.JPEG (pass the folder that holds train/ with --data-root)"
    )
    (tmp_path / "photo.jpg").write_bytes(b"not a folder")
    with pytest.raises(DatasetError, match="photo.jpg is a file, not a folder; expected the") as e:
        build_dataset(DatasetSpec("imagefolder", str(tmp_path / "photo.jpg")))
    assert str(e.value).endswith(
        "photo.jpg/<class>/<image> (pass the folder that holds the class folders with --data-root)"
    )
    (tmp_path / "train").mkdir()
    with pytest.raises(DatasetError, match="no images under"):
        build_dataset(DatasetSpec("imagenet", str(tmp_path)))


def test_a_folder_of_splits_is_refused_naming_the_folder_that_holds_the_classes(
    tiny_imagenet: Path, tmp_path: Path
) -> None:
    """An image folder one level too high (its subfolders train/ and val/, each of class
    folders): ImageFolder would take the two splits as two classes and train on both.
    The folder of classes itself is read as ever."""
    import shutil

    for split in ("train", "val"):
        shutil.copytree(tiny_imagenet / "train", tmp_path / "photos" / split)
    with pytest.raises(DatasetError) as refused:
        build_dataset(DatasetSpec("imagefolder", str(tmp_path / "photos")))
    said = str(refused.value)
    assert "the class folders of" in said and "are train, val: a dataset's splits" in said
    assert f"such as {tmp_path / 'photos' / 'train'}, with --data-root" in said
    assert "\n" not in said
    classes = build_dataset(DatasetSpec("imagefolder", str(tmp_path / "photos" / "train")))
    assert len(classes.classes) == 8  # type: ignore[attr-defined]


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


def _calls(folder: Path) -> int:
    return len((folder / "calls").read_text().splitlines())


def test_a_factory_is_called_once_to_see_whether_it_streams_and_to_build(tmp_path: Path) -> None:
    """The dataset called to see whether it streams is the next build's, unread: each
    trial's process calls the user's factory once, not twice (an ImageFolder over
    ImageNet lists 1.28M files a call). Every build after gets a fresh one."""
    spec = DatasetSpec("datasets_for_tests:counted", str(tmp_path))
    assert spec.source.accesses(spec) == ("map",)  # called, to see
    first = dataset_for_trial(spec)
    assert _calls(tmp_path) == 1
    assert dataset_for_trial(spec) is not first and _calls(tmp_path) == 2  # not kept


def test_a_build_with_other_arguments_calls_the_factory_and_drops_the_unread_one(
    tmp_path: Path,
) -> None:
    spec = DatasetSpec("datasets_for_tests:counted_with_transfer", str(tmp_path))
    assert spec.source.accesses(spec) == ("map",)  # called with transfer="float32"
    dataset_for_trial(spec, transfer="uint8")
    assert _calls(tmp_path) == 2
    dataset_for_trial(spec)  # float32 again: the unread one went with the uint8 build
    assert _calls(tmp_path) == 3


def test_a_corrupt_file_the_profile_reads_ends_the_search_before_any_trial(
    tiny_imagenet: Path, tmp_path: Path
) -> None:
    """The model-guided search's profile reads the trials' subset first: a file there that
    is no image would fail every trial in turn, so the search ends at the profile, in one
    line naming the file and what to do with it, not with TPE after a warning."""
    import shutil

    from raytune_loader.errors import CORRUPT_FIX
    from raytune_loader.measuring.job import SegmentSpec, TrialJob
    from raytune_loader.measuring.measurer import LocalMeasurer
    from raytune_loader.progress import LogProgress
    from raytune_loader.tuning import setup
    from raytune_loader.tuning.options import SearchOptions
    from raytune_loader.tuning.space import SearchSpace

    for folder in sorted((tiny_imagenet / "train").iterdir())[:2]:
        shutil.copytree(folder, tmp_path / "photos" / folder.name)
    bad = sorted((tmp_path / "photos").rglob("*.JPEG"))[-1]
    bad.write_text("not a JPEG")
    job = TrialJob(
        dataset=DatasetSpec("imagefolder", str(tmp_path / "photos")), model="small-cnn",
        segment=SegmentSpec(1, 4, 2), samples_per_trial=24, node_cpus=2, ceilings={8: 500.0},
    )  # fmt: skip
    space = SearchSpace(max_workers=1, batch_sizes=(8,), cuda=False, usable_cpus=2)
    with pytest.raises(DatasetError) as raised:
        setup.cost_model(SearchOptions(), job, space, LocalMeasurer(), 2, LogProgress())
    said = str(raised.value)
    assert said.startswith(f"the profile read a corrupt sample {bad}: ") and "\n" not in said
    assert said.endswith(CORRUPT_FIX)

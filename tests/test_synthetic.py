"""The embedded default dataset: real, deterministic JPEG files, generated once, safely."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from raytune_loader.errors import DatasetError
from raytune_loader.sources.synthetic import FORMAT_VERSION, default_root, ensure_synthetic_imagenet


def test_synthetic_imagenet_is_real_deterministic_jpeg(tiny_imagenet: Path, tmp_path: Path) -> None:
    files = sorted((tiny_imagenet / "train").rglob("*.JPEG"))
    assert len(files) == 96
    assert len({f.parent.name for f in files}) == 8
    with Image.open(files[0]) as image:
        assert image.format == "JPEG"
        assert 300 <= image.width <= 640 and 300 <= image.height <= 500
    assert 20_000 < files[0].stat().st_size < 300_000  # ImageNet-like file sizes
    # image i is made from i and the number of classes alone: made again, the first 16
    # are the same files, byte for byte
    again = ensure_synthetic_imagenet(tmp_path / "again", num_images=16, num_classes=8)
    made = {p.relative_to(again): p.read_bytes() for p in again.rglob("*.JPEG")}
    assert len(made) == 16
    assert made == {name: (tiny_imagenet / name).read_bytes() for name in made}


def test_synthetic_imagenet_is_reused_not_regenerated(tiny_imagenet: Path) -> None:
    calls: list[int] = []
    ensure_synthetic_imagenet(tiny_imagenet, 96, 8, progress=lambda done, total: calls.append(done))
    assert calls == []


def test_generation_reports_progress(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    ensure_synthetic_imagenet(tmp_path / "p", 40, 4, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (40, 40) and len(calls) >= 2


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
    with pytest.raises(DatasetError, match="holiday.jpg is a file, not a folder; pass an"):
        ensure_synthetic_imagenet(mine / "holiday.jpg", 40, 4)
    assert (mine / "holiday.jpg").read_bytes() == b"precious"


def test_image_i_is_in_class_i_mod_classes_under_its_own_name(tiny_imagenet: Path) -> None:
    files = sorted((tiny_imagenet / "train").rglob("*.JPEG"))
    assert [f.relative_to(tiny_imagenet / "train").as_posix() for f in files] == [
        f"n{i % 8:05d}/{i:06d}.JPEG" for i in sorted(range(96), key=lambda i: (i % 8, i))
    ]
    meta = json.loads((tiny_imagenet / "meta.json").read_text())
    assert meta == {"version": FORMAT_VERSION, "images": 96, "classes": 8}
    for path in files:
        with Image.open(path) as image:  # ImageNet-like sizes, landscape and portrait
            assert 300 <= min(image.size) <= max(image.size) <= 640


def test_the_default_root_is_per_size_in_the_user_s_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_root(500) == tmp_path / "cache" / "raytune_loader" / "synthetic-imagenet-500"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_root(2000) == tmp_path / "home/.cache/raytune_loader/synthetic-imagenet-2000"


def test_an_interrupted_generation_leaves_nothing_behind(tmp_path: Path) -> None:
    def ctrl_c(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ensure_synthetic_imagenet(tmp_path / "data", 20, 4, progress=ctrl_c)
    assert list(tmp_path.iterdir()) == []  # neither the dataset nor its staging folder


def test_an_older_format_of_ours_is_replaced(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "train" / "n00000").mkdir(parents=True)
    (root / "train" / "n00000" / "old.JPEG").write_bytes(b"old")
    (root / "meta.json").write_text(json.dumps({"version": FORMAT_VERSION - 1, "images": 8}))
    ensure_synthetic_imagenet(root, 8, 2)
    assert json.loads((root / "meta.json").read_text())["version"] == FORMAT_VERSION
    assert sorted(p.name for p in (root / "train").rglob("*.JPEG")) == [
        f"{i:06d}.JPEG" for i in range(8)
    ]

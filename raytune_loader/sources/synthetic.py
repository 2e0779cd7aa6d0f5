"""The embedded default dataset: real JPEG files with ImageNet-like sizes.

Images are generated once, deterministically (image ``i`` depends only on ``i``),
into an ImageFolder layout ``<root>/train/<class>/<i>.JPEG`` and reused. Each
picture is a smooth random field with a class tint plus sensor-like noise,
which gives JPEG files of ImageNet's typical size (around 500x375 pixels, ~80 kB)
and so a realistic decoding cost. Generation writes into a temporary folder and
renames it into place, so an interrupted or concurrent run never leaves a
half-made dataset behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from PIL import Image

from raytune_loader.errors import DatasetError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
DEFAULT_IMAGES = 2000
DEFAULT_CLASSES = 100
_SIZES = ((500, 375), (375, 500), (500, 333), (500, 400), (450, 350), (640, 480), (400, 300))
ProgressFn = Callable[[int, int], None]


def default_root(num_images: int) -> Path:
    """Where the default dataset of ``num_images`` files is generated (under
    ``$XDG_CACHE_HOME`` when set)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "raytune_loader" / f"synthetic-imagenet-{num_images}"


def _make_image(index: int, num_classes: int) -> tuple[str, bytes]:
    import io

    rng = np.random.default_rng(index)
    width, height = _SIZES[index % len(_SIZES)]
    label = index % num_classes
    tint = np.random.default_rng(10_000 + label).integers(40, 215, size=3)
    coarse = rng.integers(0, 255, size=(height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC))
    noise = rng.integers(-20, 21, size=(height, width, 3), dtype=np.int16)
    pixels = (smooth.astype(np.int16) // 2 + tint // 2 + noise).clip(0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return f"n{label:05d}/{index:06d}.JPEG", buffer.getvalue()


def _make_image_star(args: tuple[int, int]) -> tuple[str, bytes]:
    return _make_image(*args)


def _meta(root: Path) -> dict[str, int] | None:
    try:
        meta = json.loads((root / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _check_replaceable(root: Path, num_images: int) -> None:
    """Refuse to overwrite anything but an empty folder or an older copy of ours."""
    if root.exists() and not root.is_dir():
        raise DatasetError(f"{root} is a file, not a folder; pass an empty or new --data-root")
    if not root.exists() or not any(root.iterdir()):
        return
    meta = _meta(root)
    if meta is None:
        raise DatasetError(
            f"{root} exists and is not a synthetic-imagenet folder; "
            "pass an empty or new --data-root"
        )
    if meta.get("version") == FORMAT_VERSION and meta.get("images") != num_images:
        raise DatasetError(
            f"{root} holds a synthetic-imagenet of {meta.get('images')} images, not {num_images}; "
            f"pass --synthetic-images {meta.get('images')} or another --data-root"
        )


def ensure_synthetic_imagenet(
    root: Path,
    num_images: int = DEFAULT_IMAGES,
    num_classes: int = DEFAULT_CLASSES,
    processes: int = 1,
    progress: ProgressFn | None = None,
) -> Path:
    """Generate the dataset under ``root`` unless it is already there; returns ``root``."""
    meta = _meta(root)
    if meta and meta.get("version") == FORMAT_VERSION and meta.get("images") == num_images:
        return root
    _check_replaceable(root, num_images)
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        _generate(staging, num_images, num_classes, processes, progress)
        (staging / "meta.json").write_text(
            json.dumps({"version": FORMAT_VERSION, "images": num_images, "classes": num_classes})
        )
        if root.exists():
            shutil.rmtree(root)  # empty, or an older format of ours (checked above)
        os.replace(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("generated %d JPEG files under %s", num_images, root)
    return root


def _generate(
    staging: Path, num_images: int, num_classes: int, processes: int, progress: ProgressFn | None
) -> None:
    train = staging / "train"
    for label in range(min(num_classes, num_images)):
        (train / f"n{label:05d}").mkdir(parents=True, exist_ok=True)
    jobs = [(i, num_classes) for i in range(num_images)]
    every = max(1, num_images // 20)
    with get_context("spawn").Pool(max(1, processes)) as pool:
        for done, (name, data) in enumerate(pool.imap(_make_image_star, jobs, chunksize=16), 1):
            (train / name).write_bytes(data)
            if progress and (done % every == 0 or done == num_images):
                progress(done, num_images)

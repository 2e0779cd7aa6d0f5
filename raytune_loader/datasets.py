"""Dataset registry: from a ``--dataset`` name to a ``torch.utils.data.Dataset``.

Known names are the embedded ``synthetic-imagenet``, ImageFolder layouts
(``imagenet``, ``imagefolder``), torchvision's ``cifar10``, ``cifar100``,
``mnist`` and ``fashion-mnist``, and any ``package.module:function`` returning a
Dataset. A :class:`DatasetSpec` is small and picklable: every trial rebuilds its
dataset from it in its own process. Missing or empty data raises
:class:`DatasetError` saying how to get it.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch.utils.data import Dataset, Subset

from raytune_loader import synthetic
from raytune_loader.errors import CorruptSampleError, DatasetError, last_line
from raytune_loader.factories import import_factory

TRANSFER_KEYWORD = "transfer"  # a dataset factory that takes it opts into pipeline search
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SYNTHETIC = "synthetic-imagenet"
_IMAGE_FOLDERS = ("imagenet", "imagefolder")
_TORCHVISION = {
    "cifar10": "CIFAR10",
    "cifar100": "CIFAR100",
    "mnist": "MNIST",
    "fashion-mnist": "FashionMNIST",
}
KNOWN = (SYNTHETIC, *_IMAGE_FOLDERS, *_TORCHVISION)
IMAGE_FOLDERS = (SYNTHETIC, *_IMAGE_FOLDERS)


@dataclass(frozen=True)
class DatasetSpec:
    """What to load; rebuilt into a Dataset inside each trial."""

    name: str
    data_root: str | None = None
    download: bool = False
    synthetic_images: int = synthetic.DEFAULT_IMAGES

    def __post_init__(self) -> None:
        if self.name not in KNOWN and ":" not in self.name:
            raise DatasetError(
                f"unknown dataset {self.name!r}: use one of {', '.join(KNOWN)} "
                "or package.module:function returning a torch Dataset"
            )

    @property
    def slug(self) -> str:
        """Folder name for this dataset's results."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name).strip("-")

    def resolved_root(self) -> Path | None:
        if self.name == SYNTHETIC:
            if self.data_root:
                return Path(self.data_root)
            return synthetic.default_root(self.synthetic_images)
        return Path(self.data_root) if self.data_root else None


def imagenet_train_transform(
    transfer: str = "float32", decode: str = "pil"
) -> Callable[[Any], Any] | None:
    """The worker side of a pipeline variant. RandomResizedCrop(224) and a flip, then
    ``float32`` converts and normalizes (3 x 224 x 224 x 4 bytes a sample cross shared
    memory and the PCIe link), ``uint8`` stops at the uint8 tensor (a quarter of the
    bytes) for :func:`raytune_loader.pipeline.finish_on_device`. ``decode="pil"`` crops
    PIL images (torchvision's classic transforms); ``"tensor"`` crops the uint8
    tensor :mod:`raytune_loader.decoders` made (``transforms.v2``); ``"device"`` has no
    worker-side transform: the encoded bytes cross and
    :func:`raytune_loader.pipeline.decode_on_device` does the rest."""
    if decode == "device":
        return None
    if decode == "tensor":
        import torch
        from torchvision.transforms import v2

        steps = [v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()]
        if transfer == "uint8":
            return v2.Compose(steps)
        scale = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        return v2.Compose([*steps, *scale])
    from torchvision import transforms as T

    crop = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    if transfer == "uint8":
        return T.Compose([*crop, T.PILToTensor()])
    return T.Compose([*crop, T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def load_rgb(path: str) -> Image.Image:
    """ImageFolder loader whose error names the file it could not decode."""
    try:
        with open(path, "rb") as handle:
            return Image.open(handle).convert("RGB")
    except OSError as exc:  # PIL's UnidentifiedImageError and truncated files are OSErrors
        raise CorruptSampleError(f"corrupt sample {path}: {exc}") from None


def load_encoded(path: str) -> Any:
    """The file's bytes as a 1-D uint8 tensor, for decoding on the device."""
    with open(path, "rb") as handle:
        return torch.frombuffer(bytearray(handle.read()), dtype=torch.uint8)


def load_decoded(path: str) -> Any:
    """The image as an RGB uint8 (3, H, W) tensor (:mod:`raytune_loader.decoders`:
    libjpeg-turbo for JPEG; PNG, GIF and WebP too)."""
    from raytune_loader.decoders import decode_one

    try:
        return decode_one(load_encoded(path))
    except (RuntimeError, ValueError) as exc:  # torchvision.io raises the one, TorchCodec the other
        raise CorruptSampleError(f"corrupt sample {path}: {last_line(exc)}") from None


_LOADERS = {"pil": load_rgb, "tensor": load_decoded, "device": load_encoded}


def is_jpeg(path: str) -> bool:
    with open(path, "rb") as handle:
        return handle.read(3) == b"\xff\xd8\xff"


def _image_folder(
    root: Path, what: str, transfer: str = "float32", decode: str = "pil"
) -> Dataset[Any]:
    from torchvision.datasets import ImageFolder

    layout = f"{root}/<class>/<image>.JPEG"
    if not root.is_dir():
        raise DatasetError(
            f"{what}: folder {root} does not exist; expected the ImageFolder layout {layout} "
            "(pass the parent folder with --data-root)"
        )
    try:
        transform = imagenet_train_transform(transfer, decode)
        return ImageFolder(str(root), transform=transform, loader=_LOADERS[decode])
    except (FileNotFoundError, RuntimeError) as exc:
        raise DatasetError(
            f"{what}: no images under {root} ({exc}); expected the ImageFolder layout {layout}"
        ) from None


def _torchvision_dataset(spec: DatasetSpec) -> Dataset[Any]:
    import torchvision
    from torchvision import transforms as T

    if spec.data_root is None:
        raise DatasetError(f"{spec.name} needs --data-root (the folder torchvision stores it in)")
    small = spec.name in ("mnist", "fashion-mnist")
    steps: list[Any] = (
        [T.Grayscale(num_output_channels=3)]
        if small
        else [
            T.RandomCrop(32, padding=4),
            T.RandomHorizontalFlip(),
        ]
    )
    steps += [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    cls = getattr(torchvision.datasets, _TORCHVISION[spec.name])
    try:
        return cls(spec.data_root, train=True, download=spec.download, transform=T.Compose(steps))
    except (RuntimeError, OSError) as exc:  # missing files, or an offline --download
        raise DatasetError(
            f"{spec.name} not found under {spec.data_root} ({exc}); pass --download to fetch it "
            "(needs internet), or point --data-root at a folder that has it"
        ) from None


def _factory_dataset(spec: DatasetSpec, transfer: str = "float32") -> Dataset[Any]:
    factory = import_factory(spec.name, kind="dataset", error=DatasetError)
    params = inspect.signature(factory).parameters
    kwargs: dict[str, Any] = {"data_root": spec.data_root} if "data_root" in params else {}
    if TRANSFER_KEYWORD in params:
        kwargs[TRANSFER_KEYWORD] = transfer
    try:
        dataset = factory(**kwargs)
    except (OSError, ValueError, TypeError) as exc:
        raise DatasetError(f"{spec.name} failed to build the dataset: {exc}") from None
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise DatasetError(
            f"{spec.name} returned {type(dataset).__name__}, not a map-style torch Dataset "
            "(it needs __getitem__ and __len__)"
        )
    return dataset  # type: ignore[return-value]


def decodes(spec: DatasetSpec, cuda: bool) -> tuple[str, ...]:
    """Where this dataset's images may be decoded: the built-in image datasets in the
    workers by PIL or to tensors, and on a CUDA device with nvJPEG when its
    files are JPEGs; other datasets decode as their own code does."""
    if spec.name not in IMAGE_FOLDERS:
        return ("pil",)
    found = ("pil", "tensor")
    if not cuda:
        return found
    try:
        first = build_dataset(spec, "uint8", "device").samples[0][0]  # type: ignore[attr-defined]
    except DatasetError:
        return found
    return (*found, "device") if is_jpeg(first) else found


def pipeline_searchable(spec: DatasetSpec) -> bool:
    """Whether the search may choose how this dataset's pipeline is built: the built-in
    image datasets, and a factory that takes ``transfer=`` (it then returns uint8 image
    tensors for ``transfer="uint8"``, float32 normalized ones otherwise)."""
    if spec.name in IMAGE_FOLDERS:
        return True
    if spec.name in _TORCHVISION or ":" not in spec.name:
        return False
    factory = import_factory(spec.name, kind="dataset", error=DatasetError)
    return TRANSFER_KEYWORD in inspect.signature(factory).parameters


def build_dataset(
    spec: DatasetSpec, transfer: str = "float32", decode: str = "pil"
) -> Dataset[Any]:
    """The full dataset named by ``spec`` (the synthetic one must already exist), with
    the worker-side stages of ``transfer`` and ``decode`` where the dataset's pipeline
    is searched (``decode`` applies to the built-in image datasets)."""
    root = spec.resolved_root()
    if spec.name == SYNTHETIC:
        assert root is not None
        dataset = _image_folder(root / "train", "synthetic-imagenet", transfer, decode)
    elif spec.name == "imagenet":
        if root is None:
            raise DatasetError("imagenet needs --data-root pointing at a folder with train/")
        dataset = _image_folder(root / "train", "imagenet", transfer, decode)
    elif spec.name == "imagefolder":
        if root is None:
            raise DatasetError("imagefolder needs --data-root pointing at <class>/<image> folders")
        dataset = _image_folder(root, "imagefolder", transfer, decode)
    elif spec.name in _TORCHVISION:
        dataset = _torchvision_dataset(spec)
    else:
        dataset = _factory_dataset(spec, transfer)
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise DatasetError(f"dataset {spec.name} is empty")
    return dataset


@functools.lru_cache(maxsize=8)
def _built_in(spec: DatasetSpec, transfer: str, decode: str) -> Dataset[Any]:
    return build_dataset(spec, transfer, decode)


def dataset_for_trial(
    spec: DatasetSpec, transfer: str = "float32", decode: str = "pil"
) -> Dataset[Any]:
    """The dataset a measurement reads, kept across trials that Ray runs in one reused
    process: a built-in dataset is a stateless list of files or arrays (listing
    ImageNet's 1.28M files takes seconds); a user's factory is called every time,
    since its dataset may hold state that must not carry over to the next trial."""
    if spec.name in IMAGE_FOLDERS or spec.name in _TORCHVISION:
        return _built_in(spec, transfer, decode)
    return build_dataset(spec, transfer, decode)


def num_classes(dataset: Dataset[Any]) -> int:
    """Classes for the model's head; 1000 when the dataset does not say."""
    base = dataset.dataset if isinstance(dataset, Subset) else dataset
    classes = getattr(base, "classes", None)
    return len(classes) if classes else 1000


def sample_files(dataset: Dataset[Any], indices: list[int]) -> list[str]:
    """Files behind the given samples, for datasets that read files (ImageFolder)."""
    samples = getattr(dataset, "samples", None)
    if not samples:
        return []
    return [samples[i][0] for i in indices]


def prewarm(files: list[str]) -> int:
    """Read each file once so every trial starts with the same page-cache state."""
    total = 0
    for name in files:
        with open(name, "rb") as handle:
            while chunk := handle.read(1 << 20):
                total += len(chunk)
    return total


def check_sample(dataset: Dataset[Any]) -> None:
    """Samples must be (input, target) pairs; a sample that fails to load is left to the
    trials, which record the reason."""
    try:
        sample = dataset[0]
    except Exception:  # noqa: BLE001 - the trials report it with its reason
        return
    if not isinstance(sample, (tuple, list)) or len(sample) < 2:
        raise DatasetError(
            f"samples must be (input, target) pairs; sample 0 is {type(sample).__name__}: "
            "wrap the dataset so __getitem__ returns (input, target), or train it with "
            "your own --train-step"
        )

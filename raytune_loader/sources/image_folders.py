"""Folders of image files in the ImageFolder layout (``<class>/<image>``).

``synthetic-imagenet``, the embedded default, generated on first use;
``imagenet``, the ``train/`` folder of an ImageNet copy; ``imagefolder``, any such
folder. The whole pipeline is searched: where JPEGs are decoded (PIL or tensors in
the workers, or nvJPEG on a CUDA device when the files are JPEGs), the dtype that
crosses to the device, thread workers.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image
from torch.utils.data import Dataset

from raytune_loader.errors import CorruptSampleError, DatasetError, StoreRefusedError, last_line
from raytune_loader.pipeline.transforms import imagenet_train_transform
from raytune_loader.sources import synthetic
from raytune_loader.sources.base import Source, Spec
from raytune_loader.sources.remote_folder import RemoteImageFolder, listing
from raytune_loader.stores.store import Store, StoreOptions
from raytune_loader.stores.url import StoreUrl, is_remote, parse

if TYPE_CHECKING:
    from raytune_loader.progress import Progress


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
    """The image as an RGB uint8 (3, H, W) tensor (:mod:`raytune_loader.pipeline.decoders`:
    libjpeg-turbo for JPEG; PNG, GIF and WebP too)."""
    from raytune_loader.pipeline.decoders import decode_one

    try:
        return decode_one(load_encoded(path))
    except (RuntimeError, ValueError) as exc:  # torchvision.io raises the one, TorchCodec the other
        raise CorruptSampleError(f"corrupt sample {path}: {last_line(exc)}") from None


LOADERS = {"pil": load_rgb, "tensor": load_decoded, "device": load_encoded}


def is_jpeg(path: str) -> bool:
    """Whether the file starts as a JPEG does (the device decoder reads JPEG only)."""
    with open(path, "rb") as handle:
        return handle.read(3) == b"\xff\xd8\xff"


# folder names that are a dataset's splits: an ImageFolder root with these alone is the
# folder above the one that holds the classes
SPLITS = frozenset({"train", "training", "val", "valid", "validation", "test", "testing"})


class ImageFolders(Source):
    """One ImageFolder layout: under the data root itself or its ``subfolder``."""

    def __init__(self, name: str, summary: str, subfolder: str = "") -> None:
        self.names = (name,)
        self.summary = summary
        self.subfolder = subfolder

    def folder(self, spec: Spec) -> Path:
        """The folder of ``<class>/<image>`` files (a DatasetError without ``--data-root``)."""
        root = self.root(spec)
        if root is None:
            where = f"a folder with {self.subfolder}/" if self.subfolder else "<class>/<image>"
            raise DatasetError(f"{spec.name} needs --data-root pointing at {where}")
        return root / self.subfolder if self.subfolder else root

    def remote(self, spec: Spec) -> StoreUrl | None:
        """The folder's URL where ``--data-root`` names an object store, else None."""
        if not is_remote(spec.data_root):
            return None
        return parse(str(spec.data_root)).child(self.subfolder)

    def build(self, spec: Spec, transfer: str = "float32", decode: str = "pil") -> Dataset:
        from torchvision.datasets import ImageFolder

        url = self.remote(spec)
        if url is not None:  # listed once in this process, read object by object
            options = StoreOptions.from_pairs(spec.storage_options)
            try:
                found_remote = listing(url, options)
            except StoreRefusedError:
                raise
            except DatasetError as exc:  # an empty prefix: the split named twice?
                root = parse(str(spec.data_root))
                last = root.prefix.rstrip("/").rpartition("/")
                if not self.subfolder or last[2] != self.subfolder:
                    raise
                parent = root.of(last[0]).rstrip("/")
                raise DatasetError(
                    f"{exc}; {spec.name} reads --data-root/{self.subfolder}: pass {parent} "
                    "with --data-root"
                ) from None
            return RemoteImageFolder(found_remote, options, transfer, decode)
        folder = self.folder(spec)
        layout = f"{folder}/<class>/<image>" + (".JPEG" if self.subfolder else "")
        if not folder.is_dir():
            what = "is a file, not a folder" if folder.exists() else "does not exist"
            held = f"{self.subfolder}/" if self.subfolder else "the class folders"
            holder = f"the folder that holds {held}"
            raise DatasetError(
                f"{spec.name}: folder {folder} {what}; expected the ImageFolder "
                f"layout {layout} (pass {holder} with --data-root)"
            )
        try:
            transform = imagenet_train_transform(transfer, decode)
            found = ImageFolder(str(folder), transform=transform, loader=LOADERS[decode])
        except (FileNotFoundError, RuntimeError) as exc:
            raise DatasetError(
                f"{spec.name}: no images under {folder} ({exc}); expected the ImageFolder "
                f"layout {layout}"
            ) from None
        if set(found.classes) <= SPLITS:  # ImageFolder reads a split's subfolders as one class
            split = "train" if "train" in found.classes else found.classes[0]
            raise DatasetError(
                f"{spec.name}: the class folders of {folder} are {', '.join(found.classes)}: "
                f"a dataset's splits, not its classes; pass the folder that holds the class "
                f"folders, such as {folder / split}, with --data-root"
            )
        return found

    def accesses(self, spec: Spec) -> tuple[str, ...]:
        return ("map",)

    def ray_data_reads(self, spec: Spec) -> bool:
        return True  # the (file, class) rows of the trial's subset; a bucket's, by index

    def pipeline_searched(self, spec: Spec) -> bool:
        return True

    def fetches(self, spec: Spec) -> bool:
        return self.remote(spec) is not None

    def describe(self, spec: Spec) -> dict[str, Any]:
        """The source, and for a bucket its store: scheme, bucket, endpoint host, region."""
        found = super().describe(spec)
        url = self.remote(spec)
        if url is not None:
            options = StoreOptions.from_pairs(spec.storage_options)
            found["store"] = Store(url, options).describe()
        return found

    def decoders(self, spec: Spec, cuda: bool) -> tuple[str, ...]:
        """PIL or tensors in the workers; nvJPEG on a CUDA device when the files are
        JPEGs (the first one is looked at)."""
        found = ("pil", "tensor")
        if not cuda:
            return found
        url = self.remote(spec)
        if url is not None:  # the first key's name says JPEG: its bytes cost a request
            first = listing(url, StoreOptions.from_pairs(spec.storage_options)).samples[0][0]
            return (*found, "device") if first.lower().endswith((".jpg", ".jpeg")) else found
        try:
            first = self.build(spec, "uint8", "device").samples[0][0]  # type: ignore[attr-defined]
        except DatasetError:
            return found
        return (*found, "device") if is_jpeg(first) else found

    def files(self, dataset: Dataset, indices: list[int]) -> list[str]:
        samples = getattr(dataset, "samples", None) or []
        return [samples[i][0] for i in indices] if samples else []


class SyntheticImageNet(ImageFolders):
    """The embedded default: real JPEG files, generated once into a cache folder."""

    def root(self, spec: Spec) -> Path | None:
        if spec.data_root:
            return Path(spec.data_root)
        return synthetic.default_root(spec.synthetic_images)

    def prepare(self, spec: Spec, progress: Progress) -> None:
        from raytune_loader.machine import hardware

        if is_remote(spec.data_root):
            raise DatasetError(
                f"synthetic-imagenet is generated on this machine, not in {spec.data_root}: "
                "upload it and search it with --dataset imagenet --data-root "
                f"{spec.data_root}"
            )

        root = self.root(spec)
        assert root is not None  # a synthetic spec always resolves to a folder
        progress.stage(f"Synthetic ImageNet: {spec.synthetic_images} JPEG files in {root}")
        synthetic.ensure_synthetic_imagenet(
            root,
            spec.synthetic_images,
            processes=hardware.usable_cpus(),
            progress=lambda done, total: progress.count("generating JPEG files", done, total),
        )


SYNTHETIC = SyntheticImageNet(
    "synthetic-imagenet",
    "real JPEG files of ImageNet-like sizes, generated on first use",
    subfolder="train",
)
SOURCES = (
    SYNTHETIC,
    ImageFolders("imagenet", "the ImageFolder layout under --data-root/train", "train"),
    ImageFolders("imagefolder", "--data-root/<class>/<image>"),
)

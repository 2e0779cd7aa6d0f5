"""The data-source registry: what each kind of source says it can do, the command line
and the errors listing from the registry, and a new source added in one place."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from raytune_loader import sources
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import DatasetError
from raytune_loader.loaders.shard_stream import StreamVariant
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.measuring.measure import run_trial
from raytune_loader.measuring.prepare import prepare_data
from raytune_loader.search import get_args_parser
from raytune_loader.sources import registry
from raytune_loader.sources.base import Source
from raytune_loader.sources.datasets import DatasetSpec, build_dataset, dataset_for_trial

REPO = Path(__file__).parent.parent


def test_the_command_line_help_and_the_readme_list_every_registered_dataset() -> None:
    help_text = next(a.help for a in get_args_parser()._actions if "--dataset" in a.option_strings)
    readme = (REPO / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `--dataset NAME`"))
    for name in sources.names():
        assert name in help_text
        assert f"`{name}`" in row or name == "package.module:function", name


def test_an_unknown_dataset_is_one_line_listing_the_registry() -> None:
    with pytest.raises(DatasetError) as caught:
        DatasetSpec("imagenet-22k")
    assert "\n" not in str(caught.value)
    assert all(name in str(caught.value) for name in sources.names())


def test_image_folders_offer_the_device_decoder_only_with_cuda_and_jpeg_files(
    tiny_imagenet: Path, tmp_path: Path
) -> None:
    spec = DatasetSpec("synthetic-imagenet", str(tiny_imagenet))
    assert spec.source.pipeline_searched(spec)
    assert spec.source.decoders(spec, cuda=False) == ("pil", "tensor")
    assert spec.source.decoders(spec, cuda=True) == ("pil", "tensor", "device")
    pngs = tmp_path / "pngs" / "a"
    pngs.mkdir(parents=True)
    from PIL import Image

    Image.new("RGB", (40, 30)).save(pngs / "one.png")
    folder = DatasetSpec("imagefolder", str(tmp_path / "pngs"))
    assert folder.source.decoders(folder, cuda=True) == ("pil", "tensor")


def test_what_each_kind_of_source_says_it_can_do(tiny_imagenet: Path) -> None:
    images = DatasetSpec("synthetic-imagenet", str(tiny_imagenet))
    dataset = build_dataset(images)
    files = images.source.files(dataset, [0, 5])
    assert len(files) == 2 and all(Path(f).suffix == ".JPEG" for f in files)
    assert images.source.num_classes(dataset) == 8 and images.source.cached
    cifar = DatasetSpec("cifar10", "/nowhere")
    assert not cifar.source.pipeline_searched(cifar) and cifar.source.decoders(cifar, True) == (
        "pil",
    )
    mine = DatasetSpec("datasets_for_tests:images_with_transfer")
    assert mine.source.pipeline_searched(mine) and not mine.source.cached
    plain = DatasetSpec("datasets_for_tests:fast")
    assert not plain.source.pipeline_searched(plain)
    assert plain.source.files(build_dataset(plain), [0]) == []  # nothing to pre-warm


class _Squares(Dataset):
    def __init__(self, transfer: str) -> None:
        self.transfer = transfer

    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.full((3, 8, 8), index % 256, dtype=torch.uint8)
        return (image if self.transfer == "uint8" else image.float() / 255), index % 3


class Squares(Source):
    """A new format, as a user of the registry would add one."""

    names = ("squares",)
    summary = "grey squares"
    prepared: list[str] = []

    def prepare(self, spec: DatasetSpec, progress: object) -> None:
        self.prepared.append(spec.name)

    def build(self, spec: DatasetSpec, transfer: str = "float32", decode: str = "pil") -> Dataset:
        return _Squares(transfer)

    def pipeline_searched(self, spec: DatasetSpec) -> bool:
        return True

    def accesses(self, spec: DatasetSpec) -> tuple[str, ...]:
        return ("map",)

    def decoders(self, spec: DatasetSpec, cuda: bool) -> tuple[str, ...]:
        return ("pil",)

    def files(self, dataset: Dataset, indices: list[int]) -> list[str]:
        return []

    def ray_data_reads(self, spec: DatasetSpec) -> bool:
        return False

    def num_classes(self, dataset: Dataset) -> int:
        return 3


def test_a_source_that_leaves_out_what_every_source_answers_is_refused_naming_it() -> None:
    """The contract fails loudly where it once answered a default for a forgotten
    method: the decoders ("pil",), the pipeline not searched, no files, no Ray Data."""

    class Forgetful(Source):
        names = ("forgetful",)

        def accesses(self, spec: DatasetSpec) -> tuple[str, ...]:
            return ("stream",)

    with pytest.raises(TypeError) as refused:
        Forgetful()  # type: ignore[abstract]
    for method in ("decoders", "files", "pipeline_searched", "ray_data_reads"):
        assert method in str(refused.value)

    class StreamWithoutShards(Squares):
        def accesses(self, spec: DatasetSpec) -> tuple[str, ...]:
            return ("stream",)

    spec = DatasetSpec("synthetic-imagenet")  # any spec: the source refuses before reading it
    said = r"StreamWithoutShards\.shards: a source read as a stream \(accesses 'stream'\)"
    with pytest.raises(NotImplementedError, match=said):
        StreamWithoutShards().shards(spec)
    with pytest.raises(NotImplementedError, match="build_stream"):
        StreamWithoutShards().build_stream(spec, [], StreamVariant())


def test_a_new_source_is_one_class_and_one_registry_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registered, it is a --dataset name, prepared, built with the pipeline variant's
    worker side, searched, and trained on, with no other module touched."""
    source = Squares()
    monkeypatch.setattr(registry, "REGISTRY", (source, *registry.REGISTRY))
    spec = DatasetSpec("squares")
    assert "squares (grey squares)" in sources.help_text()
    job = TrialJob(dataset=spec, model="small-cnn", node_cpus=2, samples_per_trial=32,
                   segment=SegmentSpec(warmup_steps=1, steps=2, report_every=1))  # fmt: skip
    assert prepare_data(job, 8) == job and source.prepared == ["squares"]
    assert dataset_for_trial(spec, "uint8")[1][0].dtype == torch.uint8
    outcome = run_trial(job, LoaderConfig(8, num_workers=1, workers="thread", transfer="uint8"))
    assert outcome.failure is None, outcome.detail
    assert outcome.metrics is not None and outcome.metrics.samples == 2 * 8

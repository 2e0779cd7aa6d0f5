"""The pipeline around the DataLoader: where JPEGs are decoded, the batches' dtype on
the way to the device, and the device-side stages, in every variant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from raytune_loader import load_best_config
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import CorruptSampleError
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.pipeline.device import (
    EncodedBatch,
    collate_encoded,
    finish_on_device,
    normalize,
    to_device,
)
from raytune_loader.pipeline.transforms import IMAGENET_STD
from raytune_loader.sources.datasets import DatasetSpec, build_dataset

TOLERANCE = 1e-5  # the same decoder (PIL) on both sides: only float rounding differs
# PIL and TorchCodec (or torchvision.io) both decode with libjpeg-turbo; PIL's resize and
# transforms.v2's antialiased bilinear one round differently: at most 1 level of 255
# apart, on about 3% of the values (37,195 of 1.2M over these 8 synthetic JPEGs).
# nvJPEG on a GPU decodes differently again: experiments/gpu_check.sh measures it.
LEVEL = 1 / 255 / min(IMAGENET_STD)  # one uint8 level after normalization


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


def test_normalize_makes_one_buffer_and_leaves_the_batch_as_it_was() -> None:
    """The step's normalization works in place on the one float32 buffer it makes, with
    the arithmetic of (x / 255 - mean) / std bit for bit, in either memory format; the
    uint8 batch it reads is unchanged."""
    from raytune_loader.pipeline.device import _statistics

    batch = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    mean, std = _statistics(batch.device)
    for images in (batch, batch.contiguous(memory_format=torch.channels_last)):
        kept = images.clone()
        made = normalize(images)
        assert torch.equal(made, (images.float() / 255 - mean) / std)
        assert torch.equal(images, kept) and made.data_ptr() != images.data_ptr()
        assert made.is_contiguous(memory_format=torch.channels_last) == (images is not batch)
    floats = batch.float()
    assert normalize(floats).data_ptr() != floats.data_ptr()  # a float batch is not written


@pytest.mark.parametrize(
    ("transfer", "decode"),
    [("float32", "tensor"), ("uint8", "tensor"), ("uint8", "device")],
)
def test_every_decoder_gives_the_same_augmented_tensor(
    tiny_imagenet: Path, transfer: str, decode: str
) -> None:
    """The crop box and the flip come from the same random draws in every variant (the
    seed fixes them): after the device-side stages (decode on the device runs here on
    the CPU, the call nvJPEG gets on CUDA), the images match PIL's within one level."""
    spec = DatasetSpec("synthetic-imagenet", str(tiny_imagenet))
    reference, variant = (
        build_dataset(spec, "float32", "pil"),
        build_dataset(spec, transfer, decode),
    )
    config = LoaderConfig(batch_size=1, transfer=transfer, decode=decode)
    collate = collate_encoded if decode == "device" else torch.utils.data.default_collate
    off_by_one = 0
    for index in range(8):
        torch.manual_seed(index)
        expected, label = reference[index]
        torch.manual_seed(index)
        batch = collate([variant[index]])
        images, labels = to_device(
            batch, torch.device("cpu"), transfer=config.transfer, decode=config.decode
        )
        assert images.shape == (1, 3, 224, 224) and images.dtype == torch.float32
        assert labels.tolist() == [label]
        difference = (images[0] - expected).abs()
        assert difference.max() <= LEVEL * 1.01
        off_by_one += int((difference > TOLERANCE).sum())
    assert off_by_one / (8 * 3 * 224 * 224) < 0.05


def test_decoding_on_the_device_keeps_the_jpegs_apart_until_then(
    tiny_imagenet: Path, tmp_path: Path
) -> None:
    """The workers only read files; a batch's JPEGs, of different lengths, cross as one
    tensor, and a whole batch becomes (N, 3, 224, 224) images in one decode call."""
    spec = DatasetSpec("synthetic-imagenet", str(tiny_imagenet))
    config = LoaderConfig(batch_size=4, num_workers=1, decode="device", transfer="uint8")
    loader = build_dataloader(build_dataset(spec, "uint8", "device"), config, seed=0)
    encoded, labels = next(iter(loader))
    assert isinstance(encoded, EncodedBatch) and labels.shape == (4,)
    files = encoded.files()
    assert len(files) == 4 and encoded.data.dim() == 1 and encoded.data.dtype == torch.uint8
    assert len({f.numel() for f in files}) > 1  # JPEGs of different lengths
    assert all(bytes(f[:3].tolist()) == b"\xff\xd8\xff" for f in files)  # each a whole JPEG
    images, same = to_device([encoded, labels], torch.device("cpu"), transfer="uint8",
                             decode="device", channels_last=True)  # fmt: skip
    assert images.shape == (4, 3, 224, 224) and images.dtype == torch.float32
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(same, labels)


def test_a_png_named_jpeg_is_decoded_on_the_cpu_not_lost(tiny_imagenet: Path) -> None:
    """ImageNet's train set has a PNG named .JPEG: the device's JPEG decoder refuses it,
    the batch is decoded file by file, and that file on the CPU."""
    from io import BytesIO

    from PIL import Image

    spec = DatasetSpec("synthetic-imagenet", str(tiny_imagenet))
    dataset = build_dataset(spec, "uint8", "device")
    png = BytesIO()
    Image.new("RGB", (300, 260), (200, 30, 30)).save(png, format="PNG")
    samples = [dataset[0], (torch.frombuffer(bytearray(png.getvalue()), dtype=torch.uint8), 7)]
    images, labels = to_device(collate_encoded(samples), torch.device("cpu"), transfer="uint8",
                               decode="device")  # fmt: skip
    assert images.shape == (2, 3, 224, 224) and labels.tolist() == [dataset[0][1], 7]
    red = images[1, 0].mean() > images[1, 1].mean()  # the PNG's red survived, normalized
    assert red
    garbage = (torch.tensor(list(b"not an image"), dtype=torch.uint8), 1)
    with pytest.raises(CorruptSampleError, match="image 1 of this batch failed to decode"):
        to_device(collate_encoded([dataset[0], garbage]), torch.device("cpu"), decode="device",
                  transfer="uint8")  # fmt: skip


OOM_AS_RUNTIME_ERROR = (
    "Error while decoding JPEG images: CUDA out of memory. Tried to allocate 2.00 GiB"
)


def _decoder_short_of_memory(monkeypatch: pytest.MonkeyPatch, most: int) -> list[int]:
    """Swap in a device decoder that, like torchvision's batched CUDA one, re-raises
    running out of memory as a plain RuntimeError, on calls of more than ``most`` files;
    returns the sizes of the calls it got."""
    from raytune_loader.pipeline import decoders

    name, decode_jpeg, decode_image = decoders._backend()
    calls: list[int] = []

    def decode(files: list[torch.Tensor], mode: object, device: torch.device) -> object:
        calls.append(len(files))
        if len(files) > most:
            raise RuntimeError(OOM_AS_RUNTIME_ERROR)
        return decode_jpeg(files, mode=mode, device=device)

    monkeypatch.setattr(decoders, "_backend", lambda: (name, decode, decode_image))
    return calls


def test_out_of_memory_in_device_decode_is_out_of_memory_not_a_corrupt_file(
    tiny_imagenet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _decoder_short_of_memory(monkeypatch, most=0)
    dataset = build_dataset(
        DatasetSpec("synthetic-imagenet", str(tiny_imagenet)), "uint8", "device"
    )
    batch = collate_encoded([dataset[0], dataset[1]])
    with pytest.raises(torch.cuda.OutOfMemoryError, match="CUDA out of memory"):
        to_device(batch, torch.device("cpu"), transfer="uint8", decode="device")
    assert calls == [2]  # no retry file by file: the batch size is the cause


def test_out_of_memory_in_device_decode_reaches_the_trial_s_back_off(
    tiny_imagenet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raytune_loader.measuring.job import SegmentSpec, TrialJob
    from raytune_loader.measuring.measure import run_trial

    calls = _decoder_short_of_memory(monkeypatch, most=4)
    job = TrialJob(
        dataset=DatasetSpec("synthetic-imagenet", str(tiny_imagenet)), model="small-cnn",
        segment=SegmentSpec(warmup_steps=1, steps=2, report_every=1), samples_per_trial=32,
        node_cpus=2,
    )  # fmt: skip
    outcome = run_trial(job, LoaderConfig(8, decode="device", transfer="uint8"))
    assert outcome.failure is None, outcome.detail
    assert (outcome.effective_batch_size, outcome.oom_backoffs) == (4, 1)
    assert calls[0] == 8 and set(calls[1:]) == {4}  # halved, never decoded one by one


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
    spec = DatasetSpec(name)
    assert spec.source.pipeline_searched(spec) is searched


@pytest.mark.parametrize(
    "pipeline",
    [
        # the first files with a pipeline section described it in words: still read
        {"transfer": "uint8", "decode": "cpu", "workers": "process"},
        {"transfer": "float32", "decode": "tensor", "workers": "thread"},
        {"transfer": "uint8", "decode": "device", "workers": "process"},
    ],
)
def test_a_training_loop_with_the_tuned_pipeline(
    tiny_imagenet: Path, tmp_path: Path, pipeline: dict
) -> None:
    """The README's loop: the dataset, the loader and the device-side stages in 3 lines,
    for processes and threads, and for decoding in the workers or on the device."""
    threads = pipeline["workers"] == "thread"
    loader = {
        "batch_size": 8,
        "num_workers": 2,
        "prefetch_factor": 2,
        "pin_memory": False,
        "persistent_workers": not threads,
        "in_order": False,
        "multiprocessing_context": None,
    }
    best = {
        "schema_version": 1, "dataset": "synthetic-imagenet", "model": "small-cnn",
        "objective": "util", "loader": loader, "metrics": {}, "baselines": {}, "speedup": {},
        "hardware": {}, "search": {}, "created": "2026-01-01T00:00:00+00:00",
        "pipeline": {**pipeline, "in_order": False, "start_method": "default"},
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
    assert tuned.loader.in_order is False and tuned.loader.workers == pipeline["workers"]
    assert tuned.loader.decode == {"cpu": "pil"}.get(pipeline["decode"], pipeline["decode"])


@pytest.mark.parametrize("channels_last", [True, False, None])
def test_to_device_keeps_the_memory_format_the_search_measured(
    tmp_path: Path, channels_last: bool | None
) -> None:
    """A search that trained channels-last hands out channels-last batches; a file
    without a job section (older) leaves the layout alone."""
    best = {
        "schema_version": 1, "dataset": "synthetic-imagenet", "model": "small-cnn",
        "objective": "util", "loader": {"batch_size": 2}, "metrics": {}, "baselines": {},
        "speedup": {}, "hardware": {}, "search": {}, "created": "2026-01-01T00:00:00+00:00",
        "pipeline": {"transfer": "uint8", "decode": "tensor", "workers": "process"},
    }  # fmt: skip
    if channels_last is not None:
        best["job"] = {"channels_last": channels_last}
    (tmp_path / "best_config.json").write_text(json.dumps(best))
    batch = [torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8), torch.tensor([0, 1])]
    images, _ = load_best_config(tmp_path / "best_config.json").to_device(batch, "cpu")
    assert images.dtype == torch.float32
    assert images.is_contiguous(memory_format=torch.channels_last) is bool(channels_last)

"""Files a search leaves behind and the API that reads them back.

``best_config.json`` (schema version 1, contract in docs/best_config.md), ``trials.csv``
and the report are written atomically (temporary file, then rename), so a
second search on the same dataset never leaves a half-written result.
:func:`load_best_config` validates a JSON file, never evaluates it, and returns
a :class:`BestConfig` whose :meth:`~BestConfig.dataloader` builds the tuned
DataLoader, warning when the machine differs from the one it was tuned on.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset

from raytune_loader.errors import ConfigError, OutputError
from raytune_loader.loader import build_dataloader
from raytune_loader.raydata import RayDataConfig
from raytune_loader.space import PIPELINE_KEYS, WORKER_KEYS, LoaderConfig

if TYPE_CHECKING:
    import ray.data

SCHEMA_VERSION = 1
REQUIRED_KEYS = (
    "schema_version", "dataset", "model", "objective", "loader", "metrics",
    "baselines", "speedup", "hardware", "search", "created",
)  # fmt: skip


class HardwareMismatchWarning(UserWarning):
    """The config was tuned on a machine unlike this one; re-run the search or the bench."""


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the new, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ensure_writable(folder: Path) -> None:
    """Fail before the search, not after it, when results cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise OutputError(
            f"cannot write results to {folder} ({exc.strerror or exc}); choose another --out"
        ) from None


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in columns})
    atomic_write_text(path, buffer.getvalue())


@dataclass(frozen=True)
class BestConfig:
    """A validated best_config.json."""

    path: Path
    loader: LoaderConfig
    data: dict[str, Any]
    raydata: RayDataConfig | None = None  # the best verified Ray Data candidate, if any

    @property
    def hardware(self) -> dict[str, Any]:
        return self.data["hardware"]

    @property
    def engine(self) -> str:
        """What was chosen: ``dataloader`` (:meth:`dataloader`) or ``raydata``
        (:meth:`raydata_dataset`)."""
        return str(self.data.get("engine", "dataloader"))

    def raydata_dataset(
        self, data_root: str | os.PathLike[str] | None = None, *, seed: int = 0
    ) -> ray.data.Dataset:
        """The tuned Ray Data pipeline over the search's dataset (under ``data_root``
        on this machine, or where the search read it; image folders, webdataset shards,
        Parquet tables or a map-style dataset, read as a trial read it,
        :func:`raytune_loader.raydata.rows_of`): a Ray Dataset whose actors make each
        sample as the search measured (one epoch per iteration, each sample once, in a
        new order every epoch). Pass it to Ray Train (``datasets=``) and read each
        worker's part with :meth:`iteration_arguments`, or iterate it in a plain loop;
        :meth:`raydata_to_device` finishes a batch."""
        from raytune_loader import raydata

        config = self._raydata_config()
        # the source built with the Ray Data pipeline's variant, as a trial builds it
        rows = raydata.rows_of(self._dataset(data_root, config.source_variant(self.loader.access)))
        return raydata.build_dataset(rows, config, seed=seed)

    def iteration_arguments(self, device: str = "cpu") -> dict[str, Any]:
        """``iter_torch_batches``' keyword arguments for the tuned Ray Data pipeline
        (``get_dataset_shard("train").iter_torch_batches(**...)`` in Ray Train): the
        batch size, the prefetch, the collate that gives the DataLoader path's batch;
        ``device="cpu"`` leaves it on the host for :meth:`raydata_to_device`."""
        from raytune_loader import raydata

        return raydata.iteration_arguments(self._raydata_config(), device=device)

    def raydata_to_device(self, batch: Any, device: str | torch.device) -> Any:
        """A batch of :meth:`raydata_dataset` on ``device``, the Ray Data pipeline's
        device-side stages done (as :meth:`to_device` for the DataLoader)."""
        from raytune_loader.pipeline import to_device

        config = self._raydata_config()
        return to_device(
            batch, torch.device(device), transfer=config.transfer, decode=config.decode,
            channels_last=bool((self.data.get("job") or {}).get("channels_last")),
        )  # fmt: skip

    def _raydata_config(self) -> RayDataConfig:
        if self.raydata is None:
            raise ConfigError(
                f"{self.path} has no raydata section: the search offered no Ray Data "
                "candidate (search again with --ray-data, or on a cluster with CPU nodes)"
            )
        return self.raydata

    def dataloader(self, dataset: Dataset[Any], **overrides: Any) -> DataLoader[Any] | Any:
        """The tuned loader over ``dataset`` (``overrides`` win, or are refused in one
        line): a DataLoader, or a loader with a DataLoader's attributes (thread workers,
        a stream). In a process group each rank reads its own shard of every epoch, in
        Lightning, accelerate, Ray Train or a DDP loop; over a stream every rank reads
        the same number of batches (docs/streams.md). ``loader.sampler.set_epoch(e)``
        reshuffles; ``state_dict``/``load_state_dict`` resume an epoch mid-way."""
        self.warn_if_other_machine()
        overrides.setdefault("drop_last", False)
        return build_dataloader(dataset, self.loader, **overrides)

    def image_dataset(self, root: str | os.PathLike[str]) -> Dataset[Any]:
        """The built-in image dataset (ImageFolder layout: ``root/<class>/<image>``) with
        the chosen pipeline's worker-side stages: RandomResizedCrop(224) and a flip, then
        float32 normalized, or uint8 for :meth:`to_device` to finish on the device."""
        from raytune_loader.datasets import DatasetSpec, build_dataset

        spec = DatasetSpec("imagefolder", str(root))
        return build_dataset(spec, self.loader.transfer, self.loader.decode)

    def dataset(self, data_root: str | os.PathLike[str] | None = None) -> Dataset[Any]:
        """The tuned dataset, for training: the search's dataset (under ``data_root``
        on this machine, or where the search read it) with the chosen pipeline's
        worker side. A stream (webdataset, a Hugging Face dataset read as one) covers
        all its shards (their samples counted here), split by rank and loader worker,
        shuffled with the recorded buffer and batched in the workers where that was
        chosen; feed it to :meth:`dataloader`, which passes it its batch size and the
        rank. Its order depends on the seed (0; ``dataloader(..., seed=n)`` for another)
        and the epoch, the same on every rank."""
        return self._dataset(data_root, self.loader)

    def _dataset(
        self, data_root: str | os.PathLike[str] | None, loader: LoaderConfig
    ) -> Dataset[Any]:
        from raytune_loader.datasets import DatasetSpec
        from raytune_loader.sources.base import StreamVariant
        from raytune_loader.streams import shuffle_buffer

        recorded = (self.data.get("search") or {}).get("dataset_spec")
        if not isinstance(recorded, dict) or "name" not in recorded:
            raise ConfigError(f"{self.path} does not say which dataset was searched; re-run it")
        root = str(data_root) if data_root is not None else recorded.get("data_root")
        spec = DatasetSpec(**{**recorded, "data_root": root})
        if loader.access != "stream":
            return spec.source.build(spec, loader.transfer, loader.decode)
        source = self.data.get("source") or {}
        variant = StreamVariant(
            transfer=loader.transfer,
            decode=loader.decode,
            batch_size=loader.batch_size if loader.batching == "workers" else None,
            shuffle_buffer=int(source.get("shuffle_buffer", shuffle_buffer(spec))),
            seed=None,  # 0: every rank must draw the same order; the loader's seed= wins
        )
        return spec.source.build_stream(spec, [], variant)

    def to_device(self, batch: Any, device: str | torch.device) -> Any:
        """A batch from :meth:`dataloader` on ``device``, with the chosen pipeline's
        device-side stages done: JPEGs decoded, cropped and flipped there with
        ``decode="device"``; uint8 images converted and normalized there; image batches
        in channels-last memory format when the search measured them so. Call it after
        a trainer's own device move (Lightning's ``on_after_batch_transfer``, after
        accelerate's or Ray Train's loader), or in place of it."""
        from raytune_loader.pipeline import to_device

        return to_device(
            batch, torch.device(device), transfer=self.loader.transfer,
            decode=self.loader.decode, non_blocking=self.loader.pin_memory,
            channels_last=bool((self.data.get("job") or {}).get("channels_last")),
        )  # fmt: skip

    def warn_if_other_machine(self, current: dict[str, Any] | None = None) -> list[str]:
        """Warn (and return the differences) when this machine is not the tuned one."""
        if current is None:
            from raytune_loader.hardware import cpu_and_gpu_summary

            current = cpu_and_gpu_summary()
        diffs = [
            f"{key}: tuned on {self.hardware.get(key)!r}, here {current[key]!r}"
            for key in ("cpu_model", "usable_cpus", "gpu_name", "gpu_count")
            if key in current and self.hardware.get(key) != current[key]
        ]
        if diffs:
            warnings.warn(
                f"{self.path} was tuned on another machine ({'; '.join(diffs)}); "
                "check it with `python -m raytune_loader.bench --config "
                f"{self.path}` or re-run the search",
                HardwareMismatchWarning,
                stacklevel=3,
            )
        return diffs


# the first files with a pipeline section described it in words: "cpu" was PIL in the
# workers, "main process" a loader without workers
_LEGACY = {"cpu": "pil", "main process": "process"}


def config_from_sections(
    loader: dict[str, Any] | None,
    pipeline: dict[str, Any] | None = None,
    worker_init: dict[str, Any] | None = None,
    raydata: dict[str, Any] | None = None,
) -> LoaderConfig:
    """The configuration a JSON ``loader``, ``pipeline`` and ``worker_init`` section
    describe (baselines have neither of the last two: the default pipeline, and workers
    with the libraries' own thread pools; older files lack ``worker_init`` too), or a
    Ray Data candidate's ``raydata`` knobs."""
    if raydata is not None:
        return RayDataConfig.from_dict(raydata).candidate()
    if loader is None:
        raise ConfigError("a section has neither loader nor raydata settings")
    pipeline = pipeline or {}
    chosen = {k: _LEGACY.get(pipeline[k], pipeline[k]) for k in PIPELINE_KEYS if k in pipeline}
    settings = {k: v for k, v in (worker_init or {}).items() if k in WORKER_KEYS}
    return LoaderConfig.from_dict({**loader, **chosen, **settings})


def load_best_config(path: str | os.PathLike[str]) -> BestConfig:
    """Read and validate a best_config.json; raises ConfigError saying what is wrong."""
    file = Path(path)
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{file} does not exist; run the search first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{file} is not valid JSON ({exc}); re-run the search") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{file} must hold a JSON object, not {type(data).__name__}")
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise ConfigError(f"{file} lacks {', '.join(missing)}; it is not a raytune_loader result")
    if data["schema_version"] != SCHEMA_VERSION:
        raise ConfigError(
            f"{file} has schema_version {data['schema_version']!r}; this version reads "
            f"{SCHEMA_VERSION}: upgrade raytune_loader or re-run the search"
        )
    if not isinstance(data["loader"], dict) or not isinstance(data["hardware"], dict):
        raise ConfigError(f"{file}: 'loader' and 'hardware' must be JSON objects")
    pipeline, worker_init = data.get("pipeline") or {}, data.get("worker_init") or {}
    if not isinstance(pipeline, dict) or not isinstance(worker_init, dict):
        raise ConfigError(f"{file}: 'pipeline' and 'worker_init' must be JSON objects")
    try:
        loader = config_from_sections(data["loader"], pipeline, worker_init)
    except ConfigError as exc:
        raise ConfigError(f"{file}: invalid loader section: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"{file}: invalid loader section: {exc}") from None
    return BestConfig(file, loader, data, _raydata(file, data.get("raydata")))


def _raydata(file: Path, section: Any) -> RayDataConfig | None:
    """The ``raydata`` section's pipeline, validated (no Ray imported)."""
    if section is None:
        return None
    config = section.get("config") if isinstance(section, dict) else None
    if not isinstance(config, dict):
        raise ConfigError(f"{file}: 'raydata' must hold a 'config' object; re-run the search")
    try:
        return RayDataConfig.from_dict(config)
    except (ConfigError, TypeError) as exc:
        raise ConfigError(f"{file}: invalid raydata section: {exc}") from None

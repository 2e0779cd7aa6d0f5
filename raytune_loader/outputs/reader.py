"""``best_config.json`` read back: the one module every reader calls.

:func:`load_best_config` validates a file, never evaluates it, and returns a
:class:`BestConfig` whose :meth:`~BestConfig.dataloader` builds the tuned loader (and
``image_dataset``, ``dataset``, ``to_device``, the Ray Data pipeline), warning when the
machine differs from the one it was tuned on. :func:`chosen_settings` is the chosen
candidate's settings in a file's content (the console and the experiments read it);
:func:`recorded_options` and :func:`recorded_baselines` are what the bench replays.
The schema is docs/best_config.md; :mod:`raytune_loader.outputs.bestconfig` writes it.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.engines import ENGINES, engine_named
from raytune_loader.engines.dataloader import DataLoaderEngine
from raytune_loader.engines.raydata import RayDataEngine
from raytune_loader.errors import ConfigError, DatasetError, UserInputError
from raytune_loader.loaders.batches import set_cached, set_fetch_threads
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.measuring.job import SegmentSpec
from raytune_loader.raydata.config import RayDataConfig
from raytune_loader.raydata.dataset import build_dataset
from raytune_loader.raydata.receiving import iteration_arguments
from raytune_loader.raydata.rows import rows_of
from raytune_loader.sources.datasets import DatasetSpec
from raytune_loader.tuning.options import SearchOptions, dataset_options
from raytune_loader.tuning.space import HEURISTIC, PYTORCH_DEFAULT, RANK_SHARE

if TYPE_CHECKING:
    import ray.data


SCHEMA_VERSION = 1


REQUIRED_KEYS = (
    "schema_version", "dataset", "model", "objective", "loader", "metrics",
    "baselines", "speedup", "hardware", "search", "created",
)  # fmt: skip


class HardwareMismatchWarning(UserWarning):
    """The config was tuned on a machine unlike this one; re-run the search or the bench."""


PROBE_REQUESTS = 8  # GETs timed where a tuned config meets a store
MISMATCH = 2.0  # a time to first byte this many times the tuned store's, or 1/this, warns


class StoreMismatchWarning(UserWarning):
    """The config was tuned on local files and is used on a bucket, or the other way round:
    the requests in flight it chose were measured against another latency."""


@dataclass(frozen=True)
class BestConfig:
    """A validated best_config.json: what training code reads of a search's result.

    Attributes:
        path: the file it was read from.
        loader: the tuned DataLoader candidate (its arguments, pipeline and engine).
        data: the whole file, as JSON (``docs/best_config.md`` says what each section holds).
        raydata: the best verified Ray Data pipeline, where the search measured one.
    """

    path: Path
    loader: LoaderConfig
    data: dict[str, Any]
    raydata: RayDataConfig | None = None  # the best verified Ray Data candidate, if any

    @property
    def hardware(self) -> dict[str, Any]:
        """The hardware it was tuned on (``best_config.json``'s ``hardware``)."""
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
        :func:`raytune_loader.raydata.rows.rows_of`): a Ray Dataset whose actors make each
        sample as the search measured (one epoch per iteration, each sample once, in a
        new order every epoch). Pass it to Ray Train (``datasets=``) and read each
        worker's part with :meth:`iteration_arguments`, or iterate it in a plain loop;
        :meth:`raydata_to_device` finishes a batch.

        Args:
            data_root: where the data is on this machine (default: where the search read it).
            seed: the seed of every epoch's order.

        Returns:
            A ``ray.data.Dataset``; a ConfigError where the file has no ``raydata`` section.
        """
        config = self._raydata_config()
        # the source built with the Ray Data pipeline's variant, as a trial builds it
        rows = rows_of(self._dataset(data_root, config.source_variant(self.loader.access)))
        return build_dataset(rows, config, seed=seed)

    def iteration_arguments(self, device: str = "cpu") -> dict[str, Any]:
        """``iter_torch_batches``' keyword arguments for the tuned Ray Data pipeline
        (``get_dataset_shard("train").iter_torch_batches(**...)`` in Ray Train): the
        batch size, the prefetch, the collate that gives the DataLoader path's batch;
        ``device="cpu"`` leaves it on the host for :meth:`raydata_to_device`.

        Args:
            device: where ``iter_torch_batches`` puts a batch.

        Returns:
            The keyword arguments, for ``iter_torch_batches(**...)``.
        """
        return iteration_arguments(self._raydata_config(), device=device)

    def raydata_to_device(self, batch: Any, device: str | torch.device) -> Any:
        """A batch of :meth:`raydata_dataset` on ``device``, the Ray Data pipeline's
        device-side stages done (as :meth:`to_device` for the DataLoader).

        Args:
            batch: a batch of the pipeline, as ``iter_torch_batches`` gave it.
            device: the training device.

        Returns:
            The batch on ``device``, ready for the model.
        """
        from raytune_loader.pipeline.device import to_device

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

    def training_arguments(self) -> dict[str, Any]:
        """The keyword arguments of ``transformers.TrainingArguments`` that make the
        Hugging Face Trainer's own DataLoader the tuned one (a rank's batch size as
        ``per_device_train_batch_size``, the workers, prefetch, pinning, persistence)::

            args = TrainingArguments(output_dir="out", **tuned.training_arguments())

        The dataset is still :meth:`image_dataset`'s (its worker side, and a bucket's
        requests in flight). A ConfigError where the config holds what that DataLoader
        cannot take (thread workers, decoding on the device, Ray Data): search with
        ``--trainer hf``.

        Returns:
            The arguments by name.
        """
        from raytune_loader.outputs.trainers import hf_arguments

        return hf_arguments(self.loader)

    def dataloader(self, dataset: Dataset[Any], **overrides: Any) -> DataLoader[Any] | Any:
        """The tuned loader over ``dataset`` (``overrides`` win, or are refused in one
        line): a DataLoader, or a loader with a DataLoader's attributes (thread workers,
        a stream). In a process group each rank reads its own shard of every epoch, in
        Lightning, accelerate, Ray Train or a DDP loop; over a stream every rank reads
        the same number of batches (docs/streams.md). ``loader.sampler.set_epoch(e)``
        reshuffles; ``state_dict``/``load_state_dict`` resume an epoch mid-way.

        Args:
            dataset: the training dataset (:meth:`dataset` or :meth:`image_dataset` give one
                with the tuned worker side).
            **overrides: DataLoader arguments that win over the tuned ones
                (``shuffle=False``, ``sampler=...``); one the loader cannot honour is refused
                in one line.

        Returns:
            The loader; a ``HardwareMismatchWarning`` first where this machine differs from
            the one it was tuned on.
        """
        self.warn_if_other_machine()
        overrides.setdefault("drop_last", False)
        return build_dataloader(dataset, self.loader, **overrides)

    def image_dataset(self, root: str | os.PathLike[str]) -> Dataset[Any]:
        """The built-in image dataset (ImageFolder layout: ``root/<class>/<image>``) with
        the chosen pipeline's worker-side stages: RandomResizedCrop(224) and a flip, then
        float32 normalized, or uint8 for :meth:`to_device` to finish on the device. In a
        bucket, its objects are fetched ``fetch_threads`` at a time, and where the search
        chose the cache, kept under ``$XDG_CACHE_HOME/raytune_loader/objects`` (or
        ``~/.cache/...``), up to half its disk's free space, for the epochs after the first.

        Args:
            root: a folder of ``<class>/<image>`` files, or a bucket's (``s3://...``).

        Returns:
            The map-style dataset of (image, class) samples.
        """
        from raytune_loader.sources.datasets import DatasetSpec, build_dataset

        self._same_kind_of_store(root)
        spec = DatasetSpec("imagefolder", str(root))
        _listed_by_rank_zero(spec, stream=False)
        dataset = build_dataset(spec, self.loader.transfer, self.loader.decode)
        self._fetch_settings(dataset)  # for a trainer's own loader too
        return self._as_fast_a_store(dataset)

    def _fetch_settings(self, dataset: Dataset[Any]) -> None:
        """A remote dataset's tuned requests in flight, and its objects kept on this
        node's disk where the search chose the cache (under the budget it searched with)."""
        from raytune_loader.stores.cache import ObjectCache, default_budget, default_folder

        set_fetch_threads(dataset, self.loader.fetch_threads)
        cache = None
        if self.loader.cache:
            folder = default_folder()
            budget = (self.data.get("source") or {}).get("cache_bytes")
            cache = ObjectCache(folder, budget if budget is not None else default_budget(folder))
        set_cached(dataset, self.loader.cache, cache)

    def _same_kind_of_store(self, root: str | os.PathLike[str] | None) -> None:
        """A StoreMismatchWarning where ``root`` is a bucket and the search read local
        files, or the other way round."""
        from raytune_loader.stores.url import is_remote

        if root is None:
            return
        tuned = (self.data.get("source") or {}).get("store")
        if is_remote(str(root)) and not tuned:
            words = (f"{self.path} was tuned on local files, and {root} is a bucket: its "
                     "requests in flight (fetch_threads) were not searched; re-run the "
                     f"search with --data-root {root}")  # fmt: skip
        elif tuned and not is_remote(str(root)):
            words = (f"{self.path} was tuned on s3://{tuned.get('bucket')}{_latency(tuned)}, "
                     f"and {root} is local: its workers "
                     "and fetch_threads were chosen for the store's latency; re-run the "
                     "search on the local files")  # fmt: skip
        else:
            return
        warnings.warn(words, StoreMismatchWarning, stacklevel=3)

    def dataset(self, data_root: str | os.PathLike[str] | None = None) -> Dataset[Any]:
        """The tuned dataset, for training: the search's dataset (under ``data_root``
        on this machine, or where the search read it) with the chosen pipeline's
        worker side. A stream (webdataset, a Hugging Face dataset read as one) covers
        all its shards (their samples counted here), split by rank and loader worker,
        shuffled with the recorded buffer and batched in the workers where that was
        chosen; feed it to :meth:`dataloader`, which passes it its batch size and the
        rank. Its order depends on the seed (0; ``dataloader(..., seed=n)`` for another)
        and the epoch, the same on every rank.

        Args:
            data_root: where the data is on this machine (default: where the search read it).

        Returns:
            The dataset (map-style, or a stream).
        """
        return self._dataset(data_root, self.loader)

    def _dataset(
        self, data_root: str | os.PathLike[str] | None, loader: LoaderConfig
    ) -> Dataset[Any]:
        from raytune_loader.loaders.shard_stream import StreamVariant
        from raytune_loader.measuring.shards import shuffle_buffer
        from raytune_loader.sources.datasets import DatasetSpec

        recorded = (self.data.get("search") or {}).get("dataset_spec")
        if not isinstance(recorded, dict) or "name" not in recorded:
            raise ConfigError(f"{self.path} does not say which dataset was searched; re-run it")
        root = str(data_root) if data_root is not None else recorded.get("data_root")
        self._same_kind_of_store(root)
        pairs = tuple(tuple(pair) for pair in recorded.get("storage_options", ()))
        spec = DatasetSpec(**{**recorded, "data_root": root, "storage_options": pairs})
        _listed_by_rank_zero(spec, stream=loader.access == "stream")
        if loader.access != "stream":
            dataset = spec.source.build(spec, loader.transfer, loader.decode)
            self._fetch_settings(dataset)  # for a trainer's own loader too
            return self._as_fast_a_store(dataset)
        source = self.data.get("source") or {}
        variant = StreamVariant(
            transfer=loader.transfer,
            decode=loader.decode,
            batch_size=loader.batch_size if loader.batching == "workers" else None,
            shuffle_buffer=int(source.get("shuffle_buffer", shuffle_buffer(spec))),
            seed=None,  # 0: every rank must draw the same order; the loader's seed= wins
        )
        return self._as_fast_a_store(spec.source.build_stream(spec, [], variant))

    def _as_fast_a_store(self, dataset: Dataset[Any]) -> Dataset[Any]:
        """``dataset``; a StoreMismatchWarning first where it reads a store whose time to
        first byte (a few GETs timed here) is over twice, or under half, the one the
        config was tuned against: its requests in flight were chosen for that latency."""
        from raytune_loader.sources.remote_folder import keys_of
        from raytune_loader.stores.probe import latency
        from raytune_loader.stores.store import store_of

        tuned = ((self.data.get("source") or {}).get("store") or {}).get("ttfb_p50_s")
        store, keys = store_of(dataset), keys_of(dataset)
        if not tuned or store is None or not keys:
            return dataset
        measured = latency(store, keys[:PROBE_REQUESTS], PROBE_REQUESTS)
        if measured is None:
            return dataset
        ratio = measured.ttfb_p50_s / tuned
        if 1 / MISMATCH <= ratio <= MISMATCH:
            return dataset
        words = "slower" if ratio > 1 else "faster"
        warnings.warn(
            f"{store.url} answers its first byte in {measured.ttfb_p50_s * 1e3:.0f} ms, the "
            f"store {self.path} was tuned on in {tuned * 1e3:.0f} ms ({max(ratio, 1 / ratio):.1f}x "
            f"{words}): its requests in flight (fetch_threads={self.loader.fetch_threads}, "
            f"{self.loader.num_workers} workers) were chosen for that latency; re-run the "
            f"search against {store.url}",
            StoreMismatchWarning,
            stacklevel=3,
        )
        return dataset

    def to_device(self, batch: Any, device: str | torch.device) -> Any:
        """A batch from :meth:`dataloader` on ``device``, with the chosen pipeline's
        device-side stages done: JPEGs decoded, cropped and flipped there with
        ``decode="device"``; uint8 images converted and normalized there; image batches
        in channels-last memory format when the search measured them so. Call it after
        a trainer's own device move (Lightning's ``on_after_batch_transfer``, after
        accelerate's or Ray Train's loader), or in place of it.

        Args:
            batch: a batch of :meth:`dataloader`.
            device: the training device.

        Returns:
            The batch on ``device``, ready for the model.
        """
        from raytune_loader.pipeline.device import to_device

        return to_device(
            batch, torch.device(device), transfer=self.loader.transfer,
            decode=self.loader.decode, non_blocking=self.loader.pin_memory,
            channels_last=bool((self.data.get("job") or {}).get("channels_last")),
        )  # fmt: skip

    def warn_if_other_machine(self, current: dict[str, Any] | None = None) -> list[str]:
        """Warn (and return the differences) when this machine is not the tuned one.

        Args:
            current: this machine's facts (default: read here).

        Returns:
            One line per fact that differs (CPU model, usable CPUs, GPU); empty on the machine
            it was tuned on.
        """
        if current is None:
            from raytune_loader.machine.hardware import cpu_and_gpu_summary

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


def chosen_settings(best: dict[str, Any]) -> dict[str, Any]:
    """The chosen candidate's settings in a ``best_config.json``'s content (as
    :meth:`~raytune_loader.engines.base.Engine.settings` writes them): where a candidate
    of another engine than the DataLoader was chosen, the file's ``loader`` holds the
    best DataLoader (what :meth:`BestConfig.dataloader` builds) and the chosen one is in
    its engine's section.

    Args:
        best: the file's content.

    Returns:
        Settings :func:`~raytune_loader.engines.config_from_settings` reads.
    """
    chosen = engine_named(best.get("engine", DataLoaderEngine.name))
    if chosen.remote:
        return {"engine": chosen.name, chosen.name: best[chosen.name]["config"]}
    return {k: best.get(k) for k in ("loader", "pipeline", "worker_init")}


def load_best_config(path: str | os.PathLike[str]) -> BestConfig:
    """Read and validate a best_config.json; raises ConfigError saying what is wrong.

    Args:
        path: a ``best_config.json`` the search wrote.

    Returns:
        The validated :class:`BestConfig`.
    """
    file = Path(path)
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{file} does not exist; run the search first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"{file} is not valid JSON ({exc}); pass a search's best_config.json, "
            "or re-run the search"
        ) from None
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
        loader = DataLoaderEngine.from_settings(data)
    except (ConfigError, TypeError) as exc:
        raise ConfigError(f"{file}: invalid loader section: {exc}") from None
    try:  # every engine's own section, validated by its engine
        sections = {name: engine.read_section(data) for name, engine in ENGINES.items()}
    except ConfigError as exc:
        raise ConfigError(f"{file}: {exc}") from None
    return BestConfig(file, loader, data, sections[RayDataEngine.name])


SEARCH_KEYS = ("dataset_spec", "segment", "samples_per_trial", "seed", "device")


def recorded_options(
    data: dict[str, Any], path: str, steps: int | None = None, data_root: str | None = None
) -> SearchOptions:
    """The search's options as :func:`~raytune_loader.outputs.bestconfig.best_config`
    recorded them (its ``search`` and ``job`` sections read back by the writer's own
    types), ``steps`` and ``data_root``
    overriding, so a bench builds its job as the search did. A section that lacks what
    it needs (an older file) is a ConfigError saying to re-run the search."""
    search = data.get("search")
    missing = [k for k in SEARCH_KEYS if k not in search] if isinstance(search, dict) else []
    if not isinstance(search, dict) or missing:
        raise ConfigError(
            f"{path}: the search section lacks {', '.join(missing) or 'everything'}; it was "
            "written by an older raytune_loader: re-run the search"
        )
    # a file written before the job section trained with PyTorch's own precision settings
    job = data.get("job") or {"precision": None, "channels_last": False}
    try:
        written = search["dataset_spec"]
        pairs = tuple(tuple(pair) for pair in written.get("storage_options", ()))
        spec = DatasetSpec(**{**written, "storage_options": pairs})
        segment = SegmentSpec(**search["segment"])
        train_step = job.get("train_step") or None
        return SearchOptions(
            **dataset_options(replace(spec, data_root=data_root or spec.data_root)),
            model=None if train_step else str(data["model"]),
            steps=steps or segment.steps,
            warmup_steps=segment.warmup_steps,
            report_every=segment.report_every,
            compute_threads=segment.compute_threads,
            trial_timeout_s=segment.time_limit_s,
            samples_per_trial=int(search["samples_per_trial"]),
            seed=int(search["seed"]),
            # older files lack these two: the options' own defaults
            cpus_per_worker=float(search.get("cpus_per_worker", SearchOptions.cpus_per_worker)),
            ranks_per_node=int(data.get("ranks_per_node", SearchOptions.ranks_per_node)),
            precision=job["precision"],
            channels_last=bool(job["channels_last"]),
            compile=bool(job.get("compile", False)),
            train_step=train_step,
        )
    except (KeyError, TypeError, ValueError, UserInputError) as exc:
        raise ConfigError(f"{path}: invalid search section ({exc}); re-run the search") from None


def recorded_baselines(data: dict[str, Any], path: str) -> dict[str, LoaderConfig]:
    """The DataLoader baselines a search recorded, by name (what the bench re-measures)."""
    recorded = data.get("baselines")
    found: dict[str, LoaderConfig] = {}
    for name in (PYTORCH_DEFAULT, HEURISTIC, RANK_SHARE):
        section = recorded.get(name) if isinstance(recorded, dict) else None
        if section is None and name == RANK_SHARE:
            continue  # only with several ranks
        loader = section.get("loader") if isinstance(section, dict) else None
        if not isinstance(loader, dict):
            raise ConfigError(f"{path}: baselines.{name}.loader is missing; re-run the search")
        try:
            found[name] = LoaderConfig.from_dict(loader)
        except (ConfigError, TypeError) as exc:
            raise ConfigError(f"{path}: invalid baselines.{name}.loader: {exc}") from None
    return found


def _listed_by_rank_zero(spec: Any, *, stream: bool) -> None:
    """In a process group of several ranks (torchrun, Lightning, accelerate, Ray Train),
    a bucket is listed (and a stream's shards counted) by rank 0 alone, which hands the
    listing to the others: one listing a job, not one a rank. Every rank calls it, as it
    builds its dataset; an error in rank 0 is raised in every rank."""
    import torch.distributed as dist

    from raytune_loader.sources.datasets import adopt_listing, build_dataset, listing_of
    from raytune_loader.stores.url import is_remote

    if not is_remote(spec.data_root) or not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_world_size() < 2:
        return
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            if stream:
                from raytune_loader.loaders.shard_stream import StreamVariant

                spec.source.build_stream(spec, [], StreamVariant())  # lists, and counts
                box[0] = spec.source.listed(spec)
            else:
                box[0] = listing_of(build_dataset(spec))
        except (DatasetError, ConfigError) as exc:
            box[0] = exc
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], Exception):
        raise box[0]
    adopt_listing(spec, box[0])


def _latency(store: dict[str, Any]) -> str:
    """The store's measured latency, as a warning says it: a request's median time (none
    for a winner whose window read a warm cache), else the first byte's."""
    request, first = store.get("request_s"), store.get("ttfb_p50_s")
    if request:
        return f" (a request {request:.3f} s)"
    return f" (a first byte in {first:.3f} s)" if first else ""

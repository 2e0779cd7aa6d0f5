"""What a search is asked to do: :class:`SearchOptions`, validated in one place.

The command line fills these from its flags (``python -m raytune_loader.search``),
the Python API takes them directly, and the bench rebuilds them from a
``best_config.json``. :meth:`SearchOptions.validate` turns every impossible value
into a :class:`~raytune_loader.errors.ConfigError` that names the flag.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from raytune_loader.errors import ConfigError
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.measuring.models import validate_step
from raytune_loader.measuring.step import default_precision
from raytune_loader.sources import datasets, synthetic
from raytune_loader.sources.datasets import SYNTHETIC
from raytune_loader.stores.url import is_remote, mistyped

OBJECTIVES = ("util", "samples_per_s")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
GPU_BATCH_SIZE = 256
CPU_BATCH_SIZE = 32
SEARCH_METHODS = ("model", "tpe", "random")


@dataclass(frozen=True)
class SearchOptions:
    """Every knob of a search; defaults are the command line's.

    Attributes:
        Each field is the command-line flag of its name, dashed and without a trailing
        ``_s`` (``data_root`` is ``--data-root``, ``time_budget_s`` ``--time-budget``),
        documented with its default in ``docs/cli.md``; ``batch_sizes`` is
        ``--batch-size``, ``storage_options`` the JSON object of ``--storage-options``,
        and ``ray_data`` ``--ray-data`` / ``--no-ray-data`` (None: offered where the
        cluster has CPUs beyond the trials'). A field whose default is None takes the
        device's or the format's usual value, as its comment says.
    """

    dataset: str = SYNTHETIC
    data_root: str | None = None
    download: bool = False
    synthetic_images: int = synthetic.DEFAULT_IMAGES
    image_column: str = "image"  # Hugging Face datasets and Parquet: the image's column
    label_column: str = "label"  # and the class's
    shuffle_buffer: int | None = None  # a stream's; None: its format's usual (1000)
    # --storage-options: an object store client's settings beyond the environment's (never
    # shown: they may hold secrets)
    storage_options: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    cache_bytes: int | None = None  # a local object cache at most; None: half the disk's free
    model: str | None = None
    num_samples: int = 10
    search: str = "model"  # how trials are proposed: model (cost model + TPE), tpe, random
    time_budget_s: float | None = None
    max_concurrent: int | None = None
    gpus_per_trial: float | None = None  # of one trial, all its ranks together
    ranks_per_node: int = 1  # data-parallel ranks per trial; 0: one per GPU of the node
    cpus_per_worker: float = TrialJob.cpus_per_worker
    batch_sizes: tuple[int, ...] | None = None  # None: the device's default (256 / 32)
    min_batch_size: int = TrialJob.min_batch_size
    max_workers: int | None = None
    objective: str = "util"
    steps: int = SegmentSpec.steps
    warmup_steps: int = SegmentSpec.warmup_steps
    report_every: int = SegmentSpec.report_every
    samples_per_trial: int = TrialJob.samples_per_trial
    compute_threads: int = SegmentSpec.compute_threads
    trial_timeout_s: float = SegmentSpec.time_limit_s
    verify_top: int = 2
    verify_repeats: int = 3
    memory_share: float = 1.0  # of the node's free memory one epoch's projected growth may take
    out: str = "results"
    address: str | None = None
    node_type: str | None = None
    ray_data: bool | None = None  # Ray Data candidates: None where remote CPUs exist, or forced
    remote_cpus: float | None = None  # the most CPUs one trial's Ray Data actors may take
    cpu_node_type: str | None = None  # the custom resource of the nodes the actors run on
    storage: str | None = None
    dashboard_host: str = "127.0.0.1"
    expose_dashboard: bool = False
    resume: bool = False
    seed: int = 0
    cold: bool = False
    verbose: bool = False
    precision: str | None = None  # None: bf16 on CUDA, fp32 on a CPU
    channels_last: bool | None = None  # None: on CUDA
    compile: bool = False
    train_step: str | None = None  # module:function building the user's own step
    trainer: str | None = None  # the trainer that builds the loader ("hf"): only what it takes

    def for_device(self, cuda: bool) -> SearchOptions:
        """These options with the device's defaults filled in where none was given: the
        batch size people train with there (256 for ImageNet-class models on a GPU, a
        small one on a CPU, where the default model and step are small too).

        Args:
            cuda: whether the trials train on a CUDA device.

        Returns:
            The options, their batch sizes filled in.
        """
        if self.batch_sizes is not None:
            return self
        return replace(self, batch_sizes=(GPU_BATCH_SIZE,) if cuda else (CPU_BATCH_SIZE,))

    def validate(self) -> None:
        """Raise ConfigError naming the first impossible value.

        Returns:
            None; a ConfigError naming the flag where a value is impossible.
        """
        self._check_counts()
        self._check_batch_sizes()
        self._check_search()
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"--objective must be one of {', '.join(OBJECTIVES)}")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ConfigError(f"--precision must be one of {', '.join(PRECISIONS)}")
        if self.ray_data and self.ranks_per_node != 1:
            raise ConfigError(
                "--ray-data measures Ray Data candidates with one rank per trial: drop "
                "--ranks-per-node or --ray-data"
            )
        if self.train_step and (self.compile or self.model):
            raise ConfigError(
                "--train-step builds its own model: drop --model and --compile, or drop "
                "--train-step to train the built-in step"
            )
        check_data_root(self.data_root)
        if not is_loopback(self.dashboard_host) and not self.expose_dashboard:
            raise ConfigError(
                f"--dashboard-host {self.dashboard_host} would expose the Ray dashboard beyond "
                "this machine; add --expose-dashboard to confirm, or keep 127.0.0.1"
            )

    def _check_counts(self) -> None:
        bounds = (  # what each flag must be, and its value
            ("at least 1", lambda v: v >= 1, {
                "--num-samples": self.num_samples, "--steps": self.steps,
                "--samples-per-trial": self.samples_per_trial,
                "--verify-repeats": self.verify_repeats, "--compute-threads": self.compute_threads,
                "--report-every": self.report_every, "--min-batch-size": self.min_batch_size,
                "--synthetic-images": self.synthetic_images,
                "--max-concurrent": 1 if self.max_concurrent is None else self.max_concurrent,
            }),
            ("0 or more", lambda v: v >= 0, {
                "--warmup-steps": self.warmup_steps, "--verify-top": self.verify_top,
                "--max-workers": self.max_workers or 0,
                "--gpus-per-trial": self.gpus_per_trial or 0,
                "--ranks-per-node": self.ranks_per_node,
                "--shuffle-buffer": self.shuffle_buffer or 0,
                "--remote-cpus": self.remote_cpus or 0,
            }),
            ("positive", lambda v: v > 0, {
                "--trial-timeout": self.trial_timeout_s, "--cpus-per-worker": self.cpus_per_worker,
                "--time-budget": 1 if self.time_budget_s is None else self.time_budget_s,
            }),
        )  # fmt: skip
        for must, holds, values in bounds:
            for flag, value in values.items():
                if not holds(value):
                    raise ConfigError(f"{flag} must be {must}, got {value}")
        if not 0 < self.memory_share <= 1:
            share = self.memory_share
            raise ConfigError(f"--memory-share must be above 0 and at most 1, got {share}")
        gpus = self.gpus_per_trial or 0
        if gpus > 1 and not float(gpus).is_integer():
            raise ConfigError(f"--gpus-per-trial above 1 must be a whole number, got {gpus}")

    def _check_search(self) -> None:
        if self.search not in SEARCH_METHODS:
            raise ConfigError(
                f"--search must be one of {', '.join(SEARCH_METHODS)}, got {self.search!r}"
            )

    def _check_batch_sizes(self) -> None:
        if self.batch_sizes is None:
            return  # filled in by for_device
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ConfigError(
                f"batch sizes must be positive integers, got {list(self.batch_sizes)}"
            )
        if self.min_batch_size > min(self.batch_sizes):
            raise ConfigError(
                f"--min-batch-size ({self.min_batch_size}) must not exceed the smallest batch "
                f"size ({min(self.batch_sizes)}); lower it or raise --batch-sizes"
            )
        ranks = max(1, self.ranks_per_node)  # each rank reads its share of the samples
        if self.samples_per_trial // ranks < max(self.batch_sizes):
            per_rank = f", {ranks} ranks sharing them" if ranks > 1 else ""
            raise ConfigError(
                f"--samples-per-trial ({self.samples_per_trial}{per_rank}) must hold at least "
                f"one batch of the largest batch size ({max(self.batch_sizes)}) per rank"
            )


AUTH_MODE = "RAY_AUTH_MODE"  # Ray's switch for token authentication: token or disabled


def token_auth_off(started: bool) -> bool:
    """Whether Ray's dashboard takes no token: ``RAY_AUTH_MODE`` set to anything but
    ``token``, the one value that turns it on. Unset, Ray turns it on for an instance it
    starts (and sets ``token`` then) but not on joining an address: once Ray has
    ``started``, unset means off."""
    mode = os.environ.get(AUTH_MODE)
    return started if mode is None else mode.lower() != "token"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (the dashboard then reaches no one else)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_data_root(data_root: object) -> None:
    """A ConfigError for a ``--data-root`` that is no folder here and an object store URL
    left with one slash (``s3:/bucket``, as ``pathlib.Path`` leaves ``s3://bucket``)."""
    meant = mistyped(data_root)
    if meant is not None and not Path(str(data_root)).exists():
        raise ConfigError(
            f"--data-root {data_root} is no folder here: for a bucket, write {meant} "
            "(two slashes after the scheme)"
        )


def dataset_spec(opts: SearchOptions) -> datasets.DatasetSpec:
    """What the options say to load (:func:`dataset_options` reads it back); a local
    ``--data-root`` made absolute, since the trials run in Tune's trial folders, not in
    the folder the command was given in (and training reads ``best_config.json``'s
    record of it from anywhere)."""
    root = opts.data_root
    if root and not is_remote(root):
        root = os.path.abspath(os.path.expanduser(root))
    return datasets.DatasetSpec(
        opts.dataset, root, opts.download, opts.synthetic_images,
        opts.image_column, opts.label_column, opts.shuffle_buffer, opts.storage_options,
    )  # fmt: skip


def dataset_options(spec: datasets.DatasetSpec) -> dict[str, Any]:
    """The options :func:`dataset_spec` builds ``spec`` from."""
    return {
        "dataset": spec.name, "data_root": spec.data_root, "download": spec.download,
        "synthetic_images": spec.synthetic_images, "image_column": spec.image_column,
        "label_column": spec.label_column, "shuffle_buffer": spec.shuffle_buffer,
        "storage_options": spec.storage_options,
    }  # fmt: skip


def job_from_options(
    opts: SearchOptions,
    model: str,
    *,
    device: str,
    node_cpus: float,
    gpu_memory_share: float = 1.0,
) -> TrialJob:
    """The one constructor of a :class:`TrialJob` (search, bench and experiments): the
    step checked first (the ``--train-step``, or else ``model``: a ``ModelError`` for one
    no trial could build); what the options leave open (precision, memory format) takes
    the device's default for the built-in step, and stays the user's own for a
    ``--train-step``."""
    cuda = device.startswith("cuda")
    own_step = opts.train_step is not None
    return TrialJob(
        dataset=dataset_spec(opts),
        model=validate_step(opts.train_step, model),
        segment=SegmentSpec(
            opts.warmup_steps,
            opts.steps,
            opts.report_every,
            opts.compute_threads,
            time_limit_s=opts.trial_timeout_s,
        ),
        device=device,
        samples_per_trial=opts.samples_per_trial,
        seed=opts.seed,
        min_batch_size=opts.min_batch_size,
        cpus_per_worker=opts.cpus_per_worker,
        node_cpus=node_cpus,
        cold=opts.cold,
        gpu_memory_share=gpu_memory_share,
        precision=opts.precision or (None if own_step else default_precision(device)),
        channels_last=(cuda and not own_step) if opts.channels_last is None else opts.channels_last,
        compile=opts.compile,
        train_step=opts.train_step,
        ranks=opts.ranks_per_node,
        cache_bytes=opts.cache_bytes,
    )

"""Command line: ``python -m raytune_loader.search --dataset NAME [options]``.

Parses the options (contract in docs/cli.md) into
:class:`~raytune_loader.tuning.options.SearchOptions`, runs
:func:`~raytune_loader.api.run_search` with live progress, prints the summary
table and exits 0, or prints one line saying what went wrong and exits 2 for a
user mistake, 1 when the search itself failed, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, NoReturn

from raytune_loader import __version__, sources
from raytune_loader.api import run_search
from raytune_loader.errors import RaytuneLoaderError
from raytune_loader.outputs.console import (
    TerminalProgress,
    exit_status,
    freeze_at_exit,
    notes,
    print_summary,
)
from raytune_loader.tuning.options import PRECISIONS, SEARCH_METHODS, SearchOptions
from raytune_loader.tuning.space import TRAINERS


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"batch sizes must be positive integers, got {text!r}"
        ) from None
    if not sizes or any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return sizes


class DefaultsShown(argparse.HelpFormatter):
    """Each option's help ends with its default, unless the help already names one or
    there is none to name (no value, a switch that is off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default  # by identity: a default of 0 is named, False is not
        unnamed = default is None or default is False or default is argparse.SUPPRESS
        if unnamed or not action.option_strings or "default" in text:
            return text
        return f"{text} (default %(default)s)"


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a bad option is one line on stderr and exit status 2, and ``--help``
    names every default (all our CLIs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """A bad flag: one line naming it, exit status 2."""
        self.exit(2, f"error: {message} (see --help)\n")


def _ranks(value: str) -> int:
    """``auto`` (0: one rank per GPU, resolved once the node is known) or a count."""
    if value == "auto":
        return 0
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or auto, got {value!r}") from None


def get_args_parser() -> argparse.ArgumentParser:
    """The search's command line (``python -m raytune_loader.search --help``), reused by the
    bench and the experiments."""
    p = OneLineErrorParser(
        prog="python -m raytune_loader.search",
        description="Find the DataLoader settings that keep your accelerator busy "
        "(a Ray Tune search guided by Optuna).",
    )
    p.add_argument(
        "--dataset",
        default=sources.DEFAULT,
        help=sources.help_text(),
    )
    p.add_argument(
        "--data-root",
        help="where the data is: a local path, or an object store's URL (s3://bucket/prefix; "
        "credentials, endpoint and region from AWS_* as your other tools read them)",
    )
    p.add_argument(
        "--storage-options",
        type=storage_options,
        metavar="JSON",
        help="the object store's settings beyond the environment's, as a JSON object: region, "
        "endpoint_url, profile, force_path_style, unsigned (no credential: those come from "
        "the environment or a profile)",
    )
    p.add_argument(
        "--cache-bytes",
        type=int,
        metavar="BYTES",
        help="the local cache of a bucket's objects may hold this many bytes (default: half "
        "the free space of its disk); it is a candidate only where an epoch fits",
    )
    p.add_argument("--download", action="store_true", help="let torchvision download cifar/mnist")
    p.add_argument(
        "--synthetic-images",
        type=int,
        default=SearchOptions.synthetic_images,
        help=f"images in the generated default dataset (default {SearchOptions.synthetic_images})",
    )
    p.add_argument(
        "--search",
        choices=SEARCH_METHODS,
        default="model",
        help="how trials are proposed: model (profile the pipeline's stages, predict every "
        "candidate, run the predicted best of each structure, then TPE around them, skipping "
        "what the model rules out), tpe or random (default model)",
    )
    p.add_argument(
        "--shuffle-buffer",
        type=int,
        help="a stream's shuffle buffer in samples, as your training uses it (default 1000, "
        "webdataset's and Hugging Face's usual; 0: no shuffling); never shrunk to win speed",
    )
    p.add_argument("--image-column", default="image", help="hf: the column holding the image")
    p.add_argument("--label-column", default="label", help="hf: the column holding the class")
    p.add_argument(
        "--model",
        help="torchvision model name, small-cnn or package.module:function "
        "(default resnet50 on a GPU, small-cnn on a CPU)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="training precision of every measurement: bf16/fp16 autocast, tf32 or fp32 "
        "(default bf16 on a GPU, fp32 on a CPU)",
    )
    p.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        help="model and image batches in channels-last memory format (default: on a GPU)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model (compiled during warm-up, never measured)",
    )
    p.add_argument(
        "--train-step",
        help="package.module:function called with device= (and num_classes=) that builds "
        "your model and optimizer and returns step(batch): tune for your own training step",
    )
    p.add_argument(
        "--num-samples", type=int, default=SearchOptions.num_samples,
        help=f"number of trials (default {SearchOptions.num_samples})",
    )  # fmt: skip
    p.add_argument("--time-budget", type=float, help="stop starting new trials after SECONDS")
    p.add_argument(
        "--max-concurrent",
        type=int,
        help="trials at once (default: 1 on a CPU, GPUs / gpus-per-trial on a GPU)",
    )
    p.add_argument(
        "--gpus-per-trial",
        type=float,
        help="GPUs of one trial, all its ranks together (default with CUDA: 0.5 for one "
        "rank, else one per rank up to the node's GPUs)",
    )
    p.add_argument(
        "--ranks-per-node",
        type=_ranks,
        default=1,
        metavar="N|auto",
        help="data-parallel ranks per trial, each with the candidate loader, all at once on "
        "one node (DDP; auto: one per GPU of the node; default 1)",
    )
    p.add_argument(
        "--cpus-per-worker",
        type=float,
        default=1.0,
        help="CPUs reserved per loader worker (default 1; e.g. 0.5 for I/O-bound data)",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--batch-size",
        type=_batch_sizes,
        dest="batch_sizes",
        help="fixed batch size (default 256 on a GPU, 32 on a CPU)",
    )
    group.add_argument(
        "--batch-sizes",
        type=_batch_sizes,
        dest="batch_sizes",
        help="comma-separated batch sizes to search (the first is the baselines')",
    )
    p.add_argument(
        "--min-batch-size", type=int, default=1, help="smallest batch size for OOM back-off"
    )
    p.add_argument("--max-workers", type=int, help="cap on num_workers (default: usable CPUs)")
    p.add_argument(
        "--objective",
        choices=("util", "throughput"),
        default="util",
        help="what to maximize (default util)",
    )
    p.add_argument(
        "--steps", type=int, default=SearchOptions.steps, help="measured training steps per trial"
    )
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=SearchOptions.warmup_steps,
        help="unmeasured steps first, on the first batch",
    )
    p.add_argument(
        "--report-every",
        type=int,
        default=SearchOptions.report_every,
        help="steps between reports to Tune/ASHA",
    )
    p.add_argument("--samples-per-trial", type=int, default=1024, help="size of the fixed subset")
    p.add_argument(
        "--compute-threads",
        type=int,
        default=1,
        help="torch threads of the training step, the same in every trial (default 1)",
    )
    p.add_argument(
        "--trial-timeout",
        type=float,
        default=600.0,
        help="seconds after which a trial ends with reason timeout (default 600)",
    )
    p.add_argument(
        "--verify-top", type=int, default=SearchOptions.verify_top,
        help="top configurations re-measured",
    )  # fmt: skip
    p.add_argument("--verify-repeats", type=int, default=3, help="repeats of each re-measurement")
    p.add_argument(
        "--memory-share",
        type=float,
        default=SearchOptions.memory_share,
        help="flag memory growth when one epoch of the whole dataset would add more than this "
        "share of the node's free memory (default 1: all of it)",
    )
    p.add_argument("--out", default="results", help="results root (default results/)")
    p.add_argument("--address", help="join an existing Ray cluster (auto, ray://host:port)")
    p.add_argument(
        "--node-type",
        help="on a cluster, only use nodes carrying this Ray custom resource (ray start "
        "--resources '{\"LABEL\": 1}'), to tune for one node type at a time",
    )
    p.add_argument(
        "--trainer",
        choices=TRAINERS,
        help="the trainer that will build the loader from its own arguments: hf (the Hugging "
        "Face Trainer's TrainingArguments) searches only what they can set, and the report "
        "says what the rest would have gained (default: the tuned loader, everything)",
    )
    p.add_argument(
        "--ray-data",
        action=argparse.BooleanOptionalAction,
        help="offer Ray Data candidates (actors on the cluster's CPUs make the batches): by "
        "default where the cluster has CPUs beyond the trials' nodes (--node-type); "
        "--ray-data also on one machine, --no-ray-data never",
    )
    p.add_argument(
        "--remote-cpus",
        type=float,
        metavar="N",
        help="the most CPUs one trial's Ray Data actors may take (default: the CPUs beyond "
        "the trials' nodes, or on one machine those beyond the trial's own)",
    )
    p.add_argument(
        "--cpu-node-type",
        help="the Ray custom resource of the CPU nodes Ray Data's actors run on (ray start "
        "--resources '{\"LABEL\": 1}'); default: any node without --node-type's",
    )
    p.add_argument(
        "--storage",
        help="where Tune keeps the experiment: a path every node shares, or a bucket "
        "(s3://, gs://); default results/<dataset>/tune",
    )
    p.add_argument(
        "--dashboard-host",
        default="127.0.0.1",
        help="address the local Ray dashboard listens on (default 127.0.0.1, this machine only)",
    )
    p.add_argument(
        "--expose-dashboard",
        action="store_true",
        help="confirm a non-loopback --dashboard-host (anyone who reaches it and has the "
        "token can run code on this machine)",
    )
    p.add_argument("--resume", action="store_true", help="continue the interrupted search")
    p.add_argument(
        "--cold",
        action="store_true",
        help="for datasets larger than RAM: each trial reads samples no earlier trial read, "
        "instead of one pre-warmed subset",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the search and the data subset")
    p.add_argument("--verbose", action="store_true", help="show Tune's own table and Ray's logs")
    p.add_argument("--version", action="version", version=f"raytune_loader {__version__}")
    return p


def storage_options(text: str) -> tuple[tuple[str, str], ...]:
    """``--storage-options``' JSON object as (key, value) pairs (its values never echoed:
    a credential put there by mistake stays out of the error)."""
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    scalar = (str, int, float, bool)
    if not isinstance(found, dict) or not all(isinstance(v, scalar) for v in found.values()):
        raise argparse.ArgumentTypeError(
            "must be a JSON object of settings (strings; true or false for force_path_style "
            'and unsigned), such as \'{"region": "eu-west-1"}\''
        )
    return tuple(sorted((str(k), str(v).lower() if isinstance(v, bool) else str(v))
                        for k, v in found.items()))  # fmt: skip


def options_from_args(args: argparse.Namespace) -> SearchOptions:
    """The :class:`~raytune_loader.tuning.options.SearchOptions` parsed flags describe."""
    objective = "samples_per_s" if args.objective == "throughput" else args.objective
    return SearchOptions(
        dataset=args.dataset, data_root=args.data_root, download=args.download,
        synthetic_images=args.synthetic_images, image_column=args.image_column,
        label_column=args.label_column, shuffle_buffer=args.shuffle_buffer,
        storage_options=args.storage_options or (), cache_bytes=args.cache_bytes,
        model=args.model, num_samples=args.num_samples,
        search=args.search,
        time_budget_s=args.time_budget, max_concurrent=args.max_concurrent,
        gpus_per_trial=args.gpus_per_trial, cpus_per_worker=args.cpus_per_worker,
        ranks_per_node=args.ranks_per_node,
        batch_sizes=args.batch_sizes, min_batch_size=args.min_batch_size,
        max_workers=args.max_workers, objective=objective, steps=args.steps,
        warmup_steps=args.warmup_steps, report_every=args.report_every,
        samples_per_trial=args.samples_per_trial, compute_threads=args.compute_threads,
        trial_timeout_s=args.trial_timeout,
        verify_top=args.verify_top, verify_repeats=args.verify_repeats,
        memory_share=args.memory_share, out=args.out,
        address=args.address, node_type=args.node_type, storage=args.storage,
        ray_data=args.ray_data, remote_cpus=args.remote_cpus, cpu_node_type=args.cpu_node_type,
        dashboard_host=args.dashboard_host,
        expose_dashboard=args.expose_dashboard, resume=args.resume, seed=args.seed, cold=args.cold,
        verbose=args.verbose, precision=args.precision, channels_last=args.channels_last,
        compile=args.compile, train_step=args.train_step, trainer=args.trainer,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``python -m raytune_loader.search``: run the search, print its summary; the exit status
    (docs/cli.md)."""
    freeze_at_exit()
    parser = get_args_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        options = options_from_args(args)
        progress = TerminalProgress(options.num_samples, options.objective)
        result = run_search(options, progress)
        print_summary(result.best_config, result.out_dir)
        for note in notes(result.trials):
            print(f"note: {note}")
    except (RaytuneLoaderError, KeyboardInterrupt) as exc:
        return exit_status(exc, "interrupted; finished trials are kept, continue with --resume")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every module the GPU check's stages can import on the device, checked before the first.

    python experiments/gpu_modules.py [--quiet] [--stages first|second|raydata|all|NAME,...]

A module missing on the device used to surface minutes in: ``torchdata`` (thread
workers) as a traceback after Ray's start and both ceilings. This imports each
module of MODULES (the package's imports on the synthetic dataset's path, the
experiments' and the NVML binding, which the package imports by name) and exits 1
with one line naming those that fail, 0 when all import. STAGE_MODULES adds the
modules of a stage that alone needs them (Ray Data and its pyarrow, a wheel of ~40 MB
the other stages do without) when ``--stages`` (gpu_check.sh's) selects it: by its
name, its call's, or all (the default). It needs nothing but the standard library, so
it runs before anything is installed. NOT_NEEDED lists what the package imports only
for other data sources or with a fallback; tests/test_gpu_check.py checks that the
lists cover every import of the package, and that STAGE_MODULES's words select what
experiments/gpu_plan.py selects.
"""

from __future__ import annotations

import argparse
import importlib
import sys

MODULES = (
    "torch", "torch.distributed", "torch.nn.parallel", "torch.utils.data",
    "torch._dynamo",  # the ranks' forkserver preloads it; --compile uses it
    "torchvision", "torchvision.io", "torchvision.transforms", "torchvision.datasets",
    "torchdata.nodes",  # thread workers
    "threadpoolctl",  # worker_threads, and the watch's thread pools
    "pynvml",  # NVML's per-process utilization (imported by name in nvml.py)
    "ray", "ray.tune", "ray.tune.schedulers", "ray.tune.search",
    "ray.util.scheduling_strategies",
    "optuna", "optuna.distributions",
    "PIL", "numpy", "pandas", "psutil",
    "matplotlib.axes", "matplotlib.backends.backend_agg", "matplotlib.figure", "matplotlib.lines",
)  # fmt: skip
# a stage: (the --stages words that select it, the modules only it imports)
STAGE_MODULES = {
    "raydata_scaling": (("raydata_scaling", "raydata", "all"), ("ray.data", "pyarrow")),
}
NOT_NEEDED = {
    "torchcodec": "the decoders fall back to torchvision.io without it",
    "datasets": "the Hugging Face source only",
    "huggingface_hub": "the Hugging Face source only",
    "pyarrow": "the Parquet and Hugging Face sources, and Ray Data (STAGE_MODULES)",
    "webdataset": "the WebDataset source only",
    "braceexpand": "brace patterns of shards (WebDataset, Parquet) only",
    "grpc": "the Ray Data engine's spill reading only (installed with ray)",
    "lightning": "Lightning's worker seeding, under Lightning only (skipped without it)",
    "lightning_fabric": "Lightning's worker seeding, under Lightning only (skipped without it)",
    **dict.fromkeys(
        (
            "botocore",
            "botocore.auth",
            "botocore.awsrequest",
            "botocore.config",
            "botocore.session",
            "urllib3",
        ),
        "data on S3 only (the s3 extra)",
    ),
}


def modules_for(stages: str) -> tuple[str, ...]:
    """MODULES, and the modules of the STAGE_MODULES that ``stages`` (gpu_check.sh's
    --stages: names, calls, all; comma-separated) selects."""
    words = set(stages.split(","))
    extra = [name for selected_by, modules in STAGE_MODULES.values()
             if words & set(selected_by) for name in modules]  # fmt: skip
    return MODULES + tuple(extra)


def missing(modules: tuple[str, ...] = MODULES) -> dict[str, str]:
    """The modules that do not import here, each with its error's last line."""
    found = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure to import is what we look for
            lines = str(exc).strip().splitlines()
            found[name] = f"{type(exc).__name__}: {lines[-1] if lines else ''}"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quiet", action="store_true", help="say nothing, only the status")
    parser.add_argument("--stages", default="all",
                        help="the stages run, as gpu_check.sh's (default all)")  # fmt: skip
    args = parser.parse_args()
    lacking = missing(modules_for(args.stages))
    if lacking and not args.quiet:
        print(f"not importable by {sys.executable}: " + "; ".join(
            f"{name} ({error})" for name, error in lacking.items()), file=sys.stderr)  # fmt: skip
    sys.exit(1 if lacking else 0)


if __name__ == "__main__":
    main()

"""The default command as a new user runs it, its whole output kept.

Runs ``python -m raytune_loader.search`` with an empty cache (the embedded dataset is
generated first, as on a fresh clone) and the results in a scratch folder, timing
it from the command to the summary, and writes its output, with a header saying how
it ran, to results/benchmarks/default_run.txt.

    python experiments/default_run.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS
from raytune_loader.machine import hardware


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "results"
        env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
        started = time.perf_counter()
        run = subprocess.run(
            [sys.executable, "-m", "raytune_loader.search", "--out", str(out)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        seconds = time.perf_counter() - started
    text = run.stdout.replace(str(cache), "<cache>").replace(str(out), "results")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    machine = hardware.cpu_and_gpu_summary()
    header = [
        f"# The default command at {commit} on {machine.get('cpu_model', '?')} "
        f"({hardware.usable_cpus()} usable CPUs), {time.strftime('%Y-%m-%d')}:",
        "#   XDG_CACHE_HOME=<an empty folder> python -m raytune_loader.search",
        f"# {seconds:.0f} s from the command to the summary (the dataset generated, then the "
        f"search); exit status {run.returncode}",
        "# $ XDG_CACHE_HOME=<cache> python -m raytune_loader.search",
    ]
    path = RESULTS / "default_run.txt"
    path.write_text("\n".join(header) + "\n" + text)
    print(text[-3000:])
    print(f"wrote {path} ({seconds:.0f} s)")
    if run.returncode:
        raise SystemExit(run.returncode)


if __name__ == "__main__":
    main()

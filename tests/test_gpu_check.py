"""experiments/gpu_check.sh and its plan: the GPU check runs end to end on a CPU (a dry
run of every stage's real command at tiny sizes, in the calls of the next device runs),
its calls fit the device's 8 minutes with the setup and the kill grace counted, its
results come back from the device, and it checks every module it needs first.

The GPU run is rare and short; these keep the script from rotting or wasting it.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import psutil
import pytest
import torch

from conftest import REPO, ray_processes
from raytune_loader import load_best_config
from raytune_loader.measuring import steady
from raytune_loader.search import get_args_parser, options_from_args
from raytune_loader.verdict import findings

sys.path.insert(0, str(REPO / "experiments"))
import compile_backoff  # noqa: E402 - experiments/ is not a package
import gpu_modules  # noqa: E402
import gpu_plan  # noqa: E402
import raydata_scaling  # noqa: E402

SCRIPT = REPO / "experiments" / "gpu_check.sh"
RATES = gpu_plan.Rates.load()


def _limits(stages: tuple[str, ...]) -> dict[str, gpu_plan.StageLimit]:
    return gpu_plan.device_limits(RATES, stages)


@pytest.mark.parametrize("call", list(gpu_plan.CALLS))
def test_each_call_fits_the_device_s_8_minutes_setup_and_kill_grace_included(call: str) -> None:
    stages = gpu_plan.CALLS[call]
    limits = _limits(stages)
    total = gpu_plan.call_total_s(limits, stages, RATES)
    grace = gpu_plan.KILL_AFTER_S + gpu_plan.PACK_S
    assert total == round(RATES.setup_s) + sum(limits[s].limit_s + grace for s in stages)
    assert total <= gpu_plan.BUDGET_S
    assert all(limits[s].margin_s > 0 for s in stages)


def test_the_second_call_keeps_room_to_rerun_the_bench() -> None:
    """A bench that failed in the first call runs again in the second, from the first
    call's search (--from): the search's own rerun is a first call again."""
    second = gpu_plan.CALLS["second"]
    room = gpu_plan.BUDGET_S - gpu_plan.call_total_s(_limits(second), second, RATES)
    bench = _limits(())["bench"]  # no dataset to generate: the second call's first did
    assert gpu_plan.rerun_s(RATES) == bench.worst_s
    assert room >= bench.worst_s


def test_the_calls_hold_what_the_next_device_run_must_answer() -> None:
    first, second = gpu_plan.CALLS["first"], gpu_plan.CALLS["second"]
    assert first == ("search", "bench")  # the winner standalone, in the search's session
    assert {"structures", "compile_backoff", "ranks_one_gpu"} <= set(second)
    assert set(gpu_plan.NEEDS_SEARCH) & set(second) <= {"structures"}  # read with --from
    # Ray Data: a search of its own, in a call of its own (no room beside the others)
    assert gpu_plan.CALLS["raydata"] == ("raydata_scaling",)
    assert "raydata_scaling" not in gpu_plan.NEEDS_SEARCH


def test_the_raydata_stage_is_a_4_cpu_trial_node_beside_12_cpus_for_the_actors() -> None:
    """The trial's node too few CPUs to feed the H200, the CPU node the machine's other
    cores; resnet50 in bf16 on the GPU, a trial at a time with the whole of it."""
    flags = [part for pair in gpu_plan.DEVICE["raydata_scaling"].items() for part in pair]
    args, opts = raydata_scaling.parse(flags)
    assert (args.trial_cpus, args.cpu_node_cpus, args.device) == (4, 12, "cuda")
    assert args.trial_cpus + args.cpu_node_cpus == gpu_plan.DEVICE_CORES
    assert (opts.model, opts.precision, opts.gpus_per_trial) == ("resnet50", "bf16", 1.0)
    assert opts.steps // 2 >= 2 * steady.HALF_BATCHES  # halves long enough to judge
    assert '"${raydata_scaling[@]}" --out "$work/raydata"' in SCRIPT.read_text()  # archived
    opts.for_device(True).validate()
    tiny = [part for pair in gpu_plan.DRY_RUN["raydata_scaling"].items() for part in pair]
    args, opts = raydata_scaling.parse([*tiny, "--out", "somewhere"])
    assert (args.trial_cpus, args.cpu_node_cpus, args.device) == (1, 1, "cpu")
    opts.for_device(False).validate()


def test_the_raydata_estimate_counts_the_cpu_node_and_each_pool_s_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two Ray Data trials (Ray's documented pipeline, the model's best) and two Ray Data
    runs a verification round: four pools of actors started, and the CPU node."""
    with_all = gpu_plan.raydata_scaling(gpu_plan.DEVICE, RATES)
    monkeypatch.setattr(gpu_plan, "RAYDATA_START_S", 0)
    assert with_all - gpu_plan.raydata_scaling(gpu_plan.DEVICE, RATES) == pytest.approx(40)
    monkeypatch.setattr(gpu_plan, "NODE_START_S", 0)
    assert with_all - gpu_plan.raydata_scaling(gpu_plan.DEVICE, RATES) == pytest.approx(50)


@pytest.mark.parametrize("words", [*gpu_plan.CALLS, "all", *gpu_plan.STAGES, "second,bench"])
def test_a_stage_s_own_modules_are_checked_when_it_is_selected(words: str) -> None:
    """ray.data (and its pyarrow) only when the raydata stage runs: the other calls'
    wheels need not carry pyarrow."""
    stages = gpu_plan.selected(words, dry_run=False)
    wanted = {name for stage in stages if stage in gpu_modules.STAGE_MODULES
              for name in gpu_modules.STAGE_MODULES[stage][1]}  # fmt: skip
    checked = gpu_modules.modules_for(words)
    assert set(checked) - set(gpu_modules.MODULES) == wanted
    assert set(gpu_modules.STAGE_MODULES) <= set(gpu_plan.STAGES)
    assert ("ray.data" in checked) == ("raydata_scaling" in stages)


def test_the_readme_s_totals_are_the_plan_s() -> None:
    readme = (REPO / "results" / "gpu" / "README.md").read_text()
    for call, stages in gpu_plan.CALLS.items():
        limits = _limits(stages)
        row = next(line for line in readme.splitlines() if line.startswith(f"| {call} |"))
        assert f"| {gpu_plan.call_total_s(limits, stages, RATES)} s" in row, row
        for name in stages:
            assert f"{name} ({limits[name].limit_s} s)" in row, (name, row)


def test_a_plan_whose_call_does_not_fit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_plan, "BUDGET_S", 300)
    errors = [line for line in gpu_plan.check_calls(RATES) if line.startswith("error:")]
    assert any("the first call takes up to" in line for line in errors)


def test_every_limit_has_a_floor_for_fixed_costs() -> None:
    """decoders_agree took 8 s against a limit of 9 last time, nearly all of it start-up:
    one slow CUDA start and it returned nothing. Now it takes one 10 s slower."""
    limits = _limits(())
    assert all(s.limit_s >= s.estimate_s + gpu_plan.FLOOR_S for s in limits.values())
    assert limits["decoders_agree"].limit_s >= 8 + 10


def test_the_search_estimate_counts_its_profile_at_the_trials_batch_and_the_probes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = dict(gpu_plan.DEVICE)
    with_all = gpu_plan.search(plan, RATES)
    tpe = gpu_plan.search({**plan, "search": {**plan["search"], "--search": "tpe"}}, RATES)
    profile = RATES.trial_s + RATES.profile_s_per_batch_sample * 256
    assert with_all - tpe == pytest.approx(profile)
    # the profile runs at the smallest batch: a larger one offered beside it adds trials'
    # ceilings, not a larger profile
    both = {**plan, "search": {**plan["search"], "--batch-sizes": "256,1024"}}
    both_tpe = {**both, "search": {**both["search"], "--search": "tpe"}}
    assert gpu_plan.search(both, RATES) - gpu_plan.search(both_tpe, RATES) == pytest.approx(profile)
    monkeypatch.setattr(gpu_plan, "PROBES", 0)
    assert gpu_plan.search(plan, RATES) < with_all


def test_the_search_s_window_is_long_enough_for_the_h200_s_ceiling() -> None:
    """Batch 256 at the bf16 + channels-last ceiling (4,700 samples/s): a window of
    WINDOW_S at least, halves long enough to judge steadiness; and one verification run
    short of the straggler probe's steps, as the estimate assumes."""
    opts = gpu_plan.search_options(gpu_plan.DEVICE["search"])
    assert opts.batch_sizes == (256,)
    assert opts.steps * 256 / RATES.ceiling_samples_per_s >= gpu_plan.WINDOW_S
    assert RATES.ceiling_samples_per_s >= 4600  # the rate the window is sized for
    assert opts.steps // 2 >= 2 * steady.HALF_BATCHES
    assert opts.steps * opts.verify_repeats < findings.MIN_STEPS


def test_the_bench_re_measures_with_the_search_s_own_steps() -> None:
    assert "--steps" not in gpu_plan.DEVICE["bench"]  # the bench reads the search's segment
    script = SCRIPT.read_text()
    bench = r'stage bench "\$py" -m raytune_loader\.bench --config "\$found/best_config'
    assert re.search(bench, script)


def test_the_segments_count_the_drain_before_their_window() -> None:
    """Every measurement trains warm-up + steady.in_flight(config) batches before its
    window: the estimates must count them (a window of 32 at the ceiling is 1.7 s; the
    drain of 16 workers at prefetch 2, 50 batches of 256, more than that)."""
    assert gpu_plan.best_drain(256) == 16 * 3 + 2
    assert gpu_plan._run_s(256, 3, 50, 32, 2000) == pytest.approx(85 * 256 / 2000)


def test_every_rate_says_where_it_comes_from() -> None:
    rates = json.loads(gpu_plan.RATES.read_text())["rates"]
    needed = {field for field in gpu_plan.Rates.__dataclass_fields__}
    assert needed <= set(rates)
    assert all(rates[name]["value"] > 0 and rates[name]["from"].strip() for name in needed)


def test_the_first_stage_of_a_call_generates_the_dataset() -> None:
    alone = _limits(("bench",))["bench"]
    after = _limits(("search", "bench"))["bench"]
    images = int(gpu_plan.IMAGES)
    generated = images / RATES.generate_images_per_s
    assert alone.estimate_s - after.estimate_s == pytest.approx(generated)


def test_the_device_search_is_valid_options() -> None:
    flags = [part for pair in gpu_plan.DEVICE["search"].items() for part in pair]
    options_from_args(get_args_parser().parse_args(flags)).validate()


@pytest.mark.parametrize(
    ("text", "stages"),
    [(None, ("search", "bench")), ("second", ("structures", "compile_backoff", "ranks_one_gpu")),
     ("second,bench", ("bench", "structures", "compile_backoff", "ranks_one_gpu")),
     ("limits,precision", ("precision", "limits")), ("raydata", ("raydata_scaling",))],
)  # fmt: skip
def test_stages_are_named_or_called_by_their_call(
    text: str | None, stages: tuple[str, ...]
) -> None:
    assert gpu_plan.selected(text, dry_run=False) == stages


def _package_imports() -> set[str]:
    names = set()
    for path in (REPO / "raytune_loader").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    return {n for n in names if n.split(".")[0] not in sys.stdlib_module_names
            and n.split(".")[0] not in ("raytune_loader", "__future__")}  # fmt: skip


def test_every_module_the_package_imports_is_checked_or_said_not_to_be_needed() -> None:
    checked = set(gpu_modules.MODULES)
    unaccounted = {
        name for name in _package_imports()
        if name.split(".")[0] not in gpu_modules.NOT_NEEDED
        and not any(name == m or name.startswith(m + ".") or m.startswith(name + ".")
                    for m in checked)
    }  # fmt: skip
    assert not unaccounted, f"add to gpu_modules.MODULES or NOT_NEEDED: {sorted(unaccounted)}"
    assert {"torchdata.nodes", "threadpoolctl", "pynvml", "ray.tune", "optuna"} <= checked


def test_a_module_that_does_not_import_is_named_with_its_error() -> None:
    lacking = gpu_modules.missing(("json", "no_such_module_of_the_gpu_check"))
    assert list(lacking) == ["no_such_module_of_the_gpu_check"]
    assert lacking["no_such_module_of_the_gpu_check"].startswith("ModuleNotFoundError: ")


@pytest.mark.slow
def test_without_torchdata_the_check_stops_before_any_stage_naming_it(tmp_path: Path) -> None:
    """The device's interpreter with everything but torchdata (a package on the path
    that fails to import, as a missing one does): one line, exit 2, nothing run."""
    broken = tmp_path / "path" / "torchdata"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('torchdata is not installed here')\n")
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--out", str(tmp_path / "out"),
         "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(tmp_path / "path")},
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "torchdata.nodes (ImportError: torchdata is not installed here)" in result.stderr
    assert ".whl/" in result.stderr and not (tmp_path / "work").exists()


def _stub_python(folder: Path, name: str) -> Path:
    """An interpreter that cannot import anything and logs how it was called."""
    folder.mkdir(exist_ok=True)
    stub = folder / name
    stub.write_text(f'#!/bin/sh\necho "{name} $*" >> "{folder}/calls"\nexit 1\n')
    stub.chmod(0o755)
    return stub


@pytest.mark.parametrize(("present", "python_env"), [("python3", None), ("py", "py")])
def test_an_interpreter_without_the_modules_or_wheels_is_said_in_one_line(
    tmp_path: Path, present: str, python_env: str | None
) -> None:
    bin_dir = tmp_path / "bin"
    _stub_python(bin_dir, present)
    for tool in ("dirname", "tail"):  # all it needs before then
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}  # no other python to be found
    if python_env:
        env["PYTHON"] = python_env
    result = subprocess.run(
        [shutil.which("bash"), str(SCRIPT), "--dry-run", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    calls = (bin_dir / "calls").read_text().splitlines()
    assert calls[0] == f"{present} experiments/gpu_modules.py --quiet --stages all"
    assert not (tmp_path / "out").exists()  # nothing ran


def _run_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, env=env or dict(os.environ, OUT=""))  # fmt: skip


def test_on_the_device_the_results_go_where_they_come_back() -> None:
    """Only what a command writes under $OUT returns from the device."""
    help_text = _run_check("--help").stdout
    readme = (REPO / "results" / "gpu" / "README.md").read_text()
    for text in (help_text, readme):
        assert '--out "$OUT/gpu"' in text
        assert "--from" in text  # how the second call finds the first call's search
    result = _run_check()  # no --out and no $OUT: where would the results go?
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert '--out "$OUT/gpu"' in result.stderr


@pytest.mark.slow
def test_a_second_search_beside_an_earlier_one_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "first_call.tar.gz"
    archive.write_bytes(b"")
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--stages", "search", "--from", str(archive),
         "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 2  # after the plan's table, the one line that says why
    assert result.stderr.splitlines()[-1].startswith("error: --from brings an earlier search")
    assert not (tmp_path / "out" / "gpu_check.tar.gz").exists()


def test_recompiles_are_counted_from_dynamo_s_own_log() -> None:
    """compile_backoff's count: dynamo's recompile records, as TORCH_LOGS=recompiles
    prints them; a new batch size after a back-off is a new shape."""
    counted = compile_backoff.Recompiles()
    logger = logging.getLogger("torch._dynamo")
    torch._logging.set_logs(recompiles=True)
    logger.addHandler(counted)
    try:
        torch._dynamo.reset()
        step = torch.compile(lambda x: (x * 2).sum(), backend="eager")
        for batch in (8, 4, 2):  # backing off: the second shape recompiles, dynamically
            step(torch.ones(batch, 3))
    finally:
        logger.removeHandler(counted)
        torch._logging.set_logs()
        torch._dynamo.reset()
    (reason,) = counted.reasons
    assert reason.startswith("Recompiling function") and "size mismatch" in reason


def _left_behind(ray_before: set[int]) -> set[int]:
    """Ray daemons started since, whose driver (the pid that ends their session's name)
    is gone: a search that did not shut its Ray down. Another user's live search on this
    machine does not count."""
    left = set()
    for pid in ray_processes() - ray_before:
        try:
            session = re.search(
                r"session_[\d-]+_[\d-]+_\d+_(\d+)", " ".join(psutil.Process(pid).cmdline())
            )
        except psutil.Error:
            continue  # ended meanwhile
        if session is None or not psutil.pid_exists(int(session.group(1))):
            left.add(pid)
    return left


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _dry_run(tmp_path: Path, name: str, *args: str) -> tuple[Path, Path, str]:
    """A dry run into tmp_path/name: (its out folder, its work folder, its stdout)."""
    out, work = tmp_path / name / "out", tmp_path / name / "work"
    # PYTHON: the tests' own interpreter, whether or not its virtual environment is active
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *args, "--out", str(out), "--work", str(work)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHON": sys.executable},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, work, result.stdout


def _came_back(out: Path) -> dict[str, bytes]:
    """What the device tool returns from $OUT/gpu: at most 8 files, 2 folders down."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(p.relative_to(out.parent).parts) <= 3 for p in files)
    return {p.name: p.read_bytes() for p in files}


@pytest.mark.slow
@pytest.mark.long
def test_the_dry_run_runs_both_calls_every_stage_and_brings_all_back(tmp_path: Path) -> None:
    kept = _digest(REPO / "results" / "gpu")
    ray_before = ray_processes()
    first_out, first_work, said = _dry_run(tmp_path, "first", "--stages", "first")
    assert "next: " in said and "--stages second --from" in said
    back = _came_back(first_out)
    assert set(back) == {"gpu_check.tar.gz", "stages.txt"}
    others = [s for s in gpu_plan.STAGES if s not in gpu_plan.CALLS["first"]]
    out, work, _ = _dry_run(tmp_path, "second", "--stages", ",".join(others),
                            "--from", str(first_out / "gpu_check.tar.gz"))  # fmt: skip
    stages = (out / "stages.txt").read_text()  # both calls' history: the archive brought it
    assert re.search(r"== setup: \d+s", stages)
    for name in gpu_plan.STAGES:
        assert f"== {name}: exit 0 after" in stages, name
    with tarfile.open(out / "gpu_check.tar.gz") as archive:
        packed = set(archive.getnames())
    assert {f"./{name}.log" for name in gpu_plan.STAGES} <= packed
    assert "./search/synthetic-imagenet/best_config.json" in packed  # from the first call
    assert not [n for n in packed if n.startswith("./cache") or "/tune" in n]
    assert "./raydata/synthetic-imagenet/best_config.json" in packed
    figures = {
        name: json.loads((work / f"{name}.json").read_text())
        for name in ("precision", "decoders_agree", "limits", "structures", "compile_backoff",
                     "ranks_one_gpu", "shared_gpu", "raydata_scaling")
    }  # fmt: skip
    bench = json.loads((first_work / "bench.json").read_text())
    assert bench["metrics"]["samples_per_s"]["median"] > 0 and bench["speedup"]
    assert set(figures["precision"]["median"]) == {"fp32", "tf32", "bf16"}  # no CUDA
    assert figures["decoders_agree"]["variants"]
    assert figures["limits"]["limit_samples_per_s"] > 0
    rows = figures["structures"]["structures"]
    assert rows
    assert all(row["samples_per_s"] and row["predicted_samples_per_s"] for row in rows.values())
    assert {"processes", "threads"} <= {key.split(", ")[2] for key in rows}
    assert figures["compile_backoff"]["failure"] is None
    assert figures["compile_backoff"]["recompiles"] == 0  # nothing runs out of memory here
    assert [r["backend"] for r in figures["ranks_one_gpu"]["ranks_joined"]] == ["gloo", "gloo"]
    assert -1 <= figures["shared_gpu"]["kendall_tau"] <= 1
    scaling = figures["raydata_scaling"]
    assert (scaling["setup"]["trial_node_cpus"], scaling["setup"]["cpu_node_cpus"]) == (1, 1)
    assert scaling["tuned_raydata"]["measured_samples_per_s"] > 0
    assert scaling["best_single_node_loader"]["measured_samples_per_s"] > 0
    assert scaling["device_decode"] is None  # no decoding on a device without one
    search = load_best_config(first_work / "search" / "synthetic-imagenet" / "best_config.json")
    assert search.data["ranks_per_node"] == 1
    assert not (first_work / "search" / "synthetic-imagenet" / "tune").exists()
    # one tiny dataset, in the scratch folder, read by every stage of a call
    for folder in (first_work, work):
        assert [p.name for p in (folder / "cache" / "raytune_loader").iterdir()] == [
            f"synthetic-imagenet-{gpu_plan.TINY_IMAGES}"
        ]
    assert _digest(REPO / "results" / "gpu") == kept
    assert not _left_behind(ray_before)

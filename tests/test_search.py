"""The command line: bad input gets one clear line and exit 2; a real search end to end."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from conftest import Searched, ray_processes, run_cli
from raytune_loader import load_best_config
from raytune_loader.outputs.console import limit_line
from raytune_loader.search import main


@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    (tmp_path / "empty" / "train").mkdir(parents=True)
    return tmp_path / "empty"


BAD_INPUT = [
    (["--dataset", "imagenet-22k"], "unknown dataset 'imagenet-22k'"),
    (["--dataset", "imagenet", "--data-root", "/nonexistent"], "does not exist"),
    (
        ["--dataset", "imagenet", "--data-root", "s3:/my-bucket/imagenet"],
        "for a bucket, write s3://my-bucket/imagenet",
    ),  # as pathlib.Path leaves it
    (["--dataset", "imagenet", "--data-root", "{empty}"], "no images under"),
    (["--dataset", "imagenet"], "needs --data-root"),
    (["--dataset", "cifar10", "--data-root", "{empty}"], "pass --download"),
    (["--dataset", "datasets_for_tests:not_a_dataset"], "not a map-style torch Dataset"),
    (["--dataset", "no_such_module:make"], "cannot import"),
    (["--model", "resnet9000"], "unknown model 'resnet9000'"),
    (["--num-samples", "0"], "--num-samples must be at least 1"),
    (["--steps", "-3"], "--steps must be at least 1"),
    (["--max-workers", "-1"], "--max-workers must be 0 or more"),
    (["--max-workers", "many"], "invalid int value"),
    (["--cpus-per-worker", "0"], "--cpus-per-worker must be positive"),
    (["--time-budget", "-5"], "--time-budget must be positive"),
    (["--trial-timeout", "0"], "--trial-timeout must be positive"),
    (["--gpus-per-trial", "1"], "this machine has 0 GPUs"),
    (["--batch-sizes", "32,0"], "batch sizes must be positive integers"),
    (["--batch-sizes", "32,abc"], "batch sizes must be positive integers"),
    (["--batch-size", "64", "--samples-per-trial", "32"], "must hold at least one batch"),
    (["--batch-sizes", "16,64", "--min-batch-size", "32"], "--min-batch-size (32) must not exceed"),
    (["--min-batch-size", "0"], "--min-batch-size must be at least 1"),
    (["--objective", "speed"], "invalid choice"),
    (["--out", "{file}/results"], "choose another --out"),
    (["--dashboard-host", "0.0.0.0"], "add --expose-dashboard to confirm"),
    (["--gpus-per-trial", "1.5"], "must be a whole number"),
    (
        [
            "--dataset",
            "datasets_for_tests:fast",
            "--batch-size",
            "300",
            "--samples-per-trial",
            "512",
        ],
        "fewer than one batch",
    ),  # fmt: skip
    (["--dataset", "datasets_for_tests:dict_samples"], "(input, target) pairs"),
    (["--precision", "fp8"], "invalid choice: 'fp8'"),
    (["--train-step", "no_such_module:make"], "cannot import 'no_such_module'"),
    (["--train-step", "datasets_for_tests:make_step", "--model", "resnet18"], "drop --model"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, empty_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    before = ray_processes()
    (tmp_path / "file").write_text("")
    argv = [a.format(empty=empty_dir, file=tmp_path / "file") for a in argv]
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(argv if "--out" in argv else [*argv, "--out", str(tmp_path / "o")]))
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and message in err
    assert ray_processes() <= before  # rejected before Ray starts
    # nothing left behind: not the results folder the search would have written in
    assert "--out" in argv or not (tmp_path / "o").exists()


# The real search end to end, once per session (conftest.searched), read by one test per
# behaviour: the name of a failing test says what broke.


def _best(searched: Searched) -> dict:
    return json.loads((searched.folder / "best_config.json").read_text())


def _trials(searched: Searched) -> list[dict[str, str]]:
    with open(searched.folder / "trials.csv") as handle:
        return list(csv.DictReader(handle))


def test_the_dashboard_url_is_printed_before_the_first_trial_ends(searched: Searched) -> None:
    out = searched.result.stdout
    assert out.index("Ray dashboard: http://127.0.0.1:") < out.index("[1/4]")


def test_the_output_names_the_job_and_ends_with_the_table_and_the_limit(
    searched: Searched,
) -> None:
    out, best = searched.result.stdout, _best(searched)
    assert "small-cnn, tf32 on synthetic-imagenet, batch 8 on cpu" in out
    assert re.search(r"^tuned\s+\d", out, re.M) and re.search(r"^pytorch-default\s+0", out, re.M)
    assert limit_line(best["limit"], bool(best.get("what_if"))) in out  # in its bound's words


def test_best_config_json_has_the_contract_s_keys_at_schema_version_1(
    searched: Searched,
) -> None:
    best = _best(searched)
    for key in ("schema_version", "dataset", "model", "objective", "loader", "metrics",
                "baselines", "speedup", "hardware", "search", "created"):  # fmt: skip
        assert key in best
    assert best["schema_version"] == 1 and best["model"] == "small-cnn"
    assert best["hardware"]["usable_cpus"] >= 1 and best["search"]["trials"] == 4
    assert 0.0 <= best["hardware"]["cpu_steal_frac"] <= 1.0  # this machine's, while it ran


def test_best_config_json_records_the_job_its_pipeline_and_the_trainers(
    searched: Searched,
) -> None:
    best = _best(searched)
    assert best["job"]["precision"] == "tf32" and best["job"]["requested_batch_size"] == 8
    assert best["pipeline"]["transfer"] in ("float32", "uint8")  # its pipeline was searched
    assert best["pipeline"]["decode"] in ("pil", "tensor")  # not "device": no CUDA here
    assert set(best["trainers"]["checked"]) == {"lightning", "accelerate", "ray_train",
                                                "torchrun_ddp", "hf_trainer"}  # fmt: skip


def test_the_limit_compares_the_input_pipeline_alone_with_training(searched: Searched) -> None:
    best = _best(searched)
    limit = best["limit"]  # the winner's input pipeline alone, beside training
    assert limit["bound"] in ("input", "shared", "model", "contended")
    assert limit["input_samples_per_s"] > 0
    assert (limit["bound"] == "contended") == (
        limit["headroom"] >= 0.15
        and limit["data_wait_frac"] < 0.25
        and limit["ceiling_share"] < 0.8
    )
    assert (limit["bound"] == "shared") == (
        limit["headroom"] >= 0.15 and limit["data_wait_frac"] >= 0.25
    )
    assert limit["headroom"] == pytest.approx(
        limit["input_samples_per_s"] / metrics_median(best) - 1
    )


def test_the_winner_s_metrics_are_its_verification_runs_against_the_ceiling(
    searched: Searched,
) -> None:
    metrics = _best(searched)["metrics"]
    assert metrics["util_source"] == "step-timing"
    # --verify-repeats 2; where not, the search's own words say which runs it kept
    assert len(metrics["samples_per_s"]["values"]) == 2, searched.result.stdout[-4000:]
    assert metrics["samples_per_s"]["min"] <= metrics["samples_per_s"]["median"] > 0
    assert metrics["ceiling_samples_per_s"] > 0
    assert "too low" in metrics.get("ceiling_note", "") or 0 < metrics["efficiency"]["median"] <= 1


def test_both_baselines_are_measured_and_the_speedup_over_them_given(searched: Searched) -> None:
    best = _best(searched)
    assert set(best["baselines"]) == {"pytorch-default", "heuristic"}
    assert best["baselines"]["pytorch-default"]["loader"]["num_workers"] == 0
    assert best["speedup"]["vs_pytorch_default"] > 0


def test_trials_csv_has_every_trial_with_its_node_and_its_reservation(
    searched: Searched,
) -> None:
    rows, usable = _trials(searched), _best(searched)["hardware"]["usable_cpus"]
    assert len(rows) == 4
    assert {r["baseline"] for r in rows} >= {"pytorch-default", "heuristic"}
    assert all(r["node_id"] and r["status"] in ("ok", "stopped_early") for r in rows)
    for row in rows:
        assert float(row["cpus_reserved"]) == min(1 + int(row["num_workers"]), usable)


def test_the_report_says_where_the_limit_is(searched: Searched) -> None:
    assert "## Where the limit is" in (searched.folder / "report.md").read_text()


def test_the_default_dataset_gives_no_finding_and_every_place_says_so(searched: Searched) -> None:
    """The summary line, the report's Findings with its plot, the JSON's list, and what
    was watched in the winner's runs, the probe's epoch start beside its own. The one
    finding such data may call for: 96 images are an epoch of a fraction of a second,
    which a winner that starts its worker processes again each epoch may take longer to
    start than to train."""
    best = _best(searched)
    tuned = load_best_config(searched.folder / "best_config.json").loader
    restarts = tuned.num_workers > 0 and tuned.workers == "process" and not tuned.persistent_workers
    kinds = [f["kind"] for f in best["findings"]]
    assert kinds in ([], ["epoch_start"] if restarts else [])
    if kinds:
        assert best["findings"][0]["fix"].startswith("persistent_workers=True saves")
    else:
        assert "no findings:" in searched.result.stdout
    assert "epoch start:" in searched.result.stdout
    report = (searched.folder / "report.md").read_text()
    assert "## Findings" in report and "(plots/memory.png)" in report
    assert (searched.folder / "plots" / "memory.png").stat().st_size > 0
    watch = best["watch"]
    assert watch["runs"] == 2, searched.result.stdout[-4000:]
    assert watch["first_batch_s"] > 0 and watch["memory"]["series"]
    if tuned.num_workers and tuned.workers == "process":  # the other setting was probed
        assert None not in watch["epoch_start_s"].values()


def test_a_finished_search_leaves_nothing_to_resume(searched: Searched) -> None:
    assert not (searched.folder / "last_search.json").exists()
    assert not (searched.folder / "trials.partial.csv").exists()


def test_tune_s_experiment_folder_stays_readable(searched: Searched) -> None:
    """With TensorBoard event files per trial."""
    from ray.tune import ExperimentAnalysis

    (experiment,) = (searched.folder / "tune").glob("search-*")
    assert len(ExperimentAnalysis(str(experiment)).trials) == 4
    assert list(experiment.glob("trial_fn_*/events.out.tfevents.*"))


def test_load_best_config_gives_back_the_tuned_loader(searched: Searched) -> None:
    loaded = load_best_config(searched.folder / "best_config.json")
    assert loaded.loader.kwargs() == _best(searched)["loader"]


def test_ray_is_shut_down_and_nothing_left_behind(searched: Searched) -> None:
    assert ray_processes() <= searched.ray_before


@pytest.mark.slow
@pytest.mark.parametrize("data", ["broken", "a corrupt file", "a corrupt file, tpe"])
def test_a_dataset_that_always_fails_ends_with_its_reason_in_one_line(
    data: str, tmp_path: Path, tiny_imagenet: Path
) -> None:
    """A dataset that always raises ends the search with its reason in one line (exit 1,
    at the ceiling, the first to read a batch). An image folder (given relative to the
    command's folder, as the trials are not) whose last file is text named .JPEG: the
    ceiling's batch reads; the model-guided search's profile reads the file and ends the
    search there, before any trial, with exit 2 naming it and what to do; a search
    without a profile (tpe) has every trial fail on that file and ends the same way
    after them, nothing left to resume, the partial trials kept."""
    import shutil

    before = ray_processes()
    dataset = ["--dataset", "datasets_for_tests:broken"]
    if data.startswith("a corrupt file"):
        for folder in sorted((tiny_imagenet / "train").iterdir())[:2]:
            shutil.copytree(folder, tmp_path / "photos" / folder.name)
        bad = sorted((tmp_path / "photos").rglob("*.JPEG"))[-1]
        bad.write_text("not a JPEG")
        dataset = ["--dataset", "imagefolder", "--data-root", "photos"]
        dataset += ["--search", "tpe"] if data.endswith("tpe") else []
    out = tmp_path / "results"
    result = run_cli(
        *dataset, "--num-samples", "2", "--batch-size", "8",
        "--steps", "4", "--report-every", "2", "--samples-per-trial", "24",
        "--out", str(out), cwd=tmp_path,
    )  # fmt: skip
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    if data == "broken":
        assert result.returncode == 1
        assert "ValueError: sample" in last and "is broken" in last
    elif data.endswith("tpe"):
        assert result.returncode == 2, result.stderr
        assert f"every configuration failed on a corrupt sample {bad}: " in last
        assert "remove or replace that file and run the search again" in last
        assert not list(out.rglob("last_search.json")) and list(out.rglob("trials.partial.csv"))
        assert "rounds: every run failed" in result.stdout + result.stderr
    else:
        assert result.returncode == 2, result.stderr
        assert last.startswith(f"error: the profile read a corrupt sample {bad}: "), last
        assert last.endswith("remove or replace that file and run the search again")
        assert not list(out.rglob("trials*.csv")), "no trial ran"
        assert not list(out.rglob("last_search.json")), "nothing to resume"
        assert "Searching" not in result.stdout
    assert ray_processes() <= before


def metrics_median(best: dict) -> float:
    return best["metrics"]["samples_per_s"]["median"]


def test_the_study_opens_in_optuna_dashboard_with_every_trial_and_the_best_value(
    searched: Searched,
) -> None:
    """study.journal holds one Optuna trial per trials.csv row, its parameters as the
    row's, its state as the row's status; optuna-dashboard's own server (its WSGI app,
    as ``optuna-dashboard study.journal`` runs it) lists the study with the CSV's best."""
    import io
    from wsgiref.util import setup_testing_defaults

    optuna = pytest.importorskip("optuna")
    dashboard = pytest.importorskip("optuna_dashboard")
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = searched.folder / "study.journal"
    with open(searched.folder / "trials.csv") as handle:
        rows = {row["trial_id"]: row for row in csv.DictReader(handle)}
    storage = JournalStorage(JournalFileBackend(str(path)))
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    objective = study.user_attrs["objective"]
    assert {t.user_attrs["trial_id"] for t in study.trials} == set(rows)
    states = {"ok": "COMPLETE", "stopped_early": "PRUNED"}
    for trial in study.trials:
        row = rows[trial.user_attrs["trial_id"]]
        assert trial.state.name == states.get(row["status"], "FAIL")
        params = {k: "" if v is None else str(v) for k, v in trial.params.items()}
        assert params == {k: row[k] for k in trial.params}
    best_csv = max(float(r[objective]) for r in rows.values() if r["status"] == "ok")
    assert study.best_value == pytest.approx(best_csv)

    def get(route: str) -> dict:
        environ: dict = {"PATH_INFO": route, "REQUEST_METHOD": "GET"}
        setup_testing_defaults(environ)
        environ["wsgi.input"] = io.BytesIO()
        answer: list[str] = []
        body = dashboard.wsgi(str(path))(environ, lambda status, headers, *_: answer.append(status))
        assert answer[0].startswith("200"), (route, answer)
        return json.loads(b"".join(body))

    (listed,) = get("/api/studies")["study_summaries"]
    assert listed["study_name"] == summary.study_name
    shown = get(f"/api/studies/{listed['study_id']}")
    assert len(shown["trials"]) == len(rows)  # the dashboard's trial list, as the CSV
    assert [t["values"] for t in shown["best_trials"]] == [[pytest.approx(best_csv)]]

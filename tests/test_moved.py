"""The 0.1 module paths, kept for one release: old imports and old search folders work.

``fixtures/search_made_by_0_1`` is a search folder that raytune_loader 0.1 (the flat
layout, commit f1dda73) left when it was interrupted after two of three trials:

    python -m raytune_loader.search --dataset synthetic-imagenet --data-root DATA \\
        --synthetic-images 96 --num-samples 3 --batch-size 8 --steps 6 --warmup-steps 1 \\
        --report-every 3 --samples-per-trial 64 --verify-top 1 --verify-repeats 1 --out OUT

then Ctrl-C once the second trial was done. Tune pickled its searcher (the cost model,
the profile, the space) and its callbacks by their 0.1 module paths.
"""

from __future__ import annotations

import csv
import json
import os
import pickle
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import REPO, TESTS, ray_processes, ray_processes_left
from raytune_loader import _moved
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.tuning.costmodel import CostModel
from raytune_loader.tuning.space import SearchSpace

FOLDER = TESTS / "fixtures" / "search_made_by_0_1" / "synthetic-imagenet"
ARGS = (
    "--dataset", "synthetic-imagenet", "--synthetic-images", "96", "--num-samples", "3",
    "--batch-size", "8", "--steps", "6", "--warmup-steps", "1", "--report-every", "3",
    "--samples-per-trial", "64", "--verify-top", "1", "--verify-repeats", "1",
)  # fmt: skip


def test_an_old_path_of_a_module_moved_whole_is_its_new_home() -> None:
    """In a fresh process, each old path imports as the new module itself (so a patch on
    either reaches both), and says where it went."""
    code = (
        "import importlib, json, warnings; from raytune_loader import _moved\n"
        "found = {}\n"
        "for old, new in _moved.MOVED.items():\n"
        "    with warnings.catch_warnings(record=True) as said:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(f'raytune_loader.{old}')\n"
        "    same = module is importlib.import_module(f'raytune_loader.{new}')\n"
        "    told = [str(w.message) for w in said if w.category is DeprecationWarning]\n"
        "    found[old] = [same, told]\n"
        "print(json.dumps(found))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=240, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(found) == sorted(_moved.MOVED)
    for old, (same, said) in found.items():
        new = _moved.MOVED[old]
        assert same, old
        assert (
            f"raytune_loader.{old} is raytune_loader.{new} since 0.2; the old path goes in 0.3"
            in said
        )


def test_an_old_path_of_a_split_module_finds_each_name_in_its_new_home() -> None:
    from raytune_loader.candidates.rules import RULES
    from raytune_loader.loaders.streams import StreamLoader
    from raytune_loader.measuring.measurer import LocalMeasurer
    from raytune_loader.measuring.segment import train_segment
    from raytune_loader.outputs.reader import load_best_config
    from raytune_loader.verdict.verify import verify

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from raytune_loader import measure, results, space, streams  # noqa: F401
        from raytune_loader import verify as old_verify

    assert space.LoaderConfig is LoaderConfig and space.SearchSpace is SearchSpace
    assert space.RULES is RULES
    assert measure.train_segment is train_segment
    assert streams.StreamLoader is StreamLoader
    assert results.load_best_config is load_best_config
    assert old_verify.verify is verify and old_verify.LocalMeasurer is LocalMeasurer
    from raytune_loader import to_device
    from raytune_loader.pipeline import to_device as taught  # 0.1's docs/raydata.md taught it

    assert taught is to_device
    with pytest.raises(AttributeError, match="has no attribute 'nothing_of_the_kind'"):
        space.nothing_of_the_kind  # noqa: B018


def _searcher_state() -> Path:
    (state,) = FOLDER.glob("tune/search-*/searcher-state-*.pkl")
    return state


def test_the_searcher_tune_saved_in_0_1_unpickles_into_today_s_classes() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        state = pickle.loads(_searcher_state().read_bytes())
    assert isinstance(state["_space"], SearchSpace) and isinstance(state["_model"], CostModel)
    assert state["_space"].baselines()["heuristic"] == LoaderConfig(8, 2, 2, False, True)
    assert state["_model"].predict(LoaderConfig(8, 2, 2)) is not None  # a working model


def test_a_searcher_0_1_saved_predicts_again_however_tune_brings_it_back() -> None:
    """On --resume Tune unpickles the searcher whole (0.1's attributes: its predictions
    as floats, no Prediction cache) and restores the state it saved: either way, the
    search goes on proposing with the model's predictions."""
    from raytune_loader.tuning.searcher import LoaderSearcher

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        state = pickle.loads(_searcher_state().read_bytes())
        restored = LoaderSearcher(state["_space"], "samples_per_s", method="model",
                                  model=state["_model"])  # fmt: skip
        restored.restore(str(_searcher_state()))
        as_0_1 = LoaderSearcher.__new__(LoaderSearcher)
        as_0_1.__dict__.update(state)  # what tuner.pkl holds: 0.1's instance
        whole = pickle.loads(pickle.dumps(as_0_1))
    for searcher in (restored, whole):
        assert "_predictions" not in searcher.__dict__
        assert searcher._predicted(LoaderConfig(8, 2, 2)) is not None  # noqa: SLF001
        config = searcher.suggest("after-resume")
        assert isinstance(config, dict) and config["predicted_samples_per_s"] > 0


def test_without_the_old_paths_the_saved_searcher_does_not_unpickle() -> None:
    """The aliases are what the unpickling above rests on: taken away, it fails."""
    code = (
        "import pickle, sys; import raytune_loader; from raytune_loader import _moved\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _moved._OldPaths)]\n"
        f"pickle.loads(open({str(_searcher_state())!r}, 'rb').read())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert out.returncode != 0
    assert "No module named 'raytune_loader." in out.stderr


@pytest.mark.slow
@pytest.mark.alone
def test_resume_continues_a_search_folder_that_0_1_left(
    tmp_path: Path, tiny_imagenet: Path
) -> None:
    """``--resume`` on the folder 0.1 left: its two trials kept, not run again, the third
    run, verified, and the result written; no Ray process left."""
    out = tmp_path / "results"
    folder = out / "synthetic-imagenet"
    shutil.copytree(FOLDER, folder)
    pointer = json.loads((folder / "last_search.json").read_text())
    pointer["storage"] = str(folder / "tune")  # where this copy lives
    (folder / "last_search.json").write_text(json.dumps(pointer))
    with open(folder / "trials.partial.csv") as handle:
        kept = {row["trial_id"] for row in csv.DictReader(handle) if row["status"] == "ok"}
    assert len(kept) == 2
    before = ray_processes()
    result = subprocess.run(
        [sys.executable, "-m", "raytune_loader.search", *ARGS,
         "--data-root", str(tiny_imagenet), "--out", str(out), "--resume"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no interrupted search" not in result.stderr  # it resumed, it did not start anew
    with open(folder / "trials.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 3 and kept <= {r["trial_id"] for r in rows}
    assert all(r["status"] in ("ok", "stopped_early") for r in rows)
    assert len(list(folder.glob("tune/search-*/trial_fn_*"))) == 3  # none run twice
    best = json.loads((folder / "best_config.json").read_text())
    # the folder's trials ran on the machine that made it: on another hardware class
    # (their node gone) they are kept but not verified, and the result is this machine's
    (new,) = [r for r in rows if r["trial_id"] not in kept]
    here = [r for r in rows if r["hardware_class"] == new["hardware_class"]]
    assert best["search"]["trials"] == len(here)
    if len(here) < len(rows):
        assert "ran on nodes no longer in the cluster" in result.stdout + result.stderr
    assert not (folder / "last_search.json").exists()
    assert not ray_processes_left(before)

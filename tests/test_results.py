from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from raytune_loader import ConfigError, HardwareMismatchWarning, load_best_config
from raytune_loader.errors import OutputError
from raytune_loader.files import atomic_write_text, ensure_writable
from raytune_loader.machine.hardware import cpu_and_gpu_summary
from raytune_loader.outputs.reader import REQUIRED_KEYS


def _best(**overrides: object) -> dict:
    data = {
        "schema_version": 1,
        "dataset": "synthetic-imagenet",
        "model": "small-cnn",
        "objective": "util",
        "loader": {
            "batch_size": 8,
            "num_workers": 1,
            "prefetch_factor": 4,
            "pin_memory": False,
            "persistent_workers": True,
        },
        "metrics": {},
        "baselines": {},
        "speedup": {},
        "hardware": cpu_and_gpu_summary(),
        "search": {},
        "created": "2026-11-29T00:00:00+00:00",
    }
    data.update(overrides)
    return data


def test_round_trip_builds_the_tuned_dataloader(tmp_path: Path) -> None:
    path = tmp_path / "best_config.json"
    path.write_text(json.dumps(_best()))
    best = load_best_config(path)
    dataset = TensorDataset(torch.randn(20, 3), torch.arange(20))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same machine: no warning
        loader = best.dataloader(dataset)
    assert (loader.batch_size, loader.num_workers, loader.prefetch_factor) == (8, 1, 4)
    assert loader.persistent_workers is True and loader.pin_memory is False
    assert sum(len(x) for x, _ in loader) == 20  # users get every sample: drop_last off


def test_warns_on_another_machine(tmp_path: Path) -> None:
    path = tmp_path / "best_config.json"
    hardware = {**cpu_and_gpu_summary(), "usable_cpus": 512, "gpu_name": "NVIDIA H200"}
    path.write_text(json.dumps(_best(hardware=hardware)))
    with pytest.warns(HardwareMismatchWarning, match="usable_cpus: tuned on 512"):
        load_best_config(path).dataloader(TensorDataset(torch.zeros(4)))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must hold a JSON object"),
        (json.dumps({"schema_version": 1}), "lacks"),
        (json.dumps(_best(schema_version=2)), "schema_version 2"),
        (json.dumps(_best(loader={"batch_size": 8, "num_workers": "__import__('os')"})), "loader"),
        (json.dumps(_best(loader={"batch_size": -1})), "batch_size must be a positive integer"),
        (json.dumps(_best(loader={"batch_size": 8, "evil": 1})), "unknown loader keys"),
        (json.dumps(_best(loader="batch_size=8")), "must be JSON objects"),
    ],
)
def test_malformed_or_hand_edited_files_are_refused(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "best_config.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_best_config(path)


def test_missing_file_says_to_run_the_search(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="run the search first"):
        load_best_config(tmp_path / "nope.json")


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path: Path) -> None:
    path = tmp_path / "best_config.json"
    atomic_write_text(path, "old")

    with pytest.raises(TypeError):
        atomic_write_text(path, 42)  # type: ignore[arg-type]
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["best_config.json"]  # no temp file left


def test_unwritable_output_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputError, match="choose another --out"):
        ensure_writable(blocker / "results")


def test_every_field_of_a_configuration_survives_the_json(tmp_path: Path) -> None:
    """best_config.json's loader and pipeline sections, read back, give the same
    configuration, whichever fields differ from their defaults."""
    from raytune_loader.candidates.config import LoaderConfig

    tuned = LoaderConfig(
        16, num_workers=3, prefetch_factor=4, pin_memory=True, in_order=False,
        transfer="uint8", decode="tensor", workers="thread",
    )  # fmt: skip
    path = tmp_path / "best_config.json"
    best = {key: {} for key in REQUIRED_KEYS}
    best.update(schema_version=1, loader=tuned.kwargs(), pipeline=tuned.pipeline())
    path.write_text(json.dumps(best))
    assert load_best_config(path).loader == tuned


RAYDATA = {"batch_size": 8, "min_actors": 1, "max_actors": 3, "cpus_per_actor": 1.0,
           "map_batch_size": 8, "prefetch_batches": 2, "crosses": "uint8", "decoder": "tensor",
           "object_store_bytes": None, "block_bytes": None,
           "locality_with_output": False}  # fmt: skip


def test_a_raydata_section_reads_back_without_ray_and_gives_its_iteration_arguments(
    tmp_path: Path,
) -> None:
    """The chosen Ray Data pipeline is read and checked without importing Ray; its
    iteration arguments are the trial's, on the host; a file without one says how to get
    one."""
    import subprocess
    import sys

    path = tmp_path / "best_config.json"
    section = {"chosen": True, "config": RAYDATA}
    path.write_text(json.dumps(_best(engine="raydata", raydata=section)))
    code = (f"import sys; from raytune_loader import load_best_config; "
            f"b = load_best_config({str(path)!r}); "
            "print(b.engine, b.raydata.max_actors, b.raydata.decode, "
            "'ray' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["raydata", "3", "tensor", "False"]
    arguments = load_best_config(path).iteration_arguments()
    assert (arguments["batch_size"], arguments["prefetch_batches"]) == (8, 2)
    assert (arguments["device"], arguments["drop_last"]) == ("cpu", True)
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(_best()))
    assert load_best_config(plain).raydata is None and load_best_config(plain).engine == (
        "dataloader"
    )
    with pytest.raises(ConfigError, match="no raydata section.*--ray-data"):
        load_best_config(plain).iteration_arguments()


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ({"config": {**RAYDATA, "max_actors": 0}}, "invalid raydata section: max_actors must be"),
        ({"config": {**RAYDATA, "num_workers": 2}}, "unknown Ray Data keys ['num_workers']"),
        ({"chosen": True}, "'raydata' must hold a 'config' object"),
    ],
)
def test_a_broken_raydata_section_is_refused_in_one_line(
    tmp_path: Path, section: dict, says: str
) -> None:
    path = tmp_path / "best_config.json"
    path.write_text(json.dumps(_best(raydata=section)))
    with pytest.raises(ConfigError) as refused:
        load_best_config(path)
    assert says in str(refused.value) and "\n" not in str(refused.value)

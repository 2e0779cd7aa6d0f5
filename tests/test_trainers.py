"""The tuned loader in the trainers people use, each driven the README's way, with two
ranks on the CPU (gloo): Lightning's Trainer (strategy="ddp"), accelerate and a plain
DDP loop under torchrun, and Ray Train's TorchTrainer. For worker processes (decoding
on the device) and thread workers (decoding to tensors), each rank must read its own
half of the data once per epoch, a new half each epoch, with the tuned settings, and
train on images finished on the device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, TESTS, ray_processes

SCRIPTS = TESTS / "trainers"
sys.path.insert(0, str(SCRIPTS))
from common import EPOCHS, SETTINGS, TUNED, write_tuned_config  # noqa: E402

pytestmark = pytest.mark.slow
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2")


def _train(command: tuple[str, ...], out: Path, timeout: float = 300) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPTS), str(REPO)])}
    result = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True,
                            timeout=timeout)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]


def _check(out: Path, kind: str, trainer_types: set[str]) -> None:
    """What both ranks read, and with what, for one kind of loader."""
    ranks = [json.loads((out / f"{kind}-rank{r}.json").read_text()) for r in (0, 1)]
    for epoch in map(str, range(EPOCHS)):
        zero, one = (rank["epochs"][epoch] for rank in ranks)
        assert len(zero) == len(one) == 48, (kind, epoch)  # 96 images, half each
        assert set(zero).isdisjoint(one), (kind, epoch)  # no sample on both ranks
        assert set(zero) | set(one) == set(range(96)), (kind, epoch)  # all of them
        assert len(set(zero)) == 48  # each once
    assert set(ranks[0]["epochs"]["0"]) != set(ranks[0]["epochs"]["1"])  # reshuffled
    tuned = TUNED[kind]["loader"]
    for rank in ranks:
        seen = rank["loader"]
        assert seen["type"] in trainer_types, seen
        assert seen["inner"] in ("TunedDataLoader", "DataLoaderShard", "ThreadLoader"), seen
        for name in SETTINGS:  # what runs is what was tuned
            if name != "persistent_workers" or kind == "process":
                assert seen[name] == tuned[name], (name, seen)
        pids = {int(reader.split(":")[0]) for reader in rank["readers"]}
        threads = {reader.split(":")[1] for reader in rank["readers"]}
        if kind == "process":  # read in worker processes
            assert rank["pid"] not in pids
        else:  # read in threads of the rank's own process, not the training loop's
            assert pids == {rank["pid"]} and rank["trainer_thread"] not in threads
        assert rank["images"] == ["torch.float32 (3, 224, 224) True"]  # normalized there


@pytest.fixture
def tuned_configs(tmp_path: Path) -> Path:
    for kind in TUNED:
        write_tuned_config(tmp_path, kind)
    return tmp_path


def test_lightning_ddp_gives_each_rank_its_own_half(
    tuned_configs: Path, tiny_imagenet: Path
) -> None:
    script = str(SCRIPTS / "lightning_ddp.py")
    _train((sys.executable, script, str(tuned_configs), str(tiny_imagenet / "train")),
           tuned_configs)  # fmt: skip
    for kind in TUNED:
        _check(tuned_configs, kind, {"TunedDataLoader", "ThreadLoader"})


def test_accelerate_gives_each_rank_its_own_half(tuned_configs: Path, tiny_imagenet: Path) -> None:
    script = str(SCRIPTS / "accelerate_run.py")
    _train((*TORCHRUN, script, str(tuned_configs), str(tiny_imagenet / "train")), tuned_configs)
    _check(tuned_configs, "process", {"DataLoaderShard"})  # accelerate shards it, as tuned
    _check(tuned_configs, "thread", {"ThreadLoader"})  # passed through: it shards itself


def test_a_torchrun_ddp_loop_gives_each_rank_its_own_half(
    tuned_configs: Path, tiny_imagenet: Path
) -> None:
    script = str(SCRIPTS / "ddp_loop.py")
    _train((*TORCHRUN, script, str(tuned_configs), str(tiny_imagenet / "train")), tuned_configs)
    for kind in TUNED:
        _check(tuned_configs, kind, {"TunedDataLoader", "ThreadLoader"})


def test_ray_train_gives_each_rank_its_own_half(tuned_configs: Path, tiny_imagenet: Path) -> None:
    before = ray_processes()
    script = str(SCRIPTS / "ray_train_run.py")
    _train((sys.executable, script, str(tuned_configs), str(tiny_imagenet / "train")),
           tuned_configs, timeout=400)  # fmt: skip
    for kind in TUNED:
        _check(tuned_configs, kind, {"_WrappedDataLoader"})  # kept, only wrapped
    assert ray_processes() <= before  # its Ray is shut down


def test_the_versions_best_config_names_are_the_ones_these_tests_ran() -> None:
    from importlib.metadata import version

    from raytune_loader.trainers import CHECKED

    for name, series in CHECKED.items():
        installed = ".".join(version(name).split(".")[:2])
        assert installed == series, f"{name} {installed} is installed, CHECKED says {series}"

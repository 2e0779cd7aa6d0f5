"""The tuned loader in the trainers people use, each driven the README's way, with two
ranks on the CPU (gloo): Lightning's Trainer (strategy="ddp"), accelerate and a plain
DDP loop under torchrun, and Ray Train's TorchTrainer. For worker processes (decoding
on the device) and thread workers (decoding to tensors), each rank must read its own
half of the data once per epoch, a new half each epoch, with the tuned settings, and
train on images finished on the device.

Tuned streams (webdataset shards and Parquet files of 20, 20 and 4 samples) in the
same trainers and in ranks started by ``torch.multiprocessing.spawn``, with fork,
spawn, forkserver and thread workers: every rank reads as many batches as every other
every epoch (a DDP step on each, so a rank with one more would hang or fail within
the time limit), disjoint samples covering the epoch but for its cut, in another
order in the second epoch. The cases of one launcher share one launch."""

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


@pytest.mark.parametrize("trainer", ["lightning", "accelerate", "ray-train"])
def test_a_bucket_s_images_give_each_rank_its_own_half_in_every_trainer(
    trainer: str, tiny_imagenet: Path, tmp_path: Path
) -> None:
    """The image folder in S3 (moto's server, 20 ms to each first byte): the tuned
    worker processes with 4 requests in flight, in each trainer the README's way. Each
    rank reads its own half once an epoch, and the bucket is listed once for the job
    (rank 0 lists, the other takes its listing), not once a rank."""
    from s3_for_tests import S3Server, environment

    pytest.importorskip("moto")
    store = {"scheme": "s3", "bucket": "trainers", "ttfb_p50_s": 0.02}
    write_tuned_config(tmp_path, "process", store)
    scripts = {"lightning": (sys.executable, str(SCRIPTS / "lightning_ddp.py")),
               "accelerate": (*TORCHRUN, str(SCRIPTS / "accelerate_run.py")),
               "ray-train": (sys.executable, str(SCRIPTS / "ray_train_run.py"))}  # fmt: skip
    before = ray_processes()
    with S3Server(ttfb_s=0.02) as server, environment(server.env()):
        server.upload_folder(tiny_imagenet / "train", "trainers", "images")
        requests, gets = server.proxy.requests, server.proxy.gets
        command = (*scripts[trainer], str(tmp_path), "s3://trainers/images", "process")
        _train(command, tmp_path, timeout=400)
        listings = (server.proxy.requests - requests) - (server.proxy.gets - gets)
        fetched = server.proxy.gets - gets
    _check(tmp_path, "process", {"lightning": {"TunedDataLoader"}, "accelerate":
           {"DataLoaderShard"}, "ray-train": {"_WrappedDataLoader"}}[trainer])  # fmt: skip
    classes = len([p for p in (tiny_imagenet / "train").iterdir() if p.is_dir()])
    assert listings == 2 + classes  # once for both ranks
    assert fetched >= EPOCHS * 96  # every image of every epoch came from the bucket
    assert ray_processes() <= before


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_hugging_face_trainer_builds_the_tuned_loader_from_its_arguments(
    ranks: int, tiny_imagenet: Path, tmp_path: Path
) -> None:
    """``TrainingArguments(**tuned.training_arguments())``: the Trainer's own DataLoader
    carries the tuned batch size, workers, prefetch and persistence; its worker
    processes read the samples; each rank of two (torchrun, gloo) trains on its own half
    of every epoch, all of it once."""
    pytest.importorskip("transformers")
    from common import HF

    write_tuned_config(tmp_path, "hf")
    script = str(SCRIPTS / "hf_trainer_run.py")
    launch = TORCHRUN[:-1] + (str(ranks),) if ranks > 1 else (sys.executable,)
    _train((*launch, script, str(tmp_path), str(tiny_imagenet / "train")), tmp_path)
    seen = [json.loads((tmp_path / f"hf-rank{r}.json").read_text()) for r in range(ranks)]
    tuned = HF["loader"]
    for rank in seen:
        assert rank["world"] == ranks
        loader = rank["loader"]
        assert loader["type"] in ("DataLoaderShard", "DataLoader"), loader
        for name in ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory"):
            assert loader[name] == tuned[name], (name, loader)
        assert rank["pid"] not in rank["readers"]  # read in the Trainer's worker processes
        assert rank["batch_sizes"] == [tuned["batch_size"]]  # per_device_train_batch_size
    for epoch in map(str, range(EPOCHS)):
        read = [rank["epochs"][epoch] for rank in seen]
        assert sorted(i for part in read for i in part) == list(range(96)), epoch  # once each
        assert all(len(part) == 96 // ranks for part in read)  # each rank its own share


def test_the_versions_best_config_names_are_the_ones_these_tests_ran() -> None:
    from importlib.metadata import version

    from raytune_loader.outputs.trainers import CHECKED

    for name, series in CHECKED.items():
        if name == "transformers":
            pytest.importorskip("transformers")
        installed = ".".join(version(name).split(".")[:2])
        assert installed == series, f"{name} {installed} is installed, CHECKED says {series}"


# Tuned streams (tests/trainers/streams_*.py): shards of 20, 20 and 4 samples, two ranks,
# every launcher and worker start method, a DDP step on every batch.

STREAM_WORLD = 2


def _check_streams(out: Path, case: str) -> list[dict]:
    """Every rank read as many batches as every other, every epoch; the ranks' samples
    are disjoint and cover the epoch but for its cut (less than a batch per rank); the
    second epoch is read in another order."""
    from streams_common import BATCH, SAMPLES

    ranks = json.loads((out / f"streams-{case}.json").read_text())
    assert len(ranks) == STREAM_WORLD
    for epoch in map(str, range(EPOCHS)):
        batches = [rank["epochs"][epoch] for rank in ranks]
        assert len({len(b) for b in batches}) == 1, (case, epoch, batches)  # equal batches
        read = [[label for batch in b for label in batch] for b in batches]
        flat = [label for labels in read for label in labels]
        assert len(flat) == len(set(flat)), (case, epoch)  # no sample twice, on any rank
        assert SAMPLES - len(flat) < STREAM_WORLD * BATCH, (case, epoch)  # the cut
        assert all(sum(len(b) != BATCH for b in rank) <= 1 for rank in batches), case
        if "droplast" not in case:
            assert sorted(flat) == list(range(SAMPLES)), (case, epoch)  # every sample
    for rank in ranks:
        assert rank["epochs"]["0"] != rank["epochs"]["1"], case  # reshuffled
        if "len" in rank:
            assert rank["len"] == len(rank["epochs"]["0"]), case
    return ranks


def _train_streams(script: str, mode: tuple[str, ...], out: Path, data: Path,
                   cases: list[str], timeout: float) -> None:  # fmt: skip
    command = (*mode, str(SCRIPTS / script)) if mode else (sys.executable, str(SCRIPTS / script))
    extra = () if script != "streams_ddp.py" else (("torchrun",) if mode else ("spawn",))
    _train((*command, *extra, str(out), str(data), *cases), out, timeout=timeout)


def test_streams_under_torchrun_give_every_rank_equal_batches_of_its_own(
    tmp_path: Path, uneven_shards: Path
) -> None:
    """Ranks from torchrun's environment; accelerate makes the process group and passes
    the stream loader through its prepare; a batch peeked after set_epoch on rank 0
    moves nothing; a resumed epoch reads what the saved run did not."""
    cases = ["wds-process-fork-peek-resume", "wds-thread", "pq-process-forkserver-persist",
             "pq-thread-noepoch", "wds-process-inworkers-droplast", "pq-process-accel"]  # fmt: skip
    _train_streams("streams_ddp.py", TORCHRUN, tmp_path, uneven_shards, cases, timeout=400)
    for case in cases:
        _check_streams(tmp_path, case)
    accelerated = json.loads((tmp_path / "streams-pq-process-accel.json").read_text())
    assert all(rank["prepared_is_the_loader"] for rank in accelerated)
    resumed = json.loads((tmp_path / "streams-wds-process-fork-peek-resume.json").read_text())
    every = []
    for rank in resumed:
        before, after = rank["resume"]["before"], rank["resume"]["after"]
        assert len(before) == 8 and len(before) + len(after) == 22 and not set(before) & set(after)
        every += before + after
    assert sorted(every) == list(range(44))


def test_streams_under_mp_spawn_give_every_rank_equal_batches_of_its_own(
    tmp_path: Path, uneven_shards: Path
) -> None:
    """Ranks from torch.multiprocessing.spawn, nothing in the environment: the rank
    reaches spawned, forked and thread workers alike."""
    cases = ["wds-process-spawn-persist", "pq-process-fork", "wds-thread-inworkers-droplast"]
    _train_streams("streams_ddp.py", (), tmp_path, uneven_shards, cases, timeout=300)
    for case in cases:
        _check_streams(tmp_path, case)


def test_streams_in_lightning_give_every_rank_equal_batches_of_its_own(
    tmp_path: Path, uneven_shards: Path
) -> None:
    cases = ["wds-process-fork", "pq-thread"]
    _train_streams("streams_lightning.py", (), tmp_path, uneven_shards, cases, timeout=300)
    for case in cases:  # Lightning's epochs (its set_epoch) and len are the loader's
        _check_streams(tmp_path, case)


def test_streams_in_ray_train_give_every_rank_equal_batches_of_its_own(
    tmp_path: Path, uneven_shards: Path
) -> None:
    before = ray_processes()
    cases = ["wds-thread", "pq-process-spawn-persist"]
    _train_streams("streams_ray.py", (), tmp_path, uneven_shards, cases, timeout=400)
    for case in cases:
        ranks = _check_streams(tmp_path, case)
        assert {rank["type"] for rank in ranks} == {"_WrappedDataLoader"}  # kept, wrapped
    assert ray_processes() <= before  # its Ray is shut down

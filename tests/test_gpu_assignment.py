"""Each GPU measurement runs on the GPU Ray gave it, on the CPU
through the seams the real code uses: the ``CUDA_VISIBLE_DEVICES`` a measurement sees
against the one it was given.

CUDA reads the variable once per process, when it starts there, and Ray sets it anew
for every task a reused worker runs. Three places could carry an earlier measurement's
GPUs into a later one: the rank processes (children of a forkserver that kept the
environment of the measurement that started it), the measurement's own process (a
reused Ray worker whose CUDA started in an earlier task), and the choice of worker.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import pytest
import torch

from raytune_loader.errors import DataPipelineError
from raytune_loader.measuring import ranks
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.sources.datasets import DatasetSpec
from raytune_loader.tuning import trainable
from raytune_loader.tuning.trainable import CudaStart, Task
from raytune_loader.tuning.tuner import RayCluster, RayMeasurer

VISIBLE = "CUDA_VISIBLE_DEVICES"
TWO_RANKS = TrialJob(
    DatasetSpec("datasets_for_tests:fast"), "small-cnn",
    SegmentSpec(warmup_steps=1, steps=2, report_every=2, time_limit_s=60),
    samples_per_trial=64, node_cpus=2, ranks=2,
)  # fmt: skip


def seen_by_the_rank(job: TrialJob, report: Any) -> str | None:
    """A rank's task: the GPUs CUDA would start on in it."""
    return os.environ.get(VISIBLE)


@pytest.mark.slow  # a process group of ranks: minutes of the fast tier's CPU
def test_each_rank_sees_the_gpus_its_measurement_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The forkserver starts with the first measurement's environment and keeps it: the
    second measurement's ranks must still see the GPU Ray gave the second."""
    seen = []
    for given in ("3", "5", None):
        if given is None:
            monkeypatch.delenv(VISIBLE, raising=False)
        else:
            monkeypatch.setenv(VISIBLE, given)
        runs = ranks._run_ranks(TWO_RANKS, seen_by_the_rank, (), None)
        seen.append([run.value for run in runs])
    assert seen == [["3", "3"], ["5", "5"], [None, None]]


@pytest.mark.slow  # a process group of ranks: minutes of the fast tier's CPU
def test_a_group_that_did_not_form_is_formed_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The ranks' first meeting file cannot be made (its folder is a file): no rank
    joins, nothing runs, and the ranks meet again in a new folder; a group that fails
    to form every time is the measurement's error."""
    import logging
    import tempfile

    made = tempfile.mkdtemp
    folders = iter(["/dev/null/raytune-ranks"])
    monkeypatch.setattr(ranks.tempfile, "mkdtemp", lambda **kw: next(folders, None) or made(**kw))
    caplog.set_level(logging.WARNING, logger=ranks.__name__)
    runs = ranks._run_ranks(TWO_RANKS, seen_by_the_rank, (), None)
    assert len(runs) == 2 and "did not form" in caplog.text
    folders = iter([f"/dev/null/{n}" for n in range(ranks.GROUP_TRIES)])
    with pytest.raises(ranks.GroupNotFormedError, match="rank [01]: "):
        ranks._run_ranks(TWO_RANKS, seen_by_the_rank, (), None)


class _Cuda:
    """Stands in for torch.cuda's state: CUDA starts in the first measurement that uses it."""

    def __init__(self) -> None:
        self.initialized = False

    def start(self) -> str:
        self.initialized = True
        return "measured"


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> _Cuda:
    state = _Cuda()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state.initialized)
    monkeypatch.setattr(trainable, "PROCESS_CUDA", CudaStart())  # a fresh worker process
    return state


def test_a_reused_worker_refuses_a_measurement_on_a_gpu_its_cuda_did_not_start_on(
    cuda: _Cuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    measurement = trainable._guarded(cuda.start)
    monkeypatch.setenv(VISIBLE, "0")  # Ray's first task here: GPU 0, CUDA starts on it
    assert measurement() == "measured"
    assert measurement() == "measured"  # GPU 0 again: the same CUDA serves it
    monkeypatch.setenv(VISIBLE, "1")  # Ray gives the next task GPU 1
    with pytest.raises(DataPipelineError) as refused:
        measurement()
    assert refused.value.reason == "gpu_assignment"
    assert "CUDA_VISIBLE_DEVICES='0'" in str(refused.value) and "'1'" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_worker_whose_cuda_never_started_takes_any_gpu(
    cuda: _Cuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CPU measurement (the ceiling of a CPU search, a probe) leaves CUDA unstarted:
    the next task may be given any GPU, and CUDA then starts on it."""
    cpu_only = trainable._guarded(lambda: "cpu")
    monkeypatch.setenv(VISIBLE, "0")
    assert cpu_only() == "cpu"
    monkeypatch.setenv(VISIBLE, "1")
    assert trainable._guarded(cuda.start)() == "measured"
    monkeypatch.setenv(VISIBLE, "0")
    with pytest.raises(DataPipelineError, match="started with CUDA_VISIBLE_DEVICES='1'"):
        trainable._guarded(cuda.start)()


def test_the_check_reads_the_worker_s_own_record_not_a_pickled_copy() -> None:
    """Ray pickles a task's function by value, and cloudpickle copies the globals a
    closure names: the record must be looked up in the worker's module, by name."""
    measurement = trainable.MEASURE.reused._function
    names = measurement.__code__.co_names + measurement.__wrapped__.__code__.co_names
    assert "_process_cuda" in names and "PROCESS_CUDA" not in names


class _Remote:
    def __init__(self, name: str) -> None:
        self.name = name
        self.options_given: dict[str, Any] = {}

    def options(self, **options: Any) -> _Remote:
        self.options_given = options
        return self


def _cluster(node_gpus: float) -> RayCluster:
    return RayCluster(None, node_cpus=16, gpus=node_gpus, max_node_gpus=node_gpus, nodes=1,
                      joined=False)  # fmt: skip


@pytest.mark.parametrize(
    ("node_gpus", "gpus", "device", "worker"),
    [(1, 0.5, "cuda", "reused"), (1, 1.0, "cuda", "reused"), (4, 1.0, "cuda", "alone"),
     (4, 0.5, "cuda", "alone"), (4, 0.0, "cuda", "reused"), (0, 0.0, "cpu", "reused"),
     (4, 1.0, "cpu", "reused")],
)  # fmt: skip
def test_a_gpu_measurement_on_a_node_of_several_gpus_gets_a_worker_of_its_own(
    node_gpus: float, gpus: float, device: str, worker: str
) -> None:
    """On one GPU every task is given the same GPU, so a reused worker (torch imported
    once) is right; with several, a worker of its own, whose CUDA starts on its GPU. A
    measurement on the CPU (logical GPUs of a test cluster) never starts CUDA."""
    task = Task(_Remote("reused"), _Remote("alone"))
    job = replace(TWO_RANKS, device=device)
    remote = RayMeasurer(_cluster(node_gpus), gpus)._remote(task, job, 3)
    assert remote.name == worker
    assert remote.options_given["num_cpus"] == 3 and remote.options_given["num_gpus"] == gpus


def test_every_measurement_task_has_a_worker_of_its_own_that_ends_with_it() -> None:
    for task in (trainable.MEASURE, trainable.CEILING, trainable.INPUT, trainable.PROFILE):
        assert task.alone._max_calls == 1
        assert task.reused._max_calls == 0  # Ray's default for a task without GPUs: reused

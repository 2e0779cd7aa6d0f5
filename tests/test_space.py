from __future__ import annotations

import itertools
import re
from dataclasses import asdict, fields, replace
from pathlib import Path

import optuna
import pytest
import torch
from torch.utils.data import TensorDataset

from raytune_loader.candidates.config import (
    CONFIG_KEYS,
    LABELS,
    LOADER_KEYS,
    PIPELINE_KEYS,
    RAYDATA_KEYS,
    WORKER_KEYS,
    LoaderConfig,
)
from raytune_loader.candidates.rules import WORKER_THREADS
from raytune_loader.errors import ConfigError
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.pipeline.device import EncodedBatch
from raytune_loader.sources.datasets import DatasetSpec, build_dataset
from raytune_loader.tuning.space import HEURISTIC, PYTORCH_DEFAULT, RANK_SHARE, SearchSpace


def _all_configs(space: SearchSpace) -> set[LoaderConfig]:
    """Every configuration the define-by-run space can produce, by exhaustive FixedTrials."""
    choices = itertools.product(
        range(space.max_workers + 1),
        space.prefetch_factors,
        (True, False),
        (True, False),
        space.batch_sizes,
        WORKER_THREADS,
    )
    configs = set()
    for workers, prefetch, persistent, pin, batch, threads in choices:
        trial = optuna.trial.FixedTrial(
            {
                "num_workers": workers,
                "prefetch_factor": prefetch,
                "persistent_workers": persistent,
                "pin_memory": pin,
                "batch_size": batch,
                "worker_threads": threads,
            }
        )
        constants = space.define_by_run(trial) or {}
        configs.add(LoaderConfig.from_dict({**trial.params, **constants}))
    return configs


@pytest.mark.parametrize("cuda", [False, True])
def test_every_configuration_of_the_space_builds_a_working_loader(cuda: bool) -> None:
    space = SearchSpace(max_workers=2, batch_sizes=(4, 8), cuda=cuda, usable_cpus=2)
    configs = _all_configs(space)
    # workers=0: 2 pin x 2 batch; workers 1..2: 2 x 4 prefetch x 2 persistent x 2 pin x
    # 2 batch x 2 worker_threads
    assert len(configs) == (2 * 2 + 2 * 4 * 2 * 2 * 2 * 2) // (1 if cuda else 2)
    for config in configs:
        assert config.pin_memory is False or cuda
        if config.num_workers == 0:
            assert config.prefetch_factor is None and not config.persistent_workers
    pins = torch.cuda.is_available()
    if cuda and not pins:
        return  # the loader does not pin without CUDA: these are cuda=False's loaders
    dataset = TensorDataset(torch.randn(16, 3, 8, 8), torch.arange(16))
    built = set()
    for config in configs:
        if replace(config, pin_memory=config.pin_memory and pins) in built:
            continue
        built.add(replace(config, pin_memory=config.pin_memory and pins))
        loader = build_dataloader(dataset, config, timeout_s=30)
        inputs, _ = next(iter(loader))
        assert inputs.shape[0] == config.batch_size
        del loader


def test_fixed_batch_size_is_a_constant_not_a_parameter() -> None:
    space = SearchSpace(max_workers=1, batch_sizes=(64,), cuda=False, usable_cpus=1)
    trial = optuna.trial.FixedTrial({"num_workers": 0})
    assert space.define_by_run(trial) == {"batch_size": 64}
    assert "batch_size" not in trial.params


def test_baselines_follow_the_contract() -> None:
    space = SearchSpace(max_workers=16, batch_sizes=(32,), cuda=True, usable_cpus=12)
    baselines = space.baselines()
    assert baselines[PYTORCH_DEFAULT] == LoaderConfig(batch_size=32)
    assert baselines[HEURISTIC] == LoaderConfig(32, 8, 2, True, True)
    cpu = SearchSpace(max_workers=2, batch_sizes=(32,), cuda=False, usable_cpus=2)
    assert cpu.baselines()[HEURISTIC] == LoaderConfig(32, 2, 2, False, True)
    assert space.heuristic_note is None and cpu.heuristic_note is None


def test_a_stream_that_does_not_split_holds_the_rule_of_thumb_to_one_worker_too() -> None:
    """Its heuristic would read every sample twice with two workers: as a winner (it
    won under load beside other tests) it trains on duplicates at twice the speed."""
    space = SearchSpace(max_workers=2, batch_sizes=(8,), cuda=False, usable_cpus=2,
                        accesses=("stream",), stream_workers=1)  # fmt: skip
    assert space.baselines()[HEURISTIC] == LoaderConfig(8, 1, 2, False, True, access="stream")
    assert space.heuristic_note == (
        "num_workers is 1, the most workers the stream keeps busy, below the rule of thumb "
        "min(usable CPUs, 8) = 2"
    )
    split = SearchSpace(max_workers=2, batch_sizes=(8,), cuda=False, usable_cpus=2,
                        accesses=("stream",), stream_workers=4)  # fmt: skip
    assert split.baselines()[HEURISTIC].num_workers == 2 and split.heuristic_note is None


@pytest.mark.parametrize("cuda", [False, True])
def test_enqueued_baselines_are_reproduced_by_the_space(cuda: bool) -> None:
    space = SearchSpace(max_workers=4, batch_sizes=(16, 32), cuda=cuda, usable_cpus=4)
    for name, config in space.baselines().items():
        trial = optuna.trial.FixedTrial(space.as_point(config))
        constants = space.define_by_run(trial) or {}
        assert LoaderConfig.from_dict({**trial.params, **constants}) == config
        assert space.baseline_name(config) == name


def test_with_several_ranks_the_baselines_show_what_the_usual_advice_costs() -> None:
    space = SearchSpace(max_workers=4, batch_sizes=(256,), cuda=True, usable_cpus=16, ranks=4)
    baselines = space.baselines()
    assert baselines[HEURISTIC].num_workers == 8  # min(cpus, 8) per rank, as people do
    assert baselines[RANK_SHARE].num_workers == 4  # each rank's share: 16 // 4
    assert baselines[PYTORCH_DEFAULT].num_workers == 0
    assert space.heuristic_note == (
        "4 ranks x (1 + 8 workers) = 36 processes on 16 usable CPUs: its reservation is "
        "capped at the node, and its workers share the cores"
    )
    # the rule of thumb lies outside the per-rank bound, yet the searcher measures it
    from raytune_loader.tuning.searcher import LoaderSearcher

    searcher = LoaderSearcher(space, "util", seed=0)
    proposed = [LoaderConfig.from_trial_config(searcher.suggest(str(i))) for i in range(3)]
    assert proposed == list(baselines.values())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0},
        {"batch_size": 8, "num_workers": -1},
        {"batch_size": 8, "num_workers": 0, "prefetch_factor": 2},
        {"batch_size": 8, "num_workers": 0, "persistent_workers": True},
        {"batch_size": 8, "num_workers": 2, "prefetch_factor": 0},
        {"batch_size": "8"},
        {"batch_size": 8, "pin_memory": "yes"},
    ],
)
def test_loader_config_rejects_what_pytorch_would(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        LoaderConfig(**kwargs)


def test_the_pipeline_is_searched_only_where_it_applies() -> None:
    kept = SearchSpace(max_workers=2, batch_sizes=(8,), cuda=False, usable_cpus=2)
    widened = replace(kept, pipeline=True)
    point = {
        "num_workers": 2, "prefetch_factor": 2, "persistent_workers": True, "worker_threads": 1,
        "in_order": False, "multiprocessing_context": "spawn", "transfer": "uint8",
    }  # fmt: skip
    trial = optuna.trial.FixedTrial(point)
    widened.define_by_run(trial)
    assert trial.params == point
    narrow = optuna.trial.FixedTrial(point)
    kept.define_by_run(narrow)  # worker processes' threads are searched for every dataset
    assert set(narrow.params) == {
        "num_workers", "prefetch_factor", "persistent_workers", "worker_threads"
    }  # fmt: skip
    without_workers = optuna.trial.FixedTrial({"num_workers": 0, "transfer": "uint8"})
    widened.define_by_run(without_workers)  # no start method nor order without workers
    assert without_workers.params == {"num_workers": 0, "transfer": "uint8"}


def test_a_spawned_unordered_uint8_loader_works_and_stays_out_of_the_dataloader_args(
    tiny_imagenet: Path,
) -> None:
    config = LoaderConfig(4, 1, 2, False, False, in_order=False,
                          multiprocessing_context="spawn", transfer="uint8")  # fmt: skip
    assert "transfer" not in config.kwargs() and config.pipeline()["transfer"] == "uint8"
    dataset = build_dataset(DatasetSpec("synthetic-imagenet", str(tiny_imagenet)), "uint8")
    images, _ = next(iter(build_dataloader(dataset, config, timeout_s=60)))
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 224, 224)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"num_workers": 0, "multiprocessing_context": "spawn"}, "needs num_workers > 0"),
        ({"num_workers": 1, "multiprocessing_context": "threads"}, "fork, forkserver or spawn"),
        ({"num_workers": 1, "transfer": "fp8"}, "transfer must be one of float32, uint8"),
        ({"num_workers": 1, "decode": "gpu"}, "decode must be one of pil, tensor, device"),
        ({"num_workers": 1, "decode": "device"}, "decode=device .* transfer uint8"),
        ({"num_workers": 0, "workers": "thread"}, "thread workers need num_workers > 0"),
        ({"num_workers": 2, "workers": "thread", "persistent_workers": True}, "thread workers"),
        ({"num_workers": 2, "workers": "fibres"}, "workers must be one of process, thread"),
    ],
)
def test_impossible_pipelines_are_refused(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LoaderConfig(batch_size=8, **values)


def test_decoding_on_the_device_is_offered_only_with_cuda() -> None:
    with pytest.raises(ConfigError, match="needs CUDA"):
        SearchSpace(max_workers=2, batch_sizes=(8,), cuda=False, usable_cpus=2,
                    decodes=("pil", "device"))  # fmt: skip


@pytest.mark.parametrize("cuda", [False, True])
def test_the_widened_space_proposes_only_valid_pipelines_and_all_of_them(
    cuda: bool, tiny_imagenet: Path
) -> None:
    """200 random proposals of the whole space: each is a valid LoaderConfig whose loader
    yields a batch, and every decoder, worker kind and transfer comes up."""
    decodes = ("pil", "tensor", "device") if cuda else ("pil", "tensor")
    space = SearchSpace(max_workers=2, batch_sizes=(4,), cuda=cuda, usable_cpus=2,
                        pipeline=True, decodes=decodes, thread_workers=True)  # fmt: skip
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    configs = set()
    for _ in range(200):
        trial = study.ask()
        constants = space.define_by_run(trial) or {}
        configs.add(LoaderConfig.from_dict({**trial.params, **constants}))
        study.tell(trial, 0.0)
    assert {c.decode for c in configs} == set(decodes)
    assert {c.workers for c in configs} == {"process", "thread"}
    assert {c.transfer for c in configs} == {"float32", "uint8"}
    assert all(c.transfer == "uint8" for c in configs if c.decode == "device")
    spec = DatasetSpec("synthetic-imagenet", str(tiny_imagenet))
    variants = {(c.decode, c.workers, c.transfer, c.num_workers > 0): c for c in configs}
    for config in variants.values():  # one loader per kind of pipeline
        dataset = build_dataset(spec, config.transfer, config.decode)
        loader = build_dataloader(dataset, replace(config, multiprocessing_context=None),
                                  timeout_s=60)  # fmt: skip
        images, labels = next(iter(loader))
        if isinstance(images, EncodedBatch):  # the JPEG files, for decoding on the device
            images = images.files()
        assert len(images) == len(labels) == 4
        del loader


@pytest.mark.parametrize("cuda", [False, True])
def test_every_proposal_replays_as_the_point_optuna_suggested(cuda: bool) -> None:
    """as_point replays define_by_run: for every branch of the space (workers or none,
    processes or threads, each decoder, searched batch sizes), the point it gives for
    a proposed configuration is the parameters Optuna suggested for it."""
    decodes = ("pil", "tensor", "device") if cuda else ("pil", "tensor")
    space = SearchSpace(max_workers=3, batch_sizes=(4, 8), cuda=cuda, usable_cpus=3,
                        pipeline=True, decodes=decodes, thread_workers=True)  # fmt: skip
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(150):
        trial = study.ask()
        space.define_by_run(trial)
        config = LoaderConfig.from_trial_config(trial.params)
        assert space.as_point(config) == trial.params
        study.tell(trial, 0.0)


def test_every_field_is_a_dataloader_argument_a_pipeline_stage_or_a_worker_setting() -> None:
    """The lists of keys come from the fields: a new field lands in exactly one of
    them (or is the engine, or a Ray Data knob), and the JSON's pipeline section shows
    every stage."""
    names = [f.name for f in fields(LoaderConfig)]
    everything = LOADER_KEYS + PIPELINE_KEYS + WORKER_KEYS + ("engine",) + RAYDATA_KEYS
    assert sorted(everything) == sorted(names)
    assert sorted(names) == sorted(CONFIG_KEYS)
    assert set(WORKER_KEYS) == set(LoaderConfig(8).worker_init())
    assert set(LOADER_KEYS) == set(LoaderConfig(8).kwargs())
    assert set(PIPELINE_KEYS) <= set(LoaderConfig(8).pipeline())
    assert set(LABELS) == set(names)


def test_the_grid_is_every_configuration_the_space_can_propose() -> None:
    """grid() walks define_by_run's branches: random proposals all fall in it, and it
    holds every structure of the space."""
    space = SearchSpace(max_workers=2, batch_sizes=(8,), cuda=False, usable_cpus=2,
                        pipeline=True, decodes=("pil", "tensor"), thread_workers=True)  # fmt: skip
    grid = space.grid()
    assert len(grid) == len(set(grid))
    held = [c for c in grid if c.worker_threads]  # each process-worker config, held to 1 thread
    free = [c for c in grid if c.workers == "process" and c.num_workers and not c.worker_threads]
    assert sorted(map(str, (replace(c, worker_threads=None) for c in held))) == sorted(
        map(str, free)
    )
    assert len(grid) - len(held) == 452
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    for _ in range(100):
        trial = study.ask()
        space.define_by_run(trial)
        assert LoaderConfig.from_trial_config({**trial.params, "batch_size": 8}) in grid
        study.tell(trial, 0.0)
    structures = space.structures()
    assert len(structures) == 12  # (pil, tensor) x (float32, uint8) x (none, process, thread)
    assert sum(map(len, structures.values())) == len(grid)


def test_each_rule_is_the_constructor_s_from_dict_s_and_the_space_s() -> None:
    """One table of rules: what the constructor refuses, from_dict makes inert and the
    space never proposes; a stream-only space still searches where batches are made."""
    from raytune_loader.candidates.rules import RULES, applies

    space = SearchSpace(max_workers=2, batch_sizes=(8,), cuda=False, usable_cpus=2,
                        pipeline=True, decodes=("pil", "tensor"), thread_workers=True,
                        accesses=("stream",), batchings=("loader", "workers"))  # fmt: skip
    grid = space.grid()
    assert {c.batching for c in grid} == {"loader", "workers"}
    for config in grid:
        values = asdict(config)
        for rule in RULES:
            if not applies(rule.name, values):
                assert values[rule.name] == rule.inert, (rule.name, config)
    for rule in RULES:  # under the engine where it does not apply
        base = {"num_workers": 0, "decode": "device", "access": "map", "max_actors": None}
        engine = "raydata" if rule.when({**base, "engine": "dataloader"}) else "dataloader"
        clashing = {**base, "engine": engine, rule.name: "x"}
        normalised = LoaderConfig.from_dict({k: v for k, v in clashing.items()}, batch_size=8)
        assert getattr(normalised, rule.name) == rule.inert


# -- the Ray Data kind of candidate --------------------------------------------------------


def test_a_ray_data_candidate_s_dataloader_fields_are_inert_and_its_knobs_round_trip() -> None:
    """One type for both engines: the other engine's fields take their inert values
    (from_dict) or are refused in one line (the constructor); the Ray Data knobs read
    back as the pipeline phase 1 runs, and back again."""
    config = LoaderConfig.from_dict(
        {"engine": "raydata", "num_workers": 4, "prefetch_factor": 4, "pin_memory": True,
         "max_actors": 3, "min_actors": 1, "map_batch_size": 16, "decode": "tensor",
         "transfer": "uint8"}, batch_size=32,
    )  # fmt: skip
    assert (config.num_workers, config.prefetch_factor, config.pin_memory) == (0, None, False)
    assert (config.cpus_per_actor, config.prefetch_batches) == (1.0, 1)  # Ray's defaults
    assert config.actor_cpus == 3.0 and config.label().startswith("raydata actors=1-3x1cpu")
    assert config.raydata_values() == {
        "batch_size": 32, "min_actors": 1, "max_actors": 3, "cpus_per_actor": 1.0,
        "map_batch_size": 16, "prefetch_batches": 1, "crosses": "uint8", "decoder": "tensor",
        "object_store_bytes": None, "block_bytes": None, "locality_with_output": False,
    }  # fmt: skip
    assert LoaderConfig.from_raydata(config.raydata_values()) == config
    fixed = LoaderConfig.from_dict({"engine": "raydata", "max_actors": 2, "min_actors": 2}, 8)
    assert fixed.min_actors is None  # a pool from 2 to 2 actors is a fixed pool of 2
    for values, says in [
        ({"engine": "raydata", "num_workers": 2}, "made by its actors: num_workers 0"),
        ({"max_actors": 2}, "max_actors is a Ray Data knob: it needs engine raydata"),
        ({"engine": "raydata", "max_actors": 1, "min_actors": 1}, "max_actors > 1"),
        ({"engine": "raydata", "max_actors": 2, "min_actors": 3}, "must be below max_actors"),
        ({"engine": "raydata", "cpus_per_actor": 0.0}, "cpus_per_actor must be a number > 0"),
        ({"engine": "spark"}, "engine must be one of dataloader, raydata"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(says)) as refused:
            LoaderConfig(8, **values)
        assert "\n" not in str(refused.value)
    assert LoaderConfig(8).actor_cpus == 0.0 and LoaderConfig(8).engine == "dataloader"


def test_ray_data_is_offered_only_with_cpus_for_its_actors_and_fits_them() -> None:
    """No Ray Data without CPUs for an actor; with 3, every candidate's actors fit in
    them, fixed and autoscaling pools, one and two CPUs an actor; the baseline is Ray's
    documented pipeline, and the DataLoader part of the space is what it was."""
    from raytune_loader import raydata
    from raytune_loader.tuning.space import RAY_DOCS

    plain = SearchSpace(2, (8,), False, 2, pipeline=True, decodes=("pil", "tensor"))
    offered = replace(plain, raydata_cpus=3.0)
    assert not plain.raydata and RAY_DOCS not in plain.baselines()
    assert {c.engine for c in plain.grid()} == {"dataloader"}
    assert not replace(plain, raydata_cpus=0.5).raydata  # not a CPU for an actor
    grid = offered.grid()
    rays = [c for c in grid if c.engine == "raydata"]
    assert [c for c in grid if c.engine == "dataloader"] == plain.grid()
    assert max(c.actor_cpus for c in rays) == 3.0 and all(c.actor_cpus <= 3 for c in rays)
    assert {c.pool_size for c in rays if c.cpus_per_actor == 2.0} == {1}
    assert {(c.pool_size, c.min_actors) for c in rays} >= {(3, None), (3, 1), (1, None)}
    assert {c.map_batch_size for c in rays} == {None, 2, 8}
    kinds = {k.kind for k in offered.structures()}
    assert kinds == {"none", "process", "raydata"}
    docs = offered.baselines()[RAY_DOCS]
    assert docs == raydata.ray_docs_default(8, max_actors=3).candidate()
    assert offered.as_point(docs)["engine"] == "raydata" and docs in grid


def test_optuna_proposes_only_ray_data_candidates_that_fit_and_replays_them() -> None:
    import optuna

    space = SearchSpace(2, (8, 16), False, 2, pipeline=True, decodes=("pil", "tensor"),
                        raydata_cpus=2.0)  # fmt: skip
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    engines = set()
    for _ in range(120):
        trial = study.ask()
        space.define_by_run(trial)
        config = LoaderConfig.from_trial_config(trial.params)
        engines.add(config.engine)
        assert config.actor_cpus <= 2.0 and space.as_point(config) == trial.params
        study.tell(trial, 0.0)
    assert engines == {"dataloader", "raydata"}

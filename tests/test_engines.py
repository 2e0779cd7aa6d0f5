"""The engines: a candidate's engine decided once, answering for it everywhere."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import pytest

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.candidates.rules import ENGINES as ENGINE_NAMES
from raytune_loader.engines import ENGINES, config_from_settings, engine_named, engine_of
from raytune_loader.engines.base import Engine, Held
from raytune_loader.engines.dataloader import DataLoaderEngine
from raytune_loader.engines.raydata import RayDataEngine
from raytune_loader.errors import ConfigError
from raytune_loader.measuring.job import SegmentSpec
from raytune_loader.measuring.memory import sample_nbytes
from raytune_loader.measuring.segment import segment_samples, warmup_batches
from raytune_loader.raydata.config import RayDataConfig
from raytune_loader.raydata.reservation import PIN_SHARE

SAMPLE = 3 * 224 * 224 * 4 + 8  # a float32 image and its class, as sample_nbytes counts


def test_every_engine_a_candidate_can_name_has_one_class_and_no_more() -> None:
    assert tuple(ENGINES) == ENGINE_NAMES
    assert type(engine_of(LoaderConfig(8, 2))) is DataLoaderEngine
    assert type(engine_of(RayDataConfig(8).candidate())) is RayDataEngine
    with pytest.raises(ConfigError, match="engine must be one of dataloader, raydata"):
        engine_named("threads")


def test_an_engine_that_forgets_a_method_cannot_be_made_and_is_told_which() -> None:
    class Partial(Engine):
        name = "partial"
        remote = False
        columns = ("batch_size",)
        use = "-"

        def bundles(self, pin: str | None) -> list[dict[str, float]]:
            return []

    with pytest.raises(TypeError, match="abstract method.*held"):
        Partial(LoaderConfig(8))  # type: ignore[abstract]


# -- what it holds in flight -------------------------------------------------------------------


def test_a_dataloader_holds_its_prefetched_and_pinned_batches() -> None:
    import torch

    assert sample_nbytes((torch.zeros(3, 224, 224), torch.tensor(1))) == SAMPLE
    held = engine_of(LoaderConfig(32, 4, 2, True, True)).held(SAMPLE)
    assert held.shm == 4 * 2 * 32 * SAMPLE and held.host == 2 * held.shm
    assert engine_of(LoaderConfig(32)).held(SAMPLE) == Held(
        32 * SAMPLE, 0, "batches", "fewer workers or a smaller prefetch_factor"
    )
    threads = engine_of(LoaderConfig(32, 2, 2, workers="thread")).held(SAMPLE)
    assert threads.shm == 0 and threads.host == 2 * 2 * 32 * SAMPLE  # threads share memory


def test_a_dataloader_drains_every_slot_it_has() -> None:
    assert engine_of(LoaderConfig(32)).in_flight() == 0
    assert engine_of(LoaderConfig(32, num_workers=2, prefetch_factor=8)).in_flight() == 2 * 9 + 2
    threads = LoaderConfig(32, num_workers=8, prefetch_factor=8, workers="thread")
    assert engine_of(threads).in_flight() == 8 * 9 + 2
    assert engine_of(LoaderConfig(32)).producers() == 1  # the loop itself
    assert engine_of(threads).producers() == 8


def test_a_ray_data_trial_holds_its_prefetched_batches_and_its_store_s_blocks() -> None:
    """Host memory: the prefetched batches and the one being formatted; the object store
    on the trial's node: the budget where one is set, else every batch in flight."""
    config = RayDataConfig(32, 2, 2, map_batch_size=32, prefetch_batches=3)
    sample = 3 * 224 * 224
    batch = 32 * sample
    held = engine_of(config.candidate()).held(sample)
    assert (held.host, held.shm) == (4 * batch, batch * (3 + 1 + 2 * 2))
    assert held.holder == "object store blocks" and "object_store_bytes" in held.fix
    budgeted = engine_of(replace(config, object_store_bytes=2**28).candidate()).held(sample)
    assert (budgeted.host, budgeted.shm) == (4 * batch, 2**28)


def test_a_ray_data_drain_counts_the_prefetched_batches_and_each_actors_calls() -> None:
    # 2 prefetched + 1 being formatted + 3 actors x 2 calls x 2 training batches a call
    three = RayDataConfig(32, 3, 3, map_batch_size=64, prefetch_batches=2).candidate()
    assert engine_of(three).in_flight() == 15
    # a call smaller than a training batch still holds one
    assert engine_of(RayDataConfig(32, 1, 2, map_batch_size=8).candidate()).in_flight() == 6
    assert engine_of(RayDataConfig(32, 1, 5).candidate()).producers() == 5
    spec = SegmentSpec(warmup_steps=3, steps=10)
    one = RayDataConfig(32).candidate()
    engine = engine_of(one)
    # the first batch (the warm-up steps train on it), prefetch, formatting, calls
    assert warmup_batches(engine, spec) == 1 + 1 + 1 + 2
    assert segment_samples(engine, spec) == 32 * (1 + 4 + 10)


# -- what it reserves -----------------------------------------------------------------------


def test_a_ray_data_trial_reserves_a_bundle_per_actor_of_its_largest_pool() -> None:
    config = RayDataConfig(32, min_actors=2, max_actors=3, cpus_per_actor=1.5).candidate()
    bundles = engine_of(config).bundles("cpu_node")
    assert bundles == [{"CPU": 1.5, "cpu_node": PIN_SHARE}] * 3
    bundles[0]["CPU"] = 9.0  # each bundle its own dict: Ray mutates none, but nor do we share
    assert bundles[1]["CPU"] == 1.5
    assert engine_of(RayDataConfig(8, cpus_per_actor=0.25).candidate()).bundles(None) == [
        {"CPU": 0.25}
    ]
    assert engine_of(LoaderConfig(8, 4)).bundles("cpu_node") == []  # its workers: its own


# -- how it builds its batches ----------------------------------------------------------------


def test_a_stream_only_source_is_read_as_a_stream_by_either_engine() -> None:
    loader = LoaderConfig(8, 2, transfer="uint8")
    assert engine_of(loader).source_variant(("map", "stream")) is loader
    ceiling = engine_of(LoaderConfig(8)).source_variant(("stream",))
    assert (ceiling.access, ceiling.batching) == ("stream", "loader")
    ray = RayDataConfig(8, crosses="uint8", decoder="tensor").candidate()
    variant = engine_of(ray).source_variant(("stream",))
    assert (variant.engine, variant.access, variant.transfer, variant.decode) == (
        "dataloader",
        "stream",
        "uint8",
        "tensor",
    )


def test_each_engine_s_segment_loader_closes_with_its_block(tiny_imagenet: Any) -> None:
    """The DataLoader engine's workers are gone when its block ends (the gc is thawed)."""
    import gc

    from raytune_loader.sources.datasets import DatasetSpec, build_dataset

    dataset = build_dataset(DatasetSpec("synthetic-imagenet", str(tiny_imagenet)))
    engine = engine_of(LoaderConfig(4, 1, 2))
    frozen = gc.get_freeze_count()
    with contextlib.ExitStack() as stack:
        loader = stack.enter_context(engine.segment_loader(dataset, 8, seed=0, timeout_s=60))
        if frozen == 0:
            assert gc.get_freeze_count() > 0  # the heap frozen while its workers run
        first = next(iter(loader))
        assert first.made >= first.started  # stamped, as a segment reads it
    assert gc.get_freeze_count() == frozen
    assert engine.segment_watch(loader) is None


# -- how best_config.json writes and reads it ---------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        LoaderConfig(32, 4, 2, pin_memory=True, persistent_workers=True, transfer="uint8",
                     decode="tensor", workers="process", worker_threads=1),
        LoaderConfig(16, 2, 4, workers="thread", in_order=False),
        RayDataConfig(64, 2, 6, 0.5, 32, 4, "encoded").candidate(),
        RayDataConfig(16, 3, 3, 2.0, crosses="uint8", decoder="tensor",
                      object_store_bytes=2**30, block_bytes=2**23).candidate(),
    ],
)  # fmt: skip
def test_a_candidate_s_settings_read_back_as_the_same_candidate(config: LoaderConfig) -> None:
    settings = engine_of(config).settings()
    assert config_from_settings({"name": "top-1", **settings}) == config
    if engine_of(config).remote:  # the pipeline it runs, and back
        assert RayDataEngine(config).pipeline.candidate() == config


def test_a_section_no_engine_reads_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="neither loader nor raydata settings"):
        config_from_settings({"name": "top-1", "metrics": {}})
    # an older file's pipeline words still read
    old = {"loader": {"batch_size": 8, "num_workers": 2}, "pipeline": {"decode": "cpu"}}
    assert config_from_settings(old).decode == "pil"


@pytest.mark.parametrize(
    "config",
    [
        LoaderConfig(32, 2, 4, True, True),
        RayDataConfig(16, 3, 3, 2.0, crosses="uint8", decoder="tensor").candidate(),
    ],
)  # fmt: skip
def test_an_engine_s_section_of_best_config_reads_back_as_its_pipeline(
    config: LoaderConfig,
) -> None:
    """The engine writes its own section of ``best_config.json`` (keyed by its name, the
    figures the search hands it) and reads it back; the DataLoader's are the file's
    ``loader`` sections, so it writes none and reads none."""
    from raytune_loader.engines import Verdict

    engine = engine_of(config)
    verdict = Verdict(True, "top-1", {"samples_per_s": 10.0}, None, 1.0, 4.0, 6.0, [])
    section = engine.section(verdict)
    read = type(engine).read_section({"loader": {}, **section})
    if not engine.remote:
        assert section == {} and read is None
        return
    assert list(section) == [engine.name]
    assert section[engine.name]["reserved"] == {
        "trial_cpus": 1.0, "actor_cpus": config.actor_cpus, "offered_cpus": 4.0,
    }  # fmt: skip
    assert section[engine.name]["remote_cpus_to_ceiling"] == 6.0
    assert read == RayDataEngine(config).pipeline and read.candidate() == config
    with pytest.raises(ConfigError, match="'raydata' must hold a 'config' object"):
        type(engine).read_section({engine.name: {"name": "top-1"}})


@pytest.mark.parametrize("chosen", [True, False])
def test_each_engine_says_what_its_own_section_holds_in_the_summary(chosen: bool) -> None:
    """A search's summary prints each engine's own section of ``best_config.json``: Ray
    Data's candidate, chosen or the runner-up, its median rate and its ratio to the best
    DataLoader; the DataLoader's sections are the summary's table, so it adds nothing."""
    import io

    from raytune_loader.engines import Verdict
    from raytune_loader.outputs.console import print_summary

    config = RayDataConfig(16, 3, 3, 2.0, crosses="uint8", decoder="tensor").candidate()
    metrics = {"samples_per_s": {"median": 412.4, "min": 400.0, "max": 420.0}}
    verdict = Verdict(chosen, "top-raydata", metrics, 1.234, 1.0, 4.0, None, [])
    data = {"loader": LoaderConfig(16, 2).kwargs(), **engine_of(config).section(verdict)}
    role = "chosen" if chosen else "runner-up"
    said = f"Ray Data ({role}): {config.label()}: 412 samples/s, 1.23x the best DataLoader"
    assert RayDataEngine.summary_lines(data) == [f"\n{said}"]
    assert DataLoaderEngine.summary_lines(data) == []
    assert RayDataEngine.summary_lines({"loader": data["loader"]}) == []
    best = {**data, "metrics": metrics, "baselines": {}}
    printed = io.StringIO()
    print_summary(best, "out", printed)
    assert said in printed.getvalue()

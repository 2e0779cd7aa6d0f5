"""The cost model: where a candidate's time goes, from measured per-stage costs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.profile import Profile
from raytune_loader.tuning.costmodel import CostModel, median_error, what_if
from raytune_loader.tuning.space import SearchSpace


def _model(per_core: float, cores: int = 4, ceiling: float = 400.0, cuda: bool = False,
           ranks: int = 1) -> CostModel:  # fmt: skip
    profile = Profile(
        batch_size=32, cores=cores, per_core={"pil/float32": per_core},
        collate_s={"pil/float32": 0.002}, receive_s={"process/float32": 0.004,
        "thread/float32": 0.0001}, finish_s={"pil/float32": 0.0},
    )  # fmt: skip
    return CostModel(profile, {32: ceiling, 64: 420.0}, cuda=cuda, ranks=ranks)


def _with(count: int, **fields: object) -> LoaderConfig:
    return LoaderConfig.from_dict({"num_workers": count, **fields}, batch_size=32)


def test_a_costly_decode_wants_workers_up_to_the_cores() -> None:
    """100 samples/s a core against a 400 samples/s step: each worker adds speed until
    the cores are busy."""
    model = _model(per_core=100.0)
    speeds = [model.predict(_with(w)).samples_per_s for w in range(5)]  # type: ignore[union-attr]
    assert speeds[0] < speeds[1] < speeds[2] < speeds[3]
    assert model.predict(_with(1)).bound == "workers"  # type: ignore[union-attr]
    assert model.predict(_with(4)).bound == "cores"  # type: ignore[union-attr]


def test_free_data_wants_no_workers_on_a_cpu() -> None:
    """Reading costs nothing: the step sets the pace, and workers only cost receiving."""
    model = _model(per_core=1e6)
    none, two = model.predict(_with(0)), model.predict(_with(2))
    assert none.bound == two.bound == "step"  # type: ignore[union-attr]
    assert none.samples_per_s >= two.samples_per_s  # type: ignore[union-attr]


def test_a_store_s_latency_is_paid_per_wave_of_requests_in_flight_and_takes_no_core() -> None:
    """30 ms a request, 1000 samples/s a core, a 4000 samples/s step: one request at a
    time, two workers make 2 / (32 x 31 ms) batches a second; 16 in flight, two waves a
    batch; 64, one wave.
    Waiting takes no core, so the cores are not the bound a local read would make them."""
    local = _model(per_core=1000.0, cores=2, ceiling=4000.0)
    remote = replace(local, profile=replace(local.profile, fetch_s=0.030))
    rates = {f: remote.predict(_with(2, fetch_threads=f)) for f in (1, 16, 64)}
    one = 2 * 32 / (32 / 1000 + 0.002 + 32 * 0.030)
    assert rates[1].samples_per_s == pytest.approx(one)  # type: ignore[union-attr]
    assert rates[1].bound == rates[16].bound == "workers"  # type: ignore[union-attr]
    assert rates[1].samples_per_s < rates[16].samples_per_s < rates[64].samples_per_s  # type: ignore[union-attr]
    assert rates[16].samples_per_s == pytest.approx(  # type: ignore[union-attr]
        2 * 32 / (32 / 1000 + 0.002 + 2 * 0.030)
    )
    fast = local.predict(_with(2, fetch_threads=64))
    assert rates[64].samples_per_s < fast.samples_per_s  # type: ignore[union-attr]
    for f in (1, 16, 64):  # without a store the threads change nothing
        assert local.predict(_with(2, fetch_threads=f)) == fast
    # a store that answered at most 300 GETs/s caps every candidate there, whatever it has
    # in flight; with two ranks each has half
    capped = replace(remote, profile=replace(remote.profile, store_rate=300.0))
    top = capped.predict(_with(2, fetch_threads=64))
    assert (top.samples_per_s, top.bound) == (pytest.approx(300.0), "store")  # type: ignore[union-attr]
    slower = capped.predict(_with(2, fetch_threads=1))  # slower than the cap
    assert (slower.samples_per_s, slower.bound) == (rates[1].samples_per_s, rates[1].bound)  # type: ignore[union-attr]
    two = replace(capped, ranks=2).predict(_with(2, fetch_threads=64))
    assert two.samples_per_s == pytest.approx(300.0)  # type: ignore[union-attr]
    # a candidate that caches the objects is modelled warm: local reads, no store cap,
    # at the rate a core reads the warm cache (no request to sign and parse) where the
    # profile timed it
    cached = capped.predict(_with(2, fetch_threads=1, cache=True))
    assert cached == local.predict(_with(2, fetch_threads=1))
    timed = replace(capped, profile=replace(capped.profile, per_core={"pil/float32": 400.0},
                                            cached_per_core={"pil/float32": 1000.0}))  # fmt: skip
    assert timed.predict(_with(2, fetch_threads=1, cache=True)) == cached
    slower = timed.predict(_with(2, fetch_threads=1))  # reading the store, at the store's rate
    assert slower.samples_per_s < rates[1].samples_per_s  # type: ignore[union-attr]


def test_a_shard_s_get_is_shared_by_its_samples_and_read_ahead_hides_it() -> None:
    """A stream of shards of 64 samples, a batch of 32 that one core makes in 34 ms. One
    shard at a time, the worker waits for half a GET, then decodes; with two fetched
    ahead by threads of their own, a quarter GET a batch arrives while it decodes: it
    waits only for what decoding does not cover (none at 100 ms a GET, 16 ms at 200 ms).
    The store's cap counts requests (a GET for 64 samples), not samples."""
    local = _model(per_core=1000.0, cores=4, ceiling=4000.0)  # cores to spare
    made = 32 / 1000 + 0.002
    for fetch_s, waited in ((0.1, 0.0), (0.2, 0.05 - made)):
        shards = replace(local, profile=replace(local.profile, fetch_s=fetch_s,
                                                requests_per_sample=1 / 64))  # fmt: skip
        one, two = (shards.predict(_with(2, fetch_threads=f)) for f in (1, 2))
        assert one.samples_per_s == pytest.approx(2 * 32 / (made + fetch_s / 2))  # type: ignore[union-attr]
        assert two.samples_per_s == pytest.approx(2 * 32 / (made + waited))  # type: ignore[union-attr]
        assert two.bound == "workers"  # type: ignore[union-attr]
    # without workers the shards ahead arrive during the step as well: 8 ms of step and
    # 34 of making a batch cover all but 8 ms of its 50 ms share of GETs at two ahead
    alone = shards.predict(_with(0, fetch_threads=2))
    assert alone.samples_per_s == pytest.approx(32 / max(0.008 + made, 0.05))  # type: ignore[union-attr]
    capped = replace(shards, profile=replace(shards.profile, store_rate=10.0))  # 10 GETs/s
    top = capped.predict(_with(2, fetch_threads=2))
    assert (top.samples_per_s, top.bound) == (pytest.approx(640.0), "store")  # type: ignore[union-attr]


def test_on_a_gpu_the_step_and_the_workers_do_not_share_the_cores() -> None:
    cpu, gpu = _model(per_core=100.0, cores=2), _model(per_core=100.0, cores=2, cuda=True)
    assert gpu.predict(_with(4)).samples_per_s > cpu.predict(_with(4)).samples_per_s  # type: ignore[union-attr]


def test_threads_receive_cheaper_and_ranks_share_the_node() -> None:
    model = _model(per_core=1e6)
    threads = model.predict(_with(2, workers="thread")).samples_per_s  # type: ignore[union-attr]
    processes = model.predict(_with(2)).samples_per_s  # type: ignore[union-attr]
    assert threads > processes
    node, rank_share = _model(100.0, cores=8, ranks=2), _model(100.0, cores=4)
    each = rank_share.predict(_with(3)).samples_per_s  # type: ignore[union-attr]
    assert node.predict(_with(3)).samples_per_s == pytest.approx(2 * each)  # type: ignore[union-attr]


def test_no_prediction_without_the_structure_or_the_ceiling() -> None:
    model = _model(per_core=100.0)
    assert model.predict(_with(1, transfer="uint8")) is None
    assert model.predict(LoaderConfig(16)) is None


def test_what_if_says_when_cpus_not_settings_are_the_limit() -> None:
    found = what_if(_model(per_core=100.0, cores=2), _with(2), [2, 4, 8])
    assert [f["cores"] for f in found] == [2, 4, 8] and all(f["estimate"] for f in found)
    speeds = [f["samples_per_s"] for f in found]
    assert speeds[0] < speeds[1] < speeds[2] <= 400.0


def test_median_error() -> None:
    assert median_error([(110, 100), (90, 100), (100, 100)]) == pytest.approx(0.1)
    assert median_error([]) is None


# -- Ray Data ------------------------------------------------------------------------------


def _actors(count: int, **fields: object) -> LoaderConfig:
    return LoaderConfig.from_dict({"engine": "raydata", "max_actors": count, **fields}, 32)


def test_the_object_store_term_is_the_overhead_experiment_s_fit() -> None:
    """The constants are the line through what experiments/raydata_overhead.py measured
    for uint8 and float32 images: the actor's time beyond its worker side, the training
    process's CPU time, per sample."""
    import json

    from conftest import REPO
    from raytune_loader.tuning.costmodel import IMAGE_VALUES, OBJECT_STORE, PerByte

    measured = json.loads((REPO / "results/benchmarks/raydata_overhead.json").read_text())
    sizes = {"raydata uint8": IMAGE_VALUES, "raydata float32": 4 * IMAGE_VALUES}
    variants = {"raydata uint8": "uint8/tensor", "raydata float32": "float32/tensor"}
    put = PerByte.fit([(size, (measured["maker_ms_per_sample"][name]
                               - measured["worker_side_cpu_ms_per_sample"][variants[name]]) / 1e3)
                       for name, size in sizes.items()])  # fmt: skip
    receive = PerByte.fit([(size, measured["training_process_cpu_ms_per_sample"][name] / 1e3)
                           for name, size in sizes.items()])  # fmt: skip
    for fitted, used in ((put, OBJECT_STORE.put), (receive, OBJECT_STORE.receive)):
        assert used.per_sample_s == pytest.approx(fitted.per_sample_s, rel=0.01)
        assert used.per_byte_s == pytest.approx(fitted.per_byte_s, rel=0.01)
    assert PerByte.fit([(1, 3.0), (3, 7.0), (2, 5.0)]) == PerByte(1.0, 2.0)


def test_remote_actors_add_speed_until_the_training_process_is_the_limit() -> None:
    """50 samples/s a core against a 400 samples/s step: each remote actor adds 50 less
    what putting a sample in the store costs, until the training process (the step and
    taking batches out of the store) sets the pace; that many actors' CPUs, with the
    margin, bound what the space offers."""
    from raytune_loader.tuning.costmodel import OBJECT_STORE, crossing_bytes

    model = _model(per_core=50.0, cores=1)
    one = model.predict(_actors(1))
    assert one is not None and one.bound == "actors" and one.cpus == 2.0
    per_actor = 1 / (1 / 50.0 + OBJECT_STORE.put.seconds(crossing_bytes(_actors(1))))
    assert one.samples_per_s == pytest.approx(per_actor)
    speeds = [model.predict(_actors(n)).samples_per_s for n in (1, 2, 4, 8, 16)]  # type: ignore[union-attr]
    assert speeds[:3] == pytest.approx([per_actor, 2 * per_actor, 4 * per_actor])
    step = 1 / (1 / 400.0 + OBJECT_STORE.receive.seconds(crossing_bytes(_actors(1))))
    assert speeds[-1] == pytest.approx(step) and model.predict(_actors(16)).bound == "step"  # type: ignore[union-attr]
    needed = model.actors_needed(_actors(1))
    assert needed == pytest.approx(step / per_actor)
    space = SearchSpace(1, (32,), False, 1, raydata_cpus=64.0)
    assert model.remote_cpus(space) == math.ceil(needed * 1.25)  # type: ignore[operator]
    assert model.predict(_actors(2, cpus_per_actor=0.5)).samples_per_s == pytest.approx(  # type: ignore[union-attr]
        per_actor
    )  # two actors on half a core each make what one on a core does


def test_a_ray_data_actor_on_a_store_waits_once_a_map_call_not_once_a_row() -> None:
    """30 ms a request: an actor fetches its map call's objects together (up to
    ACTOR_FETCHES), so a call of 32 rows waits one request's time and one of 128 two
    (64 at a time), shared by its rows; a local dataset's actor waits for nothing."""
    from raytune_loader.candidates.rules import ACTOR_FETCHES
    from raytune_loader.tuning.costmodel import OBJECT_STORE, crossing_bytes

    local = _model(per_core=50.0, cores=1)
    remote = replace(local, profile=replace(local.profile, fetch_s=0.030))
    put = OBJECT_STORE.put.seconds(crossing_bytes(_actors(1)))
    for rows, waves in ((32, 1), (128, 128 // ACTOR_FETCHES)):
        found = remote.predict(_actors(1, map_batch_size=rows))
        assert found is not None and found.bound == "actors"
        actor = 32 / 50.0 + waves * 0.030 * 32 / rows + 32 * put
        assert found.samples_per_s == pytest.approx(32 / actor)
    assert local.predict(_actors(1)).samples_per_s == pytest.approx(  # type: ignore[union-attr]
        1 / (1 / 50.0 + put)
    )
    # whole blocks (map_batch_size None): Ray's blocks of a trial's rows hold a row or
    # two, so each row waits a request's time
    whole = remote.predict(_actors(1))
    assert whole.samples_per_s == pytest.approx(1 / (1 / 50.0 + 0.030 + put))  # type: ignore[union-attr]
    assert _actors(2).requests_in_flight == 2
    assert _actors(2, map_batch_size=128).requests_in_flight == 2 * ACTOR_FETCHES


def test_actors_on_the_trial_s_node_share_its_cores() -> None:
    """With --ray-data on one machine the actors take the cores the step runs on."""
    remote, local = _model(per_core=100.0, cores=2), replace(_model(100.0, 2), remote_actors=False)
    assert local.predict(_actors(4)).samples_per_s < remote.predict(_actors(4)).samples_per_s  # type: ignore[union-attr]
    assert local.predict(_actors(4)).bound == "cores"  # type: ignore[union-attr]


def test_a_ray_data_winner_s_what_if_grows_its_pool() -> None:
    found = what_if(_model(per_core=50.0, cores=1), _actors(1), [1, 2, 4])
    assert [f["actors"] for f in found] == [1, 2, 4] and all(f["estimate"] for f in found)
    assert found[0]["samples_per_s"] < found[1]["samples_per_s"] < found[2]["samples_per_s"]


def test_receiving_as_the_profile_timed_it_on_the_trials_node_replaces_the_one_node_figure() -> (
    None
):
    """Where the profile timed taking batches out of the store on the trials' node (from
    an actor on another node: the transfer and Ray Data's executor included), the model
    charges the training process that, scaled to the batch, not the one-node constant."""
    base = _model(per_core=1e6, cores=1)  # free decoding: the training process is the limit
    timed = replace(base, profile=replace(base.profile, receive_s={
        **base.profile.receive_s, "raydata/float32": 0.032}))  # 1 ms a sample  # fmt: skip
    slow = timed.predict(_actors(4))
    assert slow is not None and slow.bound == "step"
    assert slow.samples_per_s == pytest.approx(1 / (1 / 400.0 + 1e-3))
    assert timed.predict(_actors(4, batch_size=64)).samples_per_s == pytest.approx(  # type: ignore[union-attr]
        1 / (1 / 420.0 + 1e-3)
    )
    assert base.predict(_actors(4)).samples_per_s > slow.samples_per_s  # type: ignore[union-attr]


def test_a_store_served_from_this_node_s_cores_costs_them_its_cpu() -> None:
    """Two workers, each making a batch of 32 in 34 ms, and a 4000 samples/s step on 2
    cores: the cores bound the pace at 2 / (8 ms of step + receive + 34 ms) a batch. A
    store whose server runs on this node adds its 3 ms a GET for each of the batch's 32
    objects to the cores' part; a warm cache asks it nothing, and on a GPU the cores are
    no part."""
    base = _model(per_core=1000.0, cores=2, ceiling=4000.0)
    served = {"server_cpu_s_per_request": 0.003}
    store = replace(base, profile=replace(base.profile, fetch_s=0.001, store_latency=served))
    elsewhere = replace(base, profile=replace(base.profile, fetch_s=0.001))
    cpu = 32 / 4000 + 0.004 + 32 / 1000 + 0.002  # the step, receive, a core's making
    far = elsewhere.predict(_with(2, fetch_threads=8))
    near = store.predict(_with(2, fetch_threads=8))
    assert (far.bound, near.bound) == ("cores", "cores")  # type: ignore[union-attr]
    assert far.samples_per_s == pytest.approx(2 * 32 / cpu)  # type: ignore[union-attr]
    assert near.samples_per_s == pytest.approx(2 * 32 / (cpu + 32 * 0.003))  # type: ignore[union-attr]
    assert store.predict(_with(2, cache=True)) == elsewhere.predict(_with(2, cache=True))
    gpu = replace(store, cuda=True)
    assert gpu.predict(_with(2, fetch_threads=8)) == replace(elsewhere, cuda=True).predict(
        _with(2, fetch_threads=8)
    )


def test_calibrated_each_part_runs_at_its_own_factor_and_the_slowest_sets_the_pace() -> None:
    """The profile puts the step at 40 ms a batch of 32 and the cores' part at 35 ms:
    step-bound, 800 samples/s. Trials the cores bounded measured 0.8 of the profile's
    prediction: their part is 43.75 ms, the new bound, 731 samples/s; a part no factor
    names stays the profile's. Without workers, or with Ray Data, a part is calibrated
    under a name of its own kind."""
    from raytune_loader.tuning.costmodel import Prediction

    found = Prediction(800.0, "step", 3.0, parts=(("cores", 0.035), ("step", 0.04)),
                       samples=32.0)  # fmt: skip
    factors = {"cores": 0.8}
    rate, bound = found.calibrated(lambda key: factors.get(key, 1.0))
    assert (rate, bound) == (pytest.approx(32 / 0.04375), "cores")
    assert found.calibrated(lambda key: 1.0) == (pytest.approx(800.0), "step")
    model = _model(per_core=100.0)
    assert model.predict(_with(0)).key("step") == "step/inline"  # type: ignore[union-attr]
    assert model.predict(_with(2)).key("cores") == "cores"  # type: ignore[union-attr]

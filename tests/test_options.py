"""Search options: the device's defaults, and impossible values named by their flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from raytune_loader.errors import ConfigError
from raytune_loader.tuning.options import SearchOptions


def test_the_batch_size_follows_the_device_unless_given() -> None:
    assert SearchOptions().for_device(cuda=True).batch_sizes == (256,)
    assert SearchOptions().for_device(cuda=False).batch_sizes == (32,)
    assert SearchOptions(batch_sizes=(64, 128)).for_device(cuda=True).batch_sizes == (64, 128)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (SearchOptions(precision="fp8"), "--precision must be one of fp32, tf32, bf16, fp16"),
        (SearchOptions(train_step="m:f", compile=True), "drop --model and --compile"),
        (SearchOptions(batch_sizes=(16,), min_batch_size=32), "--min-batch-size (32)"),
        (SearchOptions(max_concurrent=0), "--max-concurrent must be at least 1"),
    ],
)
def test_impossible_values_name_their_flag(options: SearchOptions, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        options.for_device(cuda=False).validate()
    assert message in str(raised.value)


def test_ray_data_flags_reach_the_options_and_need_one_rank() -> None:
    from raytune_loader.search import get_args_parser, options_from_args

    args = get_args_parser().parse_args(["--ray-data", "--remote-cpus", "6",
                                         "--cpu-node-type", "cpu"])  # fmt: skip
    opts = options_from_args(args)
    assert (opts.ray_data, opts.remote_cpus, opts.cpu_node_type) == (True, 6.0, "cpu")
    assert options_from_args(get_args_parser().parse_args(["--no-ray-data"])).ray_data is False
    with pytest.raises(ConfigError, match="--ray-data measures Ray Data candidates with one rank"):
        SearchOptions(ray_data=True, ranks_per_node=2).validate()
    with pytest.raises(ConfigError, match="--remote-cpus must be 0 or more"):
        SearchOptions(remote_cpus=-1).validate()


def test_the_job_s_one_constructor_refuses_a_step_no_trial_could_build() -> None:
    """The search and the bench both build their job with job_from_options: a model or
    --train-step that no trial could build is refused there, before any data is read."""
    from raytune_loader.errors import ModelError
    from raytune_loader.tuning.options import job_from_options

    with pytest.raises(ModelError, match="unknown model 'resnet9000'"):
        job_from_options(SearchOptions(), "resnet9000", device="cpu", node_cpus=2)
    with pytest.raises(ModelError, match="no_such_module"):
        job_from_options(SearchOptions(train_step="no_such_module:make"), "small-cnn",
                         device="cpu", node_cpus=2)  # fmt: skip
    assert job_from_options(SearchOptions(), "small-cnn", device="cpu", node_cpus=2).model == (
        "small-cnn"
    )


def test_a_local_data_root_reaches_the_trials_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trials run in Tune's trial folders: ``--data-root photos`` is the folder
    under the command's own, and a bucket's URL stays as given."""
    from raytune_loader.tuning.options import dataset_spec

    monkeypatch.chdir(tmp_path)
    spec = dataset_spec(SearchOptions(dataset="imagefolder", data_root="photos"))
    assert spec.data_root == str(tmp_path / "photos")
    url = "s3://bucket/photos"
    assert dataset_spec(SearchOptions(dataset="imagefolder", data_root=url)).data_root == url

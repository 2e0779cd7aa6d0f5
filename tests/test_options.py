"""Search options: the device's defaults, and impossible values named by their flag."""

from __future__ import annotations

import pytest

from raytune_loader.errors import ConfigError
from raytune_loader.options import SearchOptions


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

"""experiments/gpu_plan.py: the GPU check's device plan fits the device's 8 minutes.

The GPU run is rare and may be short; these keep the plan honest in between.
"""

from __future__ import annotations

import json
import sys

import pytest

from conftest import REPO
from raytune_loader.search import get_args_parser, options_from_args

sys.path.insert(0, str(REPO / "experiments"))
import gpu_plan  # noqa: E402 - experiments/ is not a package


def test_the_default_stages_fit_the_device_budget() -> None:
    limits = gpu_plan.device_limits(gpu_plan.Rates.load(), gpu_plan.DEFAULT_STAGES)
    assert gpu_plan.total_s(limits, gpu_plan.DEFAULT_STAGES) <= gpu_plan.BUDGET_S
    assert all(stage.margin_s > 0 for stage in limits.values())


def test_the_stages_left_out_fit_a_second_session() -> None:
    rest = tuple(s for s in gpu_plan.STAGES if s not in gpu_plan.DEFAULT_STAGES)
    limits = gpu_plan.device_limits(gpu_plan.Rates.load(), rest)
    assert gpu_plan.total_s(limits, rest) <= gpu_plan.BUDGET_S


def test_every_rate_says_where_it_comes_from() -> None:
    rates = json.loads(gpu_plan.RATES.read_text())["rates"]
    needed = {field for field in gpu_plan.Rates.__dataclass_fields__}
    assert needed <= set(rates)
    assert all(rates[name]["value"] > 0 and rates[name]["from"].strip() for name in needed)


def test_the_first_stage_run_generates_the_dataset() -> None:
    rates = gpu_plan.Rates.load()
    alone = gpu_plan.device_limits(rates, ("baselines",))["baselines"]
    after = gpu_plan.device_limits(rates, ("search", "baselines"))["baselines"]
    images = int(gpu_plan.DEVICE["baselines"]["--synthetic-images"])
    assert alone.estimate_s - after.estimate_s == pytest.approx(
        images / rates.generate_images_per_s
    )


@pytest.mark.parametrize("stage", ["search", "ranks"])
def test_the_device_searches_are_valid_options(stage: str) -> None:
    flags = [part for pair in gpu_plan.DEVICE[stage].items() for part in pair]
    options_from_args(get_args_parser().parse_args(flags)).validate()

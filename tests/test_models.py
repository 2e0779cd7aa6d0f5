"""Models a trial trains: built in, torchvision, or the user's factory."""

from __future__ import annotations

import pytest
import torch

from raytune_loader.errors import ModelError
from raytune_loader.measuring.models import build_model, default_model, validate_step


def test_the_default_follows_the_device() -> None:
    assert (default_model(cuda=True), default_model(cuda=False)) == ("resnet50", "small-cnn")


@pytest.mark.parametrize("name", ["small-cnn", "resnet18", "datasets_for_tests:linear_model"])
def test_every_kind_of_model_gets_the_dataset_s_classes(name: str) -> None:
    model = build_model(name, num_classes=7)
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 7)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("resnet9000", "unknown model 'resnet9000'"),
        ("no_such_module:make", "cannot import"),
        ("datasets_for_tests:nothing_here", "has no callable"),
    ],
)
def test_a_model_no_trial_could_build_is_refused_early(name: str, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        validate_step(None, name)


def test_a_train_step_is_checked_instead_of_the_model_and_is_what_the_job_trains() -> None:
    assert validate_step(None, "small-cnn") == "small-cnn"
    assert validate_step("datasets_for_tests:make_step", "resnet9000") == (
        "datasets_for_tests:make_step"
    )  # the model is not the user's: not checked
    with pytest.raises(ModelError, match="for train step .no_such_module:make."):
        validate_step("no_such_module:make", "small-cnn")


def test_a_factory_that_returns_no_module_is_named() -> None:
    with pytest.raises(ModelError, match="datasets_for_tests:not_a_model returned str"):
        build_model("datasets_for_tests:not_a_model", 3)

"""Models that trials train: torchvision classifiers by name, a built-in small CNN,
or the user's own ``module:function``.

The default depends on the device. On a GPU it is ``resnet50``. On a CPU it is
``small-cnn``, a four-layer convolutional network that trains at about the speed
a single core decodes an ImageNet JPEG: the ratio between model and input
pipeline that a GPU job has, so the loader matters on a CPU too and a search
finishes in minutes (a torchvision model on a CPU is so slow that no loader
setting would show).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from raytune_loader.errors import ModelError
from raytune_loader.factories import import_factory

SMALL_CNN = "small-cnn"
DEFAULT_GPU_MODEL = "resnet50"


def default_model(cuda: bool) -> str:
    """The model trials train when none is given: ``resnet50`` on a GPU, ``small-cnn`` on a
    CPU."""
    return DEFAULT_GPU_MODEL if cuda else SMALL_CNN


def _conv_bn_relu(c_in: int, c_out: int, kernel: int, stride: int) -> nn.Sequential:
    padding = 0 if kernel == stride else kernel // 2
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride, padding, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


def small_cnn(num_classes: int = 1000) -> nn.Module:
    """Patchify stem then three strided conv blocks: a model cheap enough on a CPU for
    the input pipeline to matter."""
    return nn.Sequential(
        _conv_bn_relu(3, 16, 4, 4),
        _conv_bn_relu(16, 32, 3, 2),
        _conv_bn_relu(32, 64, 3, 2),
        _conv_bn_relu(64, 128, 3, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, num_classes),
    )


def _torchvision_names() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def validate_step(train_step: str | None, model: str) -> str:
    """Fail early, in the driver, on a step no trial could build: the user's
    ``--train-step``, or else the model (a torchvision name, ``small-cnn``, or a
    ``module:function``), its factory imported. Returns what the job trains: the step's
    ``module:function``, or the model's name."""
    name, kind = (train_step, "train step") if train_step else (model, "model")
    if train_step or ":" in name:
        import_factory(name, kind=kind, error=ModelError)
    elif name != SMALL_CNN and name not in _torchvision_names():
        examples = ", ".join(["small-cnn", "resnet18", "resnet50", "mobilenet_v3_small"])
        raise ModelError(
            f"unknown model {name!r}: use a torchvision classification model name "
            f"(e.g. {examples}) or module:function returning a torch.nn.Module"
        )
    return name


def build_model(name: str, num_classes: int) -> nn.Module:
    """Instantiate the model, untrained (weights are never downloaded)."""
    if name == SMALL_CNN:
        return small_cnn(num_classes)
    if ":" in name:
        factory = import_factory(name, kind="model", error=ModelError)
        model = _call_with_num_classes(factory, num_classes)
        if not isinstance(model, nn.Module):
            raise ModelError(f"{name} returned {type(model).__name__}, not a torch.nn.Module")
        return model
    import torchvision

    validate_step(None, name)
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


def _call_with_num_classes(factory: Callable[..., object], num_classes: int) -> object:
    params = inspect.signature(factory).parameters
    if "num_classes" in params:
        return factory(num_classes=num_classes)
    return factory()

"""Import a user's ``package.module:function`` factory with a clear error."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def import_factory(spec: str, *, kind: str, error: type[Exception]) -> Callable[..., object]:
    """The callable named by ``module:function``; ``error`` says what went wrong."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise error(f"{kind} factory {spec!r} must look like package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(
            f"cannot import {module_name!r} for {kind} {spec!r} ({exc}); "
            "make sure it is installed or on PYTHONPATH"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise error(f"{module_name} has no callable {attr!r} for {kind} {spec!r}")
    return factory

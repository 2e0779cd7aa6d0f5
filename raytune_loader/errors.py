"""Exceptions raised by raytune_loader.

Every exception the package raises on purpose derives from
:class:`RaytuneLoaderError`. :class:`UserInputError` and its subclasses are
mistakes a user can fix; their message says how, and the command line prints it
as one line with exit status 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class RaytuneLoaderError(Exception):
    """Base class of every exception raised on purpose by raytune_loader."""


class UserInputError(RaytuneLoaderError):
    """A mistake in what the user asked for; the message says what to do."""


class DatasetError(UserInputError):
    """Unknown dataset, or the data is missing, empty or unreadable."""


class StoreRefusedError(DatasetError):
    """A store refused this process (no such bucket, access denied, no credentials): it
    would refuse every read, so the search stops before any trial."""


class ModelError(UserInputError):
    """Unknown model, or a model factory that does not return a module."""


class ConfigError(UserInputError):
    """An impossible option value or a malformed best_config.json."""


class OutputError(UserInputError):
    """The results folder cannot be written."""


class SearchFailedError(RaytuneLoaderError):
    """The search ran but produced no usable configuration (every trial failed)."""


class SearchInterruptedError(RaytuneLoaderError):
    """Ctrl-C stopped the search; finished trials are kept and --resume continues it."""


class TrialFailure(RaytuneLoaderError):
    """A trial ends for a recorded reason: ``reason`` is a short tag for trials.csv
    (``host_memory``, ``shm``, ``corrupt_sample``, ``data_loader``, ``timeout``) and the
    message says why in words."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # crosses Ray's process boundary
        return (type(self), (self.reason, str(self)))


class TrialRefusedError(TrialFailure):
    """A candidate configuration was refused before it started (not enough memory)."""


class DataPipelineError(TrialFailure):
    """Fetching a batch failed (worker died, dataset raised, corrupt file, time-out)."""


class CorruptSampleError(RaytuneLoaderError):
    """A sample file could not be decoded; the message names the file."""


class BatchSizeTooSmallError(RaytuneLoaderError):
    """CUDA ran out of memory even at the minimum batch size."""


CORRUPT = "corrupt sample "  # how a CorruptSampleError's message starts
CORRUPT_FIX = "remove or replace that file and run the search again"


def corrupt_said(text: str) -> str | None:
    """``corrupt sample <file>: <why>`` where ``text`` (a reason, an error's last line,
    however wrapped: a worker's, Ray's) says a sample file is corrupt; None otherwise."""
    at = text.find(CORRUPT)
    return text[at:] if at >= 0 else None


def last_line(exc: BaseException) -> str:
    """``Type: message`` from an exception's last non-empty line (errors raised in C++
    or in a DataLoader worker carry a stack trace before it)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[-1] if lines else type(exc).__name__
    return text if text.startswith(type(exc).__name__) else f"{type(exc).__name__}: {text}"

"""How long work reports its progress: the :class:`Progress` protocol.

The search and the bench tell a ``Progress`` object what they do; the command
line passes one that prints (:class:`raytune_loader.outputs.console.TerminalProgress`),
the Python API defaults to :class:`LogProgress`, which only logs.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Progress(Protocol):
    """Where long work says how it goes; the command line prints it, the API logs it."""

    def stage(self, text: str) -> None:
        """A phase starts (``text`` says which)."""

    def count(self, what: str, done: int, total: int) -> None:
        """``done`` of ``total`` of ``what`` are finished."""

    def trial(self, event: Any) -> None:
        """A trial reported, finished or failed (a
        :class:`~raytune_loader.tuning.tuner.TrialEvent`)."""

    def warn(self, text: str) -> None:
        """Something the user should know, in one line."""


class LogProgress(Progress):
    """Progress as log lines (the API's default)."""

    def stage(self, text: str) -> None:
        log.info("%s", text)

    def count(self, what: str, done: int, total: int) -> None:
        log.info("%s: %d/%d", what, done, total)

    def trial(self, event: Any) -> None:
        log.debug("trial %s %s", event.trial_id, event.kind)

    def warn(self, text: str) -> None:
        log.warning("%s", text)

"""How long work reports its progress: the :class:`Progress` protocol.

The search and the bench tell a ``Progress`` object what they do; the command
line passes one that prints (:class:`raytune_loader.console.TerminalProgress`),
the Python API defaults to :class:`LogProgress`, which only logs.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Progress(Protocol):
    def stage(self, text: str) -> None: ...
    def count(self, what: str, done: int, total: int) -> None: ...
    def trial(self, event: Any) -> None: ...
    def warn(self, text: str) -> None: ...


class LogProgress:
    """Progress as log lines (the API's default)."""

    def stage(self, text: str) -> None:
        log.info("%s", text)

    def count(self, what: str, done: int, total: int) -> None:
        log.info("%s: %d/%d", what, done, total)

    def trial(self, event: Any) -> None:
        log.debug("trial %s %s", event.trial_id, event.kind)

    def warn(self, text: str) -> None:
        log.warning("%s", text)

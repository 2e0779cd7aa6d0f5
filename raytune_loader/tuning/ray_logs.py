"""Ray's own log lines that a search leaves out: hints that do not apply to its users.

Ray and Tune log to the command's terminal. Two of their lines send this tool's users
the wrong way: Tune's hint to resume an interrupted run with ``Tuner.restore`` (the
command resumes with ``--resume``, as its own last line says), and Ray's warning, on
starting a local instance, on how to turn token authentication off (it stays on). Each
is left out, while the call that logs it runs, by :func:`filtered` on the logger that
logs it; every other line of those loggers passes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

# the logger of Tune's run loop (ray.tune.tune), which on Ctrl-C tells to resume with
# ``Tuner.restore(path=..., trainable=...)``: a command-line user continues with
# --resume, as the command's own last line says
TUNE_RUN_LOGGER = "ray.tune.tune"
RESTORE_HINT = "Tuner.restore("
# the logger of Ray's token set-up, which warns on a local start that token
# authentication is on and how to turn it off: it stays on here
AUTH_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"
AUTH_ON_WARNING = "Token authentication is enabled for this Ray cluster"


class _Without(logging.Filter):
    """Leaves out the lines that hold ``text``; the others pass."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return self.text not in record.getMessage()
        except (TypeError, ValueError):  # its arguments do not format: let its handler say
            return True


@contextlib.contextmanager
def filtered(logger: str, text: str) -> Iterator[None]:
    """Inside, ``logger`` leaves out its lines that hold ``text``."""
    without = _Without(text)
    logging.getLogger(logger).addFilter(without)
    try:
        yield
    finally:
        logging.getLogger(logger).removeFilter(without)

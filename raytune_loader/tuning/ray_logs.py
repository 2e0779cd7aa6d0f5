"""Ray's own log lines that a search leaves out: hints that do not apply to its users.

Ray and Tune log to the command's terminal. Two of their lines send this tool's users
the wrong way: Tune's hint to resume an interrupted run with ``Tuner.restore`` (the
command resumes with ``--resume``, as its own last line says), and Ray's warning, on
starting a local instance, on how to turn token authentication off (it stays on). On
Ctrl-C two more crowd the terminal: Tune's timestamped notice that it is stopping, said
instead in a line of the command's own, and the analysis's multi-line warning that the
trial Ctrl-C cut short has no metrics (``trials.csv`` gives it as interrupted). Each is
left out, while the call that logs it runs, by :func:`filtered` on the logger that logs
it; every other line of those loggers passes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

# the logger of Tune's run loop (ray.tune.tune), which on Ctrl-C tells to resume with
# ``Tuner.restore(path=..., trainable=...)``: a command-line user continues with
# --resume, as the command's own last line says
TUNE_RUN_LOGGER = "ray.tune.tune"
RESTORE_HINT = "Tuner.restore("
# Tune's notice on the first Ctrl-C (one long timestamped line), and what is said instead
STOP_NOTICE = "Stop signal received"
STOP_SAID = "Ctrl-C: ending the search, the trials finished so far kept (Ctrl-C again: at once)"
# the logger of the result grid's analysis, which warns, over several lines, that a trial
# Ctrl-C cut short left no result (left out only after the stop notice: on a run that
# was not stopped, a trial without results is news)
ANALYSIS_LOGGER = "ray.tune.analysis.experiment_analysis"
NO_METRICS = "Failed to fetch metrics for"
# the logger of Ray's token set-up, which warns on a local start that token
# authentication is on and how to turn it off: it stays on here
AUTH_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"
AUTH_ON_WARNING = "Token authentication is enabled for this Ray cluster"


class _Without(logging.Filter):
    """Leaves out the lines that hold ``text`` (once ``after`` has left out one of its
    own, where given), each said as ``instead`` on stderr where given; the others pass."""

    def __init__(
        self, text: str, instead: str | None = None, after: _Without | None = None
    ) -> None:
        super().__init__()
        self.text = text
        self.instead = instead
        self.after = after
        self.left_out = False  # whether a line was left out

    def filter(self, record: logging.LogRecord) -> bool:
        if self.after is not None and not self.after.left_out:
            return True
        try:
            found = self.text in record.getMessage()
        except (TypeError, ValueError):  # its arguments do not format: let its handler say
            return True
        if found:
            self.left_out = True
            if self.instead:
                _say(self.instead)
        return not found


def _say(line: str) -> None:
    """A line on stderr from inside a signal handler (Tune logs its notice there): one
    ``os.write``, which neither re-enters a buffered stream the interrupted code was
    writing nor raises into the handler."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no stderr: unsaid
        os.write(sys.stderr.fileno(), f"{line}\n".encode())


@contextlib.contextmanager
def filtered(
    logger: str, text: str, instead: str | None = None, after: _Without | None = None
) -> Iterator[_Without]:
    """Inside, ``logger`` leaves out its lines that hold ``text`` (each said as
    ``instead``, where given; only once the filter ``after`` left out a line, where
    given); yields the filter."""
    without = _Without(text, instead, after)
    logging.getLogger(logger).addFilter(without)
    try:
        yield without
    finally:
        logging.getLogger(logger).removeFilter(without)

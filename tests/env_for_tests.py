"""What tests that start servers and processes share: a free port on loopback, and this
process's environment changed for the processes started meanwhile."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` while the block runs, the environment restored after."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

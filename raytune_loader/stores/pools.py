"""Fetch threads per reading thread: :class:`FetchPools`.

A candidate's ``fetch_threads`` are requests in flight *per loader worker*, as the cost
model and ``LoaderConfig.in_flight`` count them. Worker processes each read in one
thread, but thread workers are threads of one process, reading the same dataset object:
a pool per process would leave them sharing ``fetch_threads`` requests between them.
A pool per reading thread keeps the count per worker either way.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class FetchPools:
    """A pool of fetch threads for each thread that reads and each size it asks for,
    made when it first asks.

    A thread's pools go with it (thread-local: when a thread worker ends, its pools are
    collected and their idle threads exit); a forked worker process makes its own (the
    parent's threads did not come with it); a pickled copy (a spawned worker's) starts
    with none."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._local = threading.local()
        self._pid = os.getpid()

    def get(self, threads: int) -> ThreadPoolExecutor:
        """The calling thread's pool of ``threads`` fetch threads. A thread asking for
        another size gets another pool beside the first, which stays open: a reader
        still holding it (a stream read in turn with another) may submit to it again."""
        if self._pid != os.getpid():
            self._local, self._pid = threading.local(), os.getpid()
        pools: dict[int, ThreadPoolExecutor] = getattr(self._local, "pools", None) or {}
        self._local.pools = pools
        if threads not in pools:
            pools[threads] = ThreadPoolExecutor(threads, self.name)
        return pools[threads]

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["name"])  # type: ignore[misc]

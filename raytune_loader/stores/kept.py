"""Objects a profile reads again, kept in memory so that each is fetched once.

The profile reads the same objects (a bucket's single images, or a stream's shards) for
every structure it measures: its untimed samples, and each structure's worker side.
Inside :func:`kept`, every object :meth:`~raytune_loader.stores.store.Store.get` fetches
whole is kept (by URL, up to :data:`KEPT_BYTES` in all), and, where the block serves
them, one kept is answered from memory, in any thread, without a request. The first
structure's worker side reads with ``serve`` off: its GETs are all made, and timed; the
others read the objects it kept and take its GET figures. Never around a measurement:
a trial's reads go to the store. The block is the process's, entered by one thread at
a time (the profile's); the threads it starts read under it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

KEPT_BYTES = 256 << 20  # the most :func:`kept` holds
_LOCK = threading.Lock()  # the fetch threads keep objects at once


@dataclass(frozen=True)
class Keeping:
    """A :func:`kept` block: the objects it holds, and whether it answers reads from them."""

    blobs: dict[str, bytes]
    serve: bool

    def held(self, url: str) -> bytes | None:
        """The object at ``url`` as kept, where this block serves it; else None."""
        return self.blobs.get(url) if self.serve else None

    def keep(self, url: str, blob: bytes) -> None:
        """Keep the object fetched at ``url``, within :data:`KEPT_BYTES`."""
        with _LOCK:
            if sum(map(len, self.blobs.values())) + len(blob) <= KEPT_BYTES:
                self.blobs.setdefault(url, blob)


_KEEPING: Keeping | None = None


def current() -> Keeping | None:
    """The block reads are under now; None outside one. A read takes it once, before
    its request: a fetch thread may outlive the block that set it."""
    return _KEEPING


@contextlib.contextmanager
def kept(blobs: dict[str, bytes], *, serve: bool = True) -> Iterator[None]:
    """Inside, the objects fetched are kept in ``blobs`` (by URL), and, with ``serve``,
    one kept there is not fetched again; after the block (an error too) reads are as
    they were before it (outside every block: from the store)."""
    global _KEEPING
    previous, _KEEPING = _KEEPING, Keeping(blobs, serve)
    try:
        yield
    finally:
        _KEEPING = previous


@contextlib.contextmanager
def served() -> Iterator[bool]:
    """Inside a :func:`kept` block, its objects served for a while (the reads again of
    what it fetched); yields whether there is such a block."""
    keeping = _KEEPING
    if keeping is None:
        yield False
        return
    with kept(keeping.blobs, serve=True):
        yield True

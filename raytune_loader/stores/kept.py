"""Objects a profile reads again, kept in memory so that each is fetched once.

The profile reads the same objects (a bucket's single images, or a stream's shards) for
every structure it measures: its untimed samples, and each structure's worker side.
Inside :func:`kept`, every object :meth:`~raytune_loader.stores.store.Store.get` fetches
whole is kept (by URL, up to :data:`KEPT_BYTES` in all), and one kept is answered from
memory, in any thread, without a request. The first structure's worker side reads with
``serve`` off: its GETs are all made, and timed; the others read the objects it kept
and take its GET figures. Never around a measurement: a trial's reads go to the store.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

KEPT_BYTES = 256 << 20  # the most :func:`kept` holds


@dataclass(frozen=True)
class _Keeping:
    blobs: dict[str, bytes]
    serve: bool


_KEEPING: _Keeping | None = None
_LOCK = threading.Lock()  # the fetch threads keep objects at once


@contextlib.contextmanager
def kept(blobs: dict[str, bytes], *, serve: bool = True) -> Iterator[None]:
    """Inside, the objects fetched are kept in ``blobs`` (by URL), and, with ``serve``,
    one kept there is not fetched again; after the block (an error too) every read goes
    to the store."""
    global _KEEPING
    previous, _KEEPING = _KEEPING, _Keeping(blobs, serve)
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


def held(url: str) -> bytes | None:
    """The object at ``url`` as kept, where a :func:`kept` block serves it; else None."""
    keeping = _KEEPING  # once: a fetch thread may outlive the block that set it
    if keeping is None or not keeping.serve:
        return None
    return keeping.blobs.get(url)


def keep(url: str, blob: bytes) -> None:
    """Keep the object fetched at ``url``, inside a :func:`kept` block and within its
    :data:`KEPT_BYTES`."""
    keeping = _KEEPING
    if keeping is None:
        return
    with _LOCK:
        if sum(map(len, keeping.blobs.values())) + len(blob) <= KEPT_BYTES:
            keeping.blobs.setdefault(url, blob)

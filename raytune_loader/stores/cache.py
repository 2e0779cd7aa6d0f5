"""A local cache of a bucket's objects: the second epoch read from disk, not the store.

:class:`ObjectCache` keeps each object a worker fetched as a file of a folder on the
node's disk, named by a hash of its bucket and key, under a byte budget. A read looks
there first; a miss is one GET (through :class:`~raytune_loader.stores.store.Store`,
retried and counted as every request is) whose bytes are written beside it, atomically
(a temporary file renamed), so the loader's worker processes and threads share the
folder without a lock and a reader never sees half a file. Once the budget is spent
nothing more is written: an object that does not fit is read from the store each
epoch. The budget is kept per process (the bytes the folder held when the process
first wrote, plus what it wrote since), so several workers may together pass it by
what they write at once, a batch each.

Where an epoch fits, every epoch after the first reads the node's disk (and its page
cache) and sends no request: the search measures such a candidate warm, after a cold
pass over its samples, in a folder of its own (``docs/object_storage.md``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raytune_loader.stores.store import Store

DEFAULT_FOLDER = Path("~/.cache/raytune_loader/objects")
FREE_SHARE = 0.5  # of the disk's free bytes a default budget takes


def default_folder() -> Path:
    """Where training keeps a bucket's objects by default (under ``$XDG_CACHE_HOME``
    when set)."""
    base = os.environ.get("XDG_CACHE_HOME")
    return Path(base, "raytune_loader", "objects") if base else DEFAULT_FOLDER.expanduser()


def default_budget(folder: Path) -> int:
    """Half the free bytes of the disk ``folder`` is on (or would be)."""
    where = folder
    while not where.exists() and where != where.parent:
        where = where.parent
    return int(shutil.disk_usage(where).free * FREE_SHARE)


@dataclass
class ObjectCache:
    """Objects of a store kept as files of ``folder``, ``budget`` bytes at most."""

    folder: Path
    budget: int
    _used: int | None = field(default=None, repr=False)
    _pid: int = field(default=0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "budget": self.budget}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["folder"], state["budget"])  # type: ignore[misc]

    def get(self, store: Store, key: str) -> bytes:
        """The object ``key`` of ``store``: from the folder, or fetched and kept there
        while the budget lasts."""
        path = self._path(store, key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            pass
        blob = store.get(key)
        if self._reserve(len(blob)):
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".part-")
            with os.fdopen(handle, "wb") as out:
                out.write(blob)
            os.replace(temporary, path)
        return blob

    def held_bytes(self) -> int:
        """The bytes the folder holds now."""
        if not self.folder.is_dir():
            return 0
        return sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file())

    def _path(self, store: Store, key: str) -> Path:
        name = hashlib.sha256(f"{store.url.scheme}://{store.url.bucket}/{key}".encode()).hexdigest()
        return self.folder / name[:2] / name

    def _reserve(self, size: int) -> bool:
        """Whether ``size`` more bytes fit the budget (counted as written if so)."""
        if self._pid != os.getpid():  # a forked worker: the parent's lock may be held by
            # a thread that did not come with it
            self._lock, self._used, self._pid = threading.Lock(), None, os.getpid()
        with self._lock:
            if self._used is None:
                self._used = self.held_bytes()
            if self._used + size > self.budget:
                return False
            self._used += size
            return True

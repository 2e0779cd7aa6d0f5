"""A local cache of a bucket's objects: the second epoch read from disk, not the store.

:class:`ObjectCache` keeps each object a worker fetched as a file of a folder on the
node's disk, named by a hash of its endpoint, bucket, key and version (a hash of the
ETag the listing saw: an object written again since is fetched anew, never read
stale), under a byte budget. A read looks there first; a miss is one GET (through
:class:`~raytune_loader.stores.store.Store`, retried and counted as every request is)
whose bytes are written beside it, whole (a temporary file renamed), so the loader's
worker processes and threads share the folder and a reader never sees half a file.
The bytes written are counted in the folder's ``.used`` file under an exclusive
``flock``, so every process and thread of the node keeps to the one budget; once it
is spent nothing more is written, and an object that does not fit is read from the
store each epoch. A write that fails (a full disk) leaves nothing behind and the read
still returns its bytes.

Nothing is evicted: the copy of an object written again stays, counted in the budget,
until the folder is deleted to free the space.

Where an epoch fits, every epoch after the first reads the node's disk (and, while it
holds them, its page cache) and sends no request: the search measures such a candidate
warm, after a cold pass over its samples (its own, or the search's first cache
trial's: ``docs/object_storage.md``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from raytune_loader.stores.store import Store

FREE_SHARE = 0.5  # of the disk's free bytes a default budget takes
USED = ".used"  # the folder's count of the bytes written, under flock


def default_folder() -> Path:
    """Where training keeps a bucket's objects by default: ``raytune_loader/objects``
    under ``$XDG_CACHE_HOME``, or ``~/.cache``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base, "raytune_loader", "objects")


def default_budget(folder: Path) -> int:
    """Half the free bytes of the disk ``folder`` is on (or would be)."""
    where = folder
    while not where.exists() and where != where.parent:
        where = where.parent
    return int(shutil.disk_usage(where).free * FREE_SHARE)


@dataclass(frozen=True)
class ObjectCache:
    """Objects of a store kept as files of ``folder``, ``budget`` bytes at most."""

    folder: Path
    budget: int

    def get(self, store: Store, key: str, version: int = 0) -> bytes:
        """The object ``key`` of ``store`` at ``version`` (a hash of its listed ETag): from
        the folder, or fetched and kept there while the budget lasts."""
        path = self._path(store, key, version)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            pass
        blob = store.get(key)
        with contextlib.suppress(OSError):  # a cache that cannot write is only slower
            self._keep(path, blob)
        return blob

    def held_bytes(self) -> int:
        """The bytes of the objects the folder holds now."""
        if not self.folder.is_dir():
            return 0
        return sum(
            p.stat().st_size for p in self.folder.rglob("*") if p.is_file() and p.name != USED
        )

    def _path(self, store: Store, key: str, version: int) -> Path:
        endpoint = store.options.resolved().endpoint_url or "aws"
        where = f"{endpoint}|{store.url.scheme}://{store.url.bucket}/{key}|{version}"
        name = hashlib.sha256(where.encode()).hexdigest()
        return self.folder / name[:2] / name

    def _keep(self, path: Path, blob: bytes) -> None:
        """Write ``blob`` at ``path`` whole, if it fits the budget."""
        if not self._reserve(len(blob)):
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".part-")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(blob)
            os.replace(temporary, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            self._reserve(-len(blob))
            raise

    def _reserve(self, size: int) -> bool:
        """Whether ``size`` more bytes fit the budget (counted as written if so; a
        negative size gives bytes back)."""
        with self._counter() as counter:
            text = counter.read().strip()
            used = int(text) if text else self.held_bytes()
            if size > 0 and used + size > self.budget:
                return False
            counter.seek(0)
            counter.truncate()
            counter.write(str(max(0, used + size)))
            return True

    @contextlib.contextmanager
    def _counter(self) -> Iterator[IO[str]]:
        """The folder's byte count, held exclusively (every process and thread opens it
        anew, so ``flock`` orders them all)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / USED, "a+") as counter:
            fcntl.flock(counter, fcntl.LOCK_EX)
            counter.seek(0)
            yield counter

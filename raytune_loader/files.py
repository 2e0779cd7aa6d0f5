"""Files a search leaves behind, written atomically.

``best_config.json``, ``trials.csv`` and the report are written to a temporary file,
then renamed over the old one, so a second search on the same dataset never leaves a
half-written result; :func:`ensure_writable` refuses, before any work, a results
folder that cannot be written.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from raytune_loader.errors import OutputError

# the process's umask, read once at import (reading it means setting it): a result file
# gets the mode ``open`` would give it, where ``mkstemp``'s is 0600, readable by no one
# else on a cluster's shared disk
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def temporary_beside(path: Path, suffix: str = "") -> tuple[int, str]:
    """A temporary file (descriptor, name) in ``path``'s folder, to be renamed over
    ``path``, with the mode a file newly opened for writing gets (0666 less the umask)
    where the file system keeps modes (a FAT disk refuses to change them: its own)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666 & ~_UMASK)
    return fd, tmp


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the new, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temporary_beside(path)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ensure_writable(folder: Path) -> tuple[Path, ...]:
    """Fail before the search, not after it, when results cannot be written; the
    folders it made, outermost first (:func:`remove_if_empty` takes them away again
    where the search ends before it wrote anything)."""
    made = tuple(reversed([p for p in (folder, *folder.parents) if not p.exists()]))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise OutputError(
            f"cannot write results to {folder} ({exc.strerror or exc}); choose another --out"
        ) from None
    return made


def remove_if_empty(folders: tuple[Path, ...]) -> None:
    """Take ``folders`` (outermost first, as :func:`ensure_writable` made them) away
    again, innermost first, each only where it is empty."""
    for folder in reversed(folders):
        with contextlib.suppress(OSError):  # not empty (or gone): it stays
            folder.rmdir()


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as indented JSON at ``path``, written atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """``rows`` as CSV at ``path`` with ``columns`` (None as empty), written atomically."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in columns})
    atomic_write_text(path, buffer.getvalue())

"""Engines: who makes a candidate's batches, decided once.

A candidate's ``engine`` names one of :data:`ENGINES`; :func:`engine_of` gives the
:class:`~raytune_loader.engines.base.Engine` that answers for it everywhere else (what it
reserves, how it builds its batches, what it holds in flight, what its segment watches,
how ``best_config.json`` writes and reads it), so no other module asks which engine a
candidate runs. A new engine is one module here with its ``Engine`` subclass, one line
in :data:`ENGINES`, its name in ``candidates.rules.ENGINES``, and in
``candidates.rules.engine_fixes`` the fields it fixes.

May import: the foundations, ``candidates``, ``pipeline``, ``loaders``, ``sources``,
``raydata``. Imported by: ``measuring`` and the rooms above it.
"""

from __future__ import annotations

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.engines.base import Engine, Held, SegmentWatch, Verdict
from raytune_loader.engines.dataloader import DataLoaderEngine
from raytune_loader.engines.raydata import RayDataEngine
from raytune_loader.errors import ConfigError

ENGINES: dict[str, type[Engine]] = {
    DataLoaderEngine.name: DataLoaderEngine,
    RayDataEngine.name: RayDataEngine,
}


def engine_of(config: LoaderConfig) -> Engine:
    """The engine that runs ``config``.

    Args:
        config: a candidate.

    Returns:
        Its :class:`Engine`, bound to it.
    """
    return engine_named(config.engine)(config)


def engine_named(name: str) -> type[Engine]:
    """The engine class of a name as ``best_config.json`` and ``trials.csv`` write it.

    Args:
        name: an engine's name (``dataloader``, ``raydata``).

    Returns:
        Its :class:`Engine` subclass; a ConfigError for a name no engine has.
    """
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {name!r}") from None


def config_from_settings(section: dict[str, object]) -> LoaderConfig:
    """The candidate a ``best_config.json`` section describes, whichever engine's
    settings it holds (:meth:`Engine.settings`).

    Args:
        section: a candidate's settings (the file's top level, a runner-up, a baseline).

    Returns:
        The candidate; a ConfigError where no engine reads the section.
    """
    for engine in ENGINES.values():
        if section.get("engine", engine.name) != engine.name:
            continue
        found = engine.from_settings(section)
        if found is not None:
            return found
    raise ConfigError("a section has neither loader nor raydata settings")


__all__ = [
    "ENGINES",
    "Engine",
    "Held",
    "SegmentWatch",
    "Verdict",
    "config_from_settings",
    "engine_named",
    "engine_of",
]

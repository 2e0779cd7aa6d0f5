"""What a Ray Data candidate reserves, and where its actors may run.

:func:`actor_bundles` are the bundles a trial holds for its actors beside its own
(one per actor of the pool at its largest); :func:`remote_cpus` and :func:`is_remote`
tell the nodes beyond the trials' (those without ``--node-type``'s resource, and with
``--cpu-node-type``'s when it is given) from ``ray.nodes()``' resources.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from raytune_loader.raydata.config import RayDataConfig

if TYPE_CHECKING:
    pass
log = logging.getLogger(__name__)


PIN_SHARE = 0.001  # a sliver of a custom resource pins a bundle to the nodes that carry it


# The reservation ------------------------------------------------------------------------


def actor_bundles(config: RayDataConfig, pin: str | None = None) -> list[dict[str, float]]:
    """One placement-group bundle per actor of the pool at its largest, each the CPUs one
    actor takes (and a sliver of ``pin``, a custom resource of the CPU nodes, to keep
    them there): any actor fits any of them, and the strategy may put them on
    different nodes."""
    bundle: dict[str, float] = {"CPU": float(config.cpus_per_actor)}
    if pin:
        bundle[pin] = PIN_SHARE
    return [dict(bundle) for _ in range(config.max_actors)]


def remote_cpus(
    nodes: Sequence[Mapping[str, float]], trial_resource: str | None, pin: str | None = None
) -> float:
    """CPUs of the nodes beyond the trials' (those without ``trial_resource``; with
    ``pin``, only those carrying it), from ``ray.nodes()``' resources: what Ray Data
    candidates may take. None without a resource that tells the trials' nodes apart:
    on one machine nothing is remote."""
    return float(sum(n.get("CPU", 0.0) for n in nodes if is_remote(n, trial_resource, pin)))


def is_remote(
    resources: Mapping[str, float], trial_resource: str | None, pin: str | None = None
) -> bool:
    """Whether a node (its ``ray.nodes()`` resources) is beyond the trials': without
    ``trial_resource`` (and with ``pin``, when given); none is without the resource."""
    if not trial_resource:
        return False
    return resources.get(trial_resource, 0) <= 0 and (not pin or resources.get(pin, 0) > 0)

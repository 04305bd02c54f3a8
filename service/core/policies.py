"""The placement policies by name, each built by its typed factory."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from service.core.granularity import granular_policy
from service.core.placement import DeviceFinder, container_policy, replica_policy
from service.core.scheduler import PlacementPolicy
from service.core.slicing import slice_policy
from service.domain.error import InvalidInputError

# ``slice``: one placement over every granularity; ``replica`` and ``slice-fixed`` (one quantum,
# owner priority only) are its named baselines.
PLACEMENT_POLICIES: Mapping[str, Callable[..., PlacementPolicy]] = {
    "container": container_policy, "replica": replica_policy, "slice": granular_policy, "slice-fixed": slice_policy}


def make_placement_policy(name: str, *, find_devices: DeviceFinder | None = None, **params: Any) -> PlacementPolicy:
    """The policy ``name`` built by its typed factory; ``find_devices`` is passed to the
    whole-replica device search of ``replica`` and ``slice`` (the others plan without it); unknown
    names and parameters are ``InvalidInputError``."""
    factory = PLACEMENT_POLICIES.get(name)
    if factory is None:
        raise InvalidInputError(f"unknown placement policy {name!r} (known: {', '.join(PLACEMENT_POLICIES)})")
    if name in ("replica", "slice"):
        params["find_devices"] = find_devices
    try:
        return factory(**params)
    except TypeError as exc:
        raise InvalidInputError(f"placement policy {name!r}: {exc}") from None

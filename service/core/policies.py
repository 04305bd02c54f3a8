"""The placement policies by name: each registered with its typed factory and the candidate
searches it takes; :func:`make_placement_policy` checks the arguments against the factory's
types before building."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from service.core.granularity import granular_policy
from service.core.placement import DeviceFinder, container_policy, replica_policy
from service.core.scheduler import PlacementPolicy
from service.core.slicing import slice_policy
from service.domain.error import InvalidInputError


@dataclass(frozen=True, slots=True)
class RegisteredPolicy:
    """A placement policy's typed factory (keyword arguments only), and whether it plans whole
    replicas from the device search (``find_devices``: the Cypher slot search live)."""

    factory: Callable[..., PlacementPolicy]
    takes_device_search: bool = False


# ``slice``: one placement over every granularity; ``replica`` and ``slice-fixed`` (one quantum,
# owner priority only) are its named baselines.
PLACEMENT_POLICIES: Mapping[str, RegisteredPolicy] = {
    "container": RegisteredPolicy(container_policy),
    "replica": RegisteredPolicy(replica_policy, takes_device_search=True),
    "slice": RegisteredPolicy(granular_policy, takes_device_search=True),
    "slice-fixed": RegisteredPolicy(slice_policy),
}


def make_placement_policy(name: str, *, find_devices: DeviceFinder | None = None, **params: Any) -> PlacementPolicy:
    """The policy ``name`` built by its typed factory; ``find_devices`` goes to the policies
    registered as taking the device search (the others plan without it); unknown names,
    unknown parameters and values of the wrong type are ``InvalidInputError``."""
    registered = PLACEMENT_POLICIES.get(name)
    if registered is None:
        raise InvalidInputError(f"unknown placement policy {name!r} (known: {', '.join(PLACEMENT_POLICIES)})")
    check_params(name, registered.factory, params)
    if registered.takes_device_search:
        params["find_devices"] = find_devices
    return registered.factory(**params)


def check_params(name: str, factory: Callable[..., Any], params: Mapping[str, Any]) -> None:
    """``InvalidInputError`` for a parameter ``factory`` does not take, or a value that is not of
    its declared type (numbers: an int is a float, a bool is neither; callables and other types
    are not checked)."""
    hints = typing.get_type_hints(factory)
    known = {p.name for p in inspect.signature(factory).parameters.values() if p.kind is p.KEYWORD_ONLY}
    for key, value in params.items():
        if key not in known:
            raise InvalidInputError(f"placement policy {name!r} takes no parameter {key!r} "
                                    f"(it takes: {', '.join(sorted(known)) or 'none'})")
        if not _of_type(value, hints.get(key, Any)):
            raise InvalidInputError(f"placement policy {name!r}: {key} must be {_type_name(hints[key])}, "
                                    f"got {value!r}")


_NUMBERS: dict[Any, tuple[type, ...]] = {float: (int, float), int: (int,), bool: (bool,), str: (str,)}


def _of_type(value: Any, hint: Any) -> bool:
    if hint in _NUMBERS:
        return isinstance(value, _NUMBERS[hint]) and (hint is bool or not isinstance(value, bool))
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_of_type(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    return True  # callables and the rest: the factory's own checks


def _type_name(hint: Any) -> str:
    return " or ".join(_type_name(a) for a in typing.get_args(hint)) if typing.get_args(hint) and (
        isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union) else getattr(hint, "__name__", str(hint))

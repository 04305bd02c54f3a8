"""Load scaling that keeps a workload's shape over time.

A replay's ``load`` multiplies the mix's offered rate. There are two ways to do it:

``compress`` (the old way)
    Every tenant's rate parameter times ``load``: a generator's rate, and a trace's clock sped
    up ``load`` times. A trace compressed into the fixed window brings in whatever its later
    minutes hold, so one burst that happens to land in the window can set the knee of the load
    curve.

``thin`` (the default of the replay CLI and the headline benchmark)
    The workload at load 1 is drawn as it is (copy 0); for ``load < 1`` each of its requests is
    kept with probability ``load``; for ``load > 1`` it is kept whole and ``ceil(load) - 1``
    further copies are laid over it, copy ``k`` thinned to keep ``min(1, load - k)`` of its
    requests. A further copy is the same mix drawn again from its own random stream, with every
    trace-timed tenant (a ``trace`` tenant's file, ``trace`` arrivals) taken from another window
    of its file: the file rotated by a random whole number of windows (a random shift where the
    file holds fewer than two windows). So the per-minute shape of each copy is its source's (a
    burst stays one burst, at ``load`` times its height on average), and a request is kept by
    drawing one uniform per request that does not depend on ``load``: the workload at a lower
    load is a subset of the one at a higher load (same seed), which keeps SLA violations close to
    monotone in load, as a bisection over load needs.

Everything is deterministic for the generator passed in: copy 0 consumes it exactly as a plain
draw at load 1 does (so load 1 is the plain workload, unchanged), then one 63-bit integer is
drawn from it that seeds every copy's content, rotation and thinning streams.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Literal

import numpy as np

from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec
from service.replay.binding import retime

LoadScaling = Literal["thin", "compress"]
LOAD_SCALINGS: tuple[LoadScaling, ...] = ("thin", "compress")
DEFAULT_LOAD_SCALING: LoadScaling = "thin"

#: Draws copy ``k`` of the workload at load 1: ``(k, content_rng, rotation_rng)`` -> requests
#: with ids ``TENANT:INDEX``. Copy 0 gets the caller's generator and no rotation (``None``).
CopySampler = Callable[[int, np.random.Generator, np.random.Generator | None], Sequence[RequestSpec]]


def parse_load_scaling(name: str) -> LoadScaling:
    """``name`` as a :data:`LoadScaling`; :class:`InvalidInputError` naming the choices."""
    for scaling in LOAD_SCALINGS:
        if name == scaling:
            return scaling
    raise InvalidInputError(f"load scaling must be one of {', '.join(LOAD_SCALINGS)}, got {name!r}")


def copies_for(load: float) -> int:
    """How many copies of the load-1 workload a ``thin`` scaling to ``load`` draws (>= 1)."""
    if not (load > 0 and math.isfinite(load)):
        raise InvalidInputError(f"load must be positive and finite, got {load}")
    return max(1, math.ceil(load))


def keep_fraction(load: float, copy: int) -> float:
    """The share of copy ``copy``'s requests kept at ``load``: ``clamp(load - copy, 0, 1)``."""
    return min(1.0, max(0.0, load - copy))


def superpose(sample: CopySampler, load: float, rng: np.random.Generator) -> list[RequestSpec]:
    """The workload at ``load`` by thinning and superposing copies of the load-1 workload.

    Contract: at ``load == 1`` the result is ``sample(0, rng, None)`` unchanged (same requests,
    ids, order); for loads ``a < b`` (same ``rng`` state) the result at ``a`` is a subset of the
    one at ``b``; requests of copy ``k >= 1`` keep their tenant and get indices after every
    earlier copy's, counted on the unthinned copies, so a request's id does not depend on
    ``load``. The result is sorted by arrival, then tenant, then index.
    """
    n = copies_for(load)
    base = list(sample(0, rng, None))
    seed = int(rng.integers(0, 2**63 - 1))
    out: list[RequestSpec] = []
    next_index: dict[str, int] = {}
    for k in range(n):
        reqs = base if k == 0 else list(sample(k, _stream(seed, k, 1), _stream(seed, k, 2)))
        keep = _stream(seed, k, 0).random(len(reqs)) < keep_fraction(load, k)
        offsets = dict(next_index)
        for r, kept in zip(reqs, keep, strict=True):
            tenant, index = _split_id(r.request_id)
            if kept:
                out.append(r if k == 0 else replace(r, request_id=f"{tenant}:{offsets.get(tenant, 0) + index}"))
            next_index[tenant] = max(next_index.get(tenant, 0), offsets.get(tenant, 0) + index + 1)
    out.sort(key=lambda r: (r.arrival_s, r.tenant_id, _split_id(r.request_id)[1]))
    return out


def scale_trace(requests: Sequence[RequestSpec], *, offset_s: float, rate_scale: float, horizon_s: float,
                load: float, scaling: LoadScaling, rng: np.random.Generator,
                arrange: Callable[[list[RequestSpec]], list[RequestSpec]]) -> list[RequestSpec]:
    """One trace file's requests at ``load`` on the replay's clock (:func:`~service.replay.binding.retime`:
    first request at ``offset_s``, rate times ``rate_scale``, those before ``horizon_s``), passed
    through ``arrange`` (e.g. dealt to tenants: it must return ids ``TENANT:INDEX``). ``compress``
    speeds the file's clock up ``load`` times; ``thin`` superposes thinned copies, copy ``k >= 1``
    from the file rotated to another window (:func:`superpose`)."""
    if parse_load_scaling(scaling) == "compress":
        return arrange(retime(requests, offset_s=offset_s, rate_scale=rate_scale * load, horizon_s=horizon_s))

    def sample(_copy: int, _content: np.random.Generator, rotation: np.random.Generator | None) -> list[RequestSpec]:
        source = requests if rotation is None else rotate_requests(requests, rotation, horizon_s * rate_scale)
        return arrange(retime(source, offset_s=offset_s, rate_scale=rate_scale, horizon_s=horizon_s))
    return superpose(sample, load, rng)


def rotation_s(rng: np.random.Generator, span_s: float, window_s: float) -> float:
    """How far (file seconds) to rotate a file of ``span_s`` seconds so that a copy's window of
    ``window_s`` file seconds comes from another part of it: a random whole number of windows
    ``1 .. W-1`` where the file holds ``W >= 2`` windows, else a uniform shift in ``[0, span_s)``."""
    whole = int(span_s // window_s) if window_s > 0 else 0
    if whole >= 2:
        return float(rng.integers(1, whole)) * window_s
    return float(rng.uniform(0.0, span_s)) if span_s > 0 else 0.0


def rotate_times(times_s: np.ndarray, rng: np.random.Generator, window_s: float) -> np.ndarray:
    """File arrival times (sorted, any origin) rotated as :func:`rotation_s` says, origin at 0:
    ``(t - first - shift) mod span``, sorted; ``span`` is the file's length plus one mean gap, so
    that its last request does not land on its first."""
    if len(times_s) < 2:
        return np.asarray(times_s, dtype=float) - (times_s[0] if len(times_s) else 0.0)
    rel = np.asarray(times_s, dtype=float) - float(times_s[0])
    span = float(rel[-1]) * len(rel) / (len(rel) - 1)
    return np.sort(np.mod(rel - rotation_s(rng, span, window_s), span))


def rotate_requests(requests: Sequence[RequestSpec], rng: np.random.Generator,
                    window_s: float) -> list[RequestSpec]:
    """A file's requests rotated as :func:`rotate_times` (arrival order after the rotation; equal
    times keep the file's order)."""
    if len(requests) < 2:
        return list(requests)
    rel = np.array([r.arrival_s for r in requests], dtype=float) - requests[0].arrival_s
    span = float(rel[-1]) * len(rel) / (len(rel) - 1)
    moved = np.mod(rel - rotation_s(rng, span, window_s), span)
    order = np.argsort(moved, kind="stable")
    return [replace(requests[i], arrival_s=float(moved[i])) for i in order]


def _stream(seed: int, copy: int, use: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, copy, use]))


def _split_id(request_id: str) -> tuple[str, int]:
    tenant, sep, index = request_id.rpartition(":")
    if not sep or not index.isdigit():
        raise ValueError(f"request id {request_id!r} is not TENANT:INDEX")
    return tenant, int(index)

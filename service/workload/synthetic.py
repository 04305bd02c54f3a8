"""Synthetic workloads: parametric tenants, and tenants sampled from ServeGen client statistics.

Pure: every random draw comes from the injected ``numpy.random.Generator``, in a fixed order,
so the same seed and arguments give an identical ``Workload``. No wall clock, no I/O.

Arrivals are renewal processes in *operational time* (cumulative expected arrivals): inside a
window of rate ``r`` the gaps are drawn from a mean-1 law of the window's shape and divided by
``r``. So each window's expected count is ``r * length``, idle windows get no arrivals, the gap
CV inside a window is the law's CV, and a gap spanning windows carries over instead of
restarting the process at every boundary. The first arrival is drawn from the equilibrium
residual gap, so a trace does not start with a burst or a hole.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec, Workload
from service.workload.client import OUTPUT_FIELD, ClientStats, GapLaw, Pmf

ArrivalProcess = Literal["poisson", "gamma"]
LengthSource = Literal["window", "pooled"]

_FloatArray = np.ndarray  # float64 arrays; numpy's generic alias adds nothing here
_IntArray = np.ndarray


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """One synthetic tenant.

    Arrivals: ``"poisson"`` at ``rate_rps``, or ``"gamma"`` renewal with inter-arrival
    coefficient of variation ``burstiness_cv`` (1 is Poisson, > 1 bursty, < 1 regular).
    Lengths: lognormal with the given median (tokens) and sigma (of the log), rounded and
    clamped to ``[1, *_max_tokens]``. ``exact_count``: the tenant offers exactly
    ``round(rate_rps * (duration - start_s))`` requests, the drawn gaps scaled to span its part
    of the run (the burst pattern kept; how much it offers not left to the draw, for loads sized
    against a measured capacity).
    """

    tenant_id: str
    model: str
    rate_rps: float
    sla_class: str = "standard"
    arrival: ArrivalProcess = "poisson"
    burstiness_cv: float = 1.0
    prompt_median_tokens: float = 512.0
    prompt_sigma: float = 1.0
    prompt_max_tokens: int = 4096
    output_median_tokens: float = 128.0
    output_sigma: float = 1.0
    output_max_tokens: int = 1024
    start_s: float = 0.0  # no arrivals before this (an idle tenant that wakes up)
    exact_count: bool = False

    @property
    def prompt_mean_tokens(self) -> float:
        return lognormal_mean_tokens(self.prompt_median_tokens, self.prompt_sigma, self.prompt_max_tokens)

    @property
    def output_mean_tokens(self) -> float:
        return lognormal_mean_tokens(self.output_median_tokens, self.output_sigma, self.output_max_tokens)

    def __post_init__(self) -> None:
        where = f"tenant load {self.tenant_id}"
        if not (0.0 <= self.rate_rps < math.inf):
            raise InvalidInputError(f"{where}: rate_rps must be finite and >= 0, got {self.rate_rps}")
        if self.arrival not in ("poisson", "gamma"):
            raise InvalidInputError(f"{where}: arrival must be 'poisson' or 'gamma', got {self.arrival!r}")
        if not (0.0 <= self.start_s < math.inf):
            raise InvalidInputError(f"{where}: start_s must be finite and >= 0, got {self.start_s}")
        if not (0.0 < self.burstiness_cv < math.inf):
            raise InvalidInputError(f"{where}: burstiness_cv must be finite and > 0, got {self.burstiness_cv}")
        for label, median, sigma, cap in (("prompt", self.prompt_median_tokens, self.prompt_sigma, self.prompt_max_tokens),
                                          ("output", self.output_median_tokens, self.output_sigma, self.output_max_tokens)):
            if not (median >= 1.0 and 0.0 <= sigma < math.inf and cap >= 1):
                raise InvalidInputError(f"{where}: {label} needs median >= 1, finite sigma >= 0 and max >= 1 "
                                        f"(got {median}, {sigma}, {cap})")


@dataclass(frozen=True, slots=True)
class _Segment:
    """``[start_s, end_s)`` at ``rate_rps`` with mean-1 gaps of ``law`` and ``shape``."""

    start_s: float
    end_s: float
    rate_rps: float
    law: GapLaw
    shape: float


def _unit_gaps(rng: np.random.Generator, law: GapLaw, shape: float, n: int) -> _FloatArray:
    """``n`` i.i.d. gaps with mean 1 and the law's shape (gamma CV = 1/sqrt(shape))."""
    if law == "gamma":
        return rng.gamma(shape, 1.0 / shape, n)
    return rng.weibull(shape, n) / math.gamma(1.0 + 1.0 / shape)


def _equilibrium_residual(rng: np.random.Generator, law: GapLaw, shape: float) -> float:
    """Distance from a random instant to the next arrival of a stationary mean-1 renewal process:
    a length-biased gap times U(0, 1)."""
    if law == "gamma":
        biased = rng.gamma(shape + 1.0, 1.0 / shape)
    else:
        # X ~ Weibull(c) has X**c ~ Exp(1); length-biasing that gives Gamma(1 + 1/c)
        biased = rng.gamma(1.0 + 1.0 / shape) ** (1.0 / shape) / math.gamma(1.0 + 1.0 / shape)
    return float(biased * rng.random())


def _renewal_arrivals_s(rng: np.random.Generator, segments: Sequence[_Segment]) -> _FloatArray:
    """Arrival times over contiguous, ordered segments (see the module docstring)."""
    chunks: list[_FloatArray] = []
    pos: float | None = None  # operational distance from the current segment start to the next arrival
    for seg in segments:
        length = seg.rate_rps * (seg.end_s - seg.start_s)
        if length <= 0.0:
            continue
        if pos is None:
            pos = _equilibrium_residual(rng, seg.law, seg.shape)
        positions: list[_FloatArray] = []
        while pos < length:
            n = int((length - pos) * 1.1) + 16
            gaps = _unit_gaps(rng, seg.law, seg.shape, n)
            points = pos + np.concatenate(([0.0], np.cumsum(gaps[:-1])))
            inside = int(np.searchsorted(points, length, side="left"))
            positions.append(points[:inside])
            pos = float(points[inside]) if inside < n else float(points[-1] + gaps[-1])
        pos -= length
        if positions:
            chunks.append(seg.start_s + np.concatenate(positions) / seg.rate_rps)
    return np.concatenate(chunks) if chunks else np.empty(0)


def lognormal_mean_tokens(median: float, sigma: float, cap: float) -> float:
    """The mean of a lognormal of ``median`` and log-sigma ``sigma`` clamped at ``cap`` (the
    lengths a :class:`TenantLoad` draws, rounding aside): ``E[min(X, cap)]``."""
    if sigma == 0.0:
        return min(median, cap)
    mu, z = math.log(median), math.log(cap)

    def phi(x: float) -> float:
        return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))

    return math.exp(mu + sigma**2 / 2) * phi((z - mu - sigma**2) / sigma) + cap * (1.0 - phi((z - mu) / sigma))


def _exact_count_arrivals_s(rng: np.random.Generator, start_s: float, end_s: float, rate_rps: float,
                            shape: float) -> _FloatArray:
    """``round(rate * span)`` arrivals over ``[start_s, end_s)``: mean-1 gamma gaps of ``shape``,
    their sum scaled to the span (one gap more closes it, so the last arrival is not at its end)."""
    n = round(rate_rps * max(0.0, end_s - start_s))
    if n == 0:
        return np.empty(0)
    ends = np.cumsum(_unit_gaps(rng, "gamma", shape, n + 1))
    arrivals: _FloatArray = start_s + ends[:n] / ends[n] * (end_s - start_s)
    return arrivals


def _lognormal_tokens(rng: np.random.Generator, median: float, sigma: float, cap: int, n: int) -> _IntArray:
    return np.clip(np.rint(median * np.exp(sigma * rng.standard_normal(n))), 1, cap).astype(np.int64)


def _assemble(name: str, horizon_s: float, per_tenant: list[tuple[str, str, str, _FloatArray, _IntArray, _IntArray]],
              ) -> Workload:
    """Merge per-tenant arrays into one workload; ties order by tenant position, then sequence."""
    if not per_tenant:
        return Workload(name, [], horizon_s)
    arrivals = np.concatenate([t[3] for t in per_tenant])
    tenant_index = np.concatenate([np.full(len(t[3]), i) for i, t in enumerate(per_tenant)])
    seq = np.concatenate([np.arange(len(t[3])) for t in per_tenant])
    prompts = np.concatenate([t[4] for t in per_tenant])
    outputs = np.concatenate([t[5] for t in per_tenant])
    order = np.lexsort((seq, tenant_index, arrivals))
    requests = []
    for i in order.tolist():
        tenant_id, model, sla_class = per_tenant[tenant_index[i]][:3]
        requests.append(RequestSpec(f"{tenant_id}:{seq[i]}", tenant_id, model, float(arrivals[i]),
                                    int(prompts[i]), int(outputs[i]), sla_class))
    return Workload(name, requests, horizon_s)


def _check_duration(duration_s: float) -> None:
    if not (0.0 < duration_s < math.inf):
        raise InvalidInputError(f"duration_s must be finite and > 0, got {duration_s}")


def _check_unique(tenant_ids: Sequence[str]) -> None:
    if len(set(tenant_ids)) != len(tenant_ids):
        raise InvalidInputError(f"tenant ids must be unique, got {list(tenant_ids)}")


def synthetic_workload(rng: np.random.Generator, *, tenants: Sequence[TenantLoad], duration_s: float,
                       name: str = "synthetic") -> Workload:
    """Requests of every tenant arriving in ``[0, duration_s)``; ``horizon_s = duration_s``.

    Request ids are ``"{tenant_id}:{k}"`` with ``k`` the tenant's 0-based arrival order.
    """
    _check_duration(duration_s)
    _check_unique([t.tenant_id for t in tenants])
    per_tenant = []
    for t in tenants:
        shape = 1.0 if t.arrival == "poisson" else 1.0 / t.burstiness_cv**2  # gamma with shape 1 is Poisson
        start = min(t.start_s, duration_s)
        arrivals = (_exact_count_arrivals_s(rng, start, duration_s, t.rate_rps, shape) if t.exact_count else
                    _renewal_arrivals_s(rng, [_Segment(start, duration_s, t.rate_rps, "gamma", shape)]))
        n = len(arrivals)
        prompts = _lognormal_tokens(rng, t.prompt_median_tokens, t.prompt_sigma, t.prompt_max_tokens, n)
        outputs = _lognormal_tokens(rng, t.output_median_tokens, t.output_sigma, t.output_max_tokens, n)
        per_tenant.append((t.tenant_id, t.model, t.sla_class, arrivals, prompts, outputs))
    return _assemble(name, duration_s, per_tenant)


def _client_segments(client: ClientStats, start_s: float, duration_s: float, rate_scale: float) -> list[_Segment]:
    """The client's rate windows covering ``[start_s, start_s + duration_s)``, in trace time (0 = start_s)."""
    segments = []
    end_s = start_s + duration_s
    num_windows = len(client.rate_windows)
    for k in range(math.floor(start_s / client.window_s), math.ceil(end_s / client.window_s)):
        window = client.rate_windows[k % num_windows]  # the day repeats
        lo, hi = max(k * client.window_s, start_s), min((k + 1) * client.window_s, end_s)
        if window.law is None or hi <= lo:
            continue
        segments.append(_Segment(lo - start_s, hi - start_s, window.rate_rps * rate_scale, window.law, window.shape))
    return segments


class _PmfSampler:
    """Inverse-CDF sampling from ``Pmf``s, with each PMF's arrays built once."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._tables: dict[int, tuple[Pmf, _FloatArray, _FloatArray]] = {}

    def sample(self, pmf: Pmf, n: int) -> _FloatArray:
        table = self._tables.get(id(pmf))
        if table is None:
            # keep pmf in the entry so its id() cannot be reused by another object
            table = (pmf, np.asarray(pmf.values), np.cumsum(pmf.probs))
            self._tables[id(pmf)] = table
        _, values, cdf = table
        idx = np.searchsorted(cdf, self._rng.random(n) * cdf[-1], side="right")
        picked: _FloatArray = values[np.minimum(idx, len(values) - 1)]
        return picked


def _client_lengths(rng: np.random.Generator, sampler: _PmfSampler, client: ClientStats, times_s: _FloatArray,
                    length_source: LengthSource) -> tuple[_FloatArray, _FloatArray]:
    """Raw (unclamped) prompt and output lengths for arrivals at absolute day times ``times_s``."""
    windows = client.length_windows
    usable = [j for j, w in enumerate(windows) if not w.is_empty]
    # pooled mix: each non-empty length window weighted by the requests it expects in a day
    weights = np.zeros(len(windows))
    for w in client.rate_windows:
        j = min(int(w.start_s // client.length_window_s), len(windows) - 1)
        weights[j] += w.rate_rps
    weights = weights[usable]
    weights = weights / weights.sum() if weights.sum() > 0 else np.full(len(usable), 1.0 / len(usable))
    n = len(times_s)
    if length_source == "window":
        window_of = np.minimum(((times_s % client.day_s) // client.length_window_s).astype(np.int64), len(windows) - 1)
        empty = np.array([windows[j].is_empty for j in window_of.tolist()], dtype=bool)
        if empty.any():  # arrivals where the stats have no lengths (not in the public data): use the pooled mix
            window_of[empty] = np.asarray(usable)[rng.choice(len(usable), size=int(empty.sum()), p=weights)]
    else:
        window_of = np.asarray(usable)[rng.choice(len(usable), size=n, p=weights)]
    prompts = np.zeros(n)
    outputs = np.zeros(n)
    for j in usable:
        mask = window_of == j
        count = int(mask.sum())
        if count == 0:
            continue
        pmfs = windows[j].pmfs
        prompts[mask] = sum((sampler.sample(pmfs[f], count) for f in client.input_fields), np.zeros(count))
        outputs[mask] = sampler.sample(pmfs[OUTPUT_FIELD], count)
    return prompts, outputs


def servegen_workload(rng: np.random.Generator, clients: Sequence[ClientStats], *, tenant_ids: Sequence[str],
                      models: Sequence[str] | str, duration_s: float, start_s: float = 0.0,
                      sla_classes: Sequence[str] | str = "standard", length_source: LengthSource = "window",
                      rate_scale: float = 1.0, max_prompt_tokens: int | None = None,
                      max_output_tokens: int | None = None, name: str = "servegen") -> Workload:
    """One tenant per ServeGen client (``clients[i]`` becomes ``tenant_ids[i]`` serving ``models[i]``).

    Covers ``[start_s, start_s + duration_s)`` of the clients' day (wrapping past its end) and
    reports arrivals relative to ``start_s``; ``horizon_s = duration_s``. Each rate window's
    rate is multiplied by ``rate_scale`` and keeps its fitted gap law's shape. Lengths come from
    the PMFs of the length window the arrival falls in (``"window"``), or from the client's
    whole-day mix (``"pooled"``). The prompt is the sum of independent draws of every input
    field (text + image + ... for multimodal clients). Lengths are clamped to ``[1, max]`` (a
    request yields at least one token; ``None``: no upper clamp). ``models`` and ``sla_classes``
    may be one string for all.
    """
    _check_duration(duration_s)
    if not (0.0 <= start_s < math.inf) or not (0.0 < rate_scale < math.inf):
        raise InvalidInputError(f"start_s must be finite and >= 0 and rate_scale finite and > 0, "
                                f"got {start_s} and {rate_scale}")
    if length_source not in ("window", "pooled"):
        raise InvalidInputError(f"length_source must be 'window' or 'pooled', got {length_source!r}")
    model_list = [models] * len(clients) if isinstance(models, str) else list(models)
    sla_list = [sla_classes] * len(clients) if isinstance(sla_classes, str) else list(sla_classes)
    if not (len(tenant_ids) == len(model_list) == len(sla_list) == len(clients)):
        raise InvalidInputError(f"need one tenant id, model and SLA class per client: {len(clients)} clients, "
                                f"{len(tenant_ids)} tenant ids, {len(model_list)} models, {len(sla_list)} SLA classes")
    _check_unique(tenant_ids)
    sampler = _PmfSampler(rng)
    per_tenant = []
    for client, tenant_id, model, sla_class in zip(clients, tenant_ids, model_list, sla_list, strict=True):
        arrivals = _renewal_arrivals_s(rng, _client_segments(client, start_s, duration_s, rate_scale))
        prompts, outputs = _client_lengths(rng, sampler, client, arrivals + start_s, length_source)
        prompt_tokens = np.clip(np.rint(prompts), 1, max_prompt_tokens).astype(np.int64)
        output_tokens = np.clip(np.rint(outputs), 1, max_output_tokens).astype(np.int64)
        per_tenant.append((tenant_id, model, sla_class, arrivals, prompt_tokens, output_tokens))
    return _assemble(name, duration_s, per_tenant)

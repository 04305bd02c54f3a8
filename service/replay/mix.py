"""Tenant mixes: who sends what, when — a file users can write, turned into a workload.

A mix is YAML (or JSON)::

    name: four-tenants
    duration_s: 600
    sla_classes:                       # optional: adds classes or overrides the built-in ones
      interactive: {ttft_s: 0.5, ttft_per_prompt_token_s: 0.0004, tbt_s: 0.1, e2e_s: 60}
    tenants:
      - tenant_id: chat
        model: llama2-13b              # a built-in model (slicesched model list)
        sla_class: interactive         # interactive | standard | batch
        priority: 2                    # for the priority and aging queue policies
        weight: 2.0                    # for weighted fair share
        arrivals: {kind: servegen, source: reason/deepseek-r1, client: 3, rate_scale: 1.0}
        lengths: {kind: trace, source: azure-conv}
      - tenant_id: coder
        model: llama2-7b
        trace: {source: azure-code, offset_s: 0, rate_scale: 1.0}   # instead of arrivals and lengths

Arrival kinds: ``poisson`` (``rate_rps``), ``gamma`` (``rate_rps``, ``cv``: burstiness),
``servegen`` (a ServeGen client's per-window rate curve and fitted gap law: ``source`` folder
under ``servegen/``, ``client`` index, ``rate_scale``, ``start_s`` into its day) and ``trace``
(the arrival times of ``azure-code``, ``azure-conv`` or ``mooncake``, divided by ``rate_scale``).
Length kinds: ``lognormal`` (``prompt_median``, ``prompt_sigma``, ``output_median``,
``output_sigma``), ``trace`` (prompt/output pairs drawn from a trace's joint distribution) and
``servegen`` (the arrival client's own length PMFs). Lengths are clamped so that prompt plus
output fits the model's context.

A tenant with ``trace`` replays a request trace file as it is: its requests are exactly the
file's, in order (arrivals and lengths together), with the file's own time origin moved to
``offset_s`` and its rate multiplied by ``rate_scale``; ``source`` is a named trace or a path
relative to the data folder (see :mod:`service.replay.binding`). Such requests are then fitted
to the model's context by the replay's ``--context`` mode (:mod:`service.replay.context`).

An SLA class (:class:`~service.sim.sla.SlaClass`) has ``ttft_s`` (base), ``ttft_per_prompt_token_s``
(allowance per prompt token, default 0), ``tbt_s`` (TPOT: mean time between output tokens) and
``e2e_s`` (end-to-end deadline); a target left out is no target.

Public data is read in place from ``$SLICESCHED_DATA``, then ``../shared/data`` beside the
project (:mod:`service.data`; ``slicesched data fetch`` gets it); the built-in ``synthetic-3``
mix needs none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from service.data import resolve
from service.document import builtin_documents, load_document
from service.domain.error import InvalidInputError
from service.domain.model_config import MODEL_CONFIGS
from service.domain.request import RequestSpec, Workload
from service.replay.binding import TRACE_FILES as TRACE_FILES
from service.replay.binding import read_source, tenant_requests
from service.replay.context import ContextCounts, ContextMode, fit_context
from service.replay.loadscale import LoadScaling, parse_load_scaling, rotate_requests, rotate_times, superpose
from service.sim.sla import SLA_CLASSES, SlaClass

ARRIVAL_KINDS = ("poisson", "gamma", "servegen", "trace")
LENGTH_KINDS = ("lognormal", "trace", "servegen")


@dataclass(frozen=True)
class TenantSpec:
    tenant_id: str
    model: str
    sla_class: str = "standard"
    priority: int = 0
    weight: float = 1.0
    arrivals: dict[str, Any] = field(default_factory=lambda: {"kind": "poisson", "rate_rps": 1.0})
    lengths: dict[str, Any] = field(default_factory=lambda: {"kind": "lognormal"})
    trace: dict[str, Any] | None = None  # {source, offset_s, rate_scale}: requests replayed from a file


@dataclass(frozen=True)
class TenantMix:
    name: str
    duration_s: float
    tenants: tuple[TenantSpec, ...]
    sla_classes: dict[str, SlaClass] = field(default_factory=lambda: dict(SLA_CLASSES))  # built-ins + the mix's

    @property
    def models(self) -> set[str]:
        return {t.model for t in self.tenants}

    def tenant(self, tenant_id: str) -> TenantSpec:
        return next(t for t in self.tenants if t.tenant_id == tenant_id)

    def bind_trace(self, tenant_id: str, trace: dict[str, Any]) -> TenantMix:
        """The mix with ``tenant_id``'s requests replayed from ``trace`` ({source, offset_s, rate_scale})."""
        if all(t.tenant_id != tenant_id for t in self.tenants):
            raise InvalidInputError(f"--trace: no tenant {tenant_id!r} in mix {self.name} "
                                    f"(tenants: {', '.join(t.tenant_id for t in self.tenants)})")
        return replace(self, tenants=tuple(replace(t, trace=dict(trace)) if t.tenant_id == tenant_id else t
                                           for t in self.tenants))


def builtin_mixes() -> list[str]:
    return builtin_documents("service.replay", "mixes")


def load_mix(name_or_path: str) -> TenantMix:
    """A built-in mix by name or a YAML/JSON file; :class:`InvalidInputError` names what is wrong."""
    data, source = load_document(name_or_path, package="service.replay", folder="mixes", what="tenant mix")
    return parse_mix(data, source)


def parse_mix(data: Any, source: str = "mix") -> TenantMix:
    if not isinstance(data, dict):
        raise InvalidInputError(f"{source}: a tenant mix is a mapping with 'name', 'duration_s' and 'tenants'")
    tenants_raw = data.get("tenants")
    if not isinstance(tenants_raw, list) or not tenants_raw:
        raise InvalidInputError(f"{source}: 'tenants' must be a non-empty list")
    try:
        duration = float(data.get("duration_s", 600))
    except (TypeError, ValueError):
        raise InvalidInputError(f"{source}: duration_s must be a number") from None
    if not duration > 0:
        raise InvalidInputError(f"{source}: duration_s must be positive")
    sla_classes = {**SLA_CLASSES, **_parse_sla_classes(data.get("sla_classes"), source)}
    tenants: list[TenantSpec] = []
    for i, raw in enumerate(tenants_raw):
        where = f"{source}: tenants[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("tenant_id"), str):
            raise InvalidInputError(f"{where} needs a string 'tenant_id'")
        tid = raw["tenant_id"]
        if any(t.tenant_id == tid for t in tenants):
            raise InvalidInputError(f"{source}: duplicate tenant id {tid!r}")
        model = raw.get("model")
        if model not in MODEL_CONFIGS:
            raise InvalidInputError(f"{where} ({tid}): unknown model {model!r} (built-in: {', '.join(MODEL_CONFIGS)})")
        sla = raw.get("sla_class", "standard")
        if sla not in sla_classes:
            raise InvalidInputError(f"{where} ({tid}): unknown SLA class {sla!r} ({', '.join(sla_classes)})")
        arrivals = dict(raw.get("arrivals") or {"kind": "poisson", "rate_rps": 1.0})
        lengths = dict(raw.get("lengths") or {"kind": "lognormal"})
        if arrivals.get("kind") not in ARRIVAL_KINDS:
            raise InvalidInputError(f"{where} ({tid}): arrivals.kind must be one of {ARRIVAL_KINDS}")
        if lengths.get("kind") not in LENGTH_KINDS:
            raise InvalidInputError(f"{where} ({tid}): lengths.kind must be one of {LENGTH_KINDS}")
        if lengths["kind"] == "servegen" and arrivals["kind"] != "servegen":
            raise InvalidInputError(f"{where} ({tid}): servegen lengths need servegen arrivals (the same client)")
        for spec in (arrivals, lengths):
            if spec["kind"] == "trace" and spec.get("source") not in TRACE_FILES:
                raise InvalidInputError(f"{where} ({tid}): trace source must be one of {list(TRACE_FILES)}")
        trace = _parse_tenant_trace(raw.get("trace"), f"{where} ({tid})")
        try:
            tenants.append(TenantSpec(tid, str(model), str(sla), int(raw.get("priority", 0)),
                                      float(raw.get("weight", 1.0)), arrivals, lengths, trace))
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{where} ({tid}): {exc}") from None
        if tenants[-1].weight <= 0:
            raise InvalidInputError(f"{where} ({tid}): weight must be positive")
    return TenantMix(str(data.get("name", source)), duration, tuple(tenants), sla_classes)


_SLA_FIELDS = ("ttft_s", "ttft_per_prompt_token_s", "tbt_s", "e2e_s")


def _parse_sla_classes(raw: Any, source: str) -> dict[str, SlaClass]:
    """A mix's ``sla_classes`` mapping; a target left out (or null) is no target."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidInputError(f"{source}: sla_classes must be a mapping of class name to targets")
    out = {}
    for name, fields in raw.items():
        where = f"{source}: sla_classes.{name}"
        if not isinstance(fields, dict):
            raise InvalidInputError(f"{where} must be a mapping with some of {', '.join(_SLA_FIELDS)}")
        unknown = set(fields) - set(_SLA_FIELDS)
        if unknown:
            raise InvalidInputError(f"{where}: unknown field(s) {sorted(unknown)} (known: {', '.join(_SLA_FIELDS)})")
        values: dict[str, float] = {}
        for key, value in fields.items():
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise InvalidInputError(f"{where}.{key} must be a number >= 0, got {value!r}")
            values[key] = float(value)
        out[str(name)] = SlaClass(str(name), **values)
    return out


def _parse_tenant_trace(raw: Any, where: str) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("source"), str):
        raise InvalidInputError(f"{where}: trace must be a mapping with a string 'source' (a named trace "
                                f"{list(TRACE_FILES)} or a path relative to the data folder)")
    if Path(raw["source"]).is_absolute():
        raise InvalidInputError(f"{where}: trace source must be a named trace or a path relative to the data "
                                "folder, not an absolute path")
    unknown = set(raw) - {"source", "offset_s", "rate_scale"}
    if unknown:
        raise InvalidInputError(f"{where}: unknown trace field(s) {sorted(unknown)}")
    try:
        offset, scale = float(raw.get("offset_s", 0.0)), float(raw.get("rate_scale", 1.0))
    except (TypeError, ValueError):
        raise InvalidInputError(f"{where}: trace offset_s and rate_scale must be numbers") from None
    if not (offset >= 0 and math.isfinite(offset) and scale > 0 and math.isfinite(scale)):
        raise InvalidInputError(f"{where}: trace offset_s must be >= 0 and rate_scale positive")
    return {"source": raw["source"], "offset_s": offset, "rate_scale": scale}


# ---- building workloads ------------------------------------------------------------------------
@cache
def _trace_pairs(source: str) -> tuple[np.ndarray, np.ndarray]:
    """(arrival_s, [prompt, output]) of a public trace, read once per process."""
    reqs = read_source(source).requests
    arrivals = np.array([r.arrival_s for r in reqs])
    lengths = np.array([[r.prompt_tokens, r.output_tokens] for r in reqs], dtype=np.int64)
    return arrivals, lengths


@cache
def _servegen_clients(source: str) -> tuple[Any, ...]:
    from service.workload.readers import read_servegen_clients

    folder = resolve(f"servegen/{source}")
    if not folder.is_dir():
        raise InvalidInputError(f"ServeGen source {source!r} is not a folder: {folder}")
    return tuple(read_servegen_clients(folder))


def forget_read_data() -> None:
    """Drop every data file this process has read and kept (traces, ServeGen clients), so that
    the next run reads them afresh: a rerun in a long-lived process must see a changed file."""
    read_source.cache_clear()
    _trace_pairs.cache_clear()
    _servegen_clients.cache_clear()


def _arrivals(rng: np.random.Generator, t: TenantSpec, duration_s: float, load_scale: float,
              rotation: np.random.Generator | None = None) -> tuple[np.ndarray, Any]:
    a = t.arrivals
    kind = a["kind"]
    if kind in ("poisson", "gamma"):
        rate = float(a.get("rate_rps", 1.0)) * load_scale
        if not rate > 0:
            raise InvalidInputError(f"{t.tenant_id}: rate_rps must be positive")
        cv = float(a.get("cv", 1.0)) if kind == "gamma" else 1.0
        shape = 1.0 / (cv * cv)
        n = int(rate * duration_s * 1.5 + 50)
        gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n)
        times = np.cumsum(gaps)
        return times[times < duration_s], None
    if kind == "trace":
        arrivals, _ = _trace_pairs(a["source"])
        scale = float(a.get("rate_scale", 1.0)) * load_scale
        file_s = arrivals - arrivals[0] if rotation is None else rotate_times(arrivals, rotation, duration_s * scale)
        times = file_s / scale
        return times[times < duration_s], None
    clients = _servegen_clients(a["source"])
    idx = int(a.get("client", 0))
    if not 0 <= idx < len(clients):
        raise InvalidInputError(f"{t.tenant_id}: ServeGen client {idx} out of range (0..{len(clients) - 1})")
    from service.workload.synthetic import servegen_workload

    w = servegen_workload(rng, [clients[idx]], tenant_ids=[t.tenant_id], models=t.model, duration_s=duration_s,
                          start_s=float(a.get("start_s", 0.0)),
                          rate_scale=float(a.get("rate_scale", 1.0)) * load_scale)
    return np.array([r.arrival_s for r in w.requests]), w


def _lengths(rng: np.random.Generator, t: TenantSpec, n: int, servegen: Any) -> np.ndarray:
    spec = t.lengths
    kind = spec["kind"]
    if kind == "servegen":
        return np.array([[r.prompt_tokens, r.output_tokens] for r in servegen.requests], dtype=np.int64)
    if kind == "trace":
        _, pairs = _trace_pairs(spec["source"])
        return pairs[rng.integers(0, len(pairs), size=n)]
    pm, ps = float(spec.get("prompt_median", 512)), float(spec.get("prompt_sigma", 0.8))
    om, osg = float(spec.get("output_median", 128)), float(spec.get("output_sigma", 0.8))
    prompts = np.rint(pm * np.exp(ps * rng.standard_normal(n)))
    outputs = np.rint(om * np.exp(osg * rng.standard_normal(n)))
    return np.stack([np.maximum(prompts, 1), np.maximum(outputs, 1)], axis=1).astype(np.int64)


def build_workload(mix: TenantMix, rng: np.random.Generator, *, duration_s: float | None = None,
                   load_scale: float = 1.0) -> Workload:
    """Sample the mix's requests; ``load_scale`` multiplies every tenant's arrival rate. Trace
    tenants' requests are clamped to their model's context (see :func:`sample_workload`)."""
    return sample_workload(mix, rng, duration_s=duration_s, load_scale=load_scale)[0]


def sample_workload(mix: TenantMix, rng: np.random.Generator, *, duration_s: float | None = None,
                    load_scale: float = 1.0, context: ContextMode = "clamp",
                    skip_bad: bool = False, scaling: LoadScaling = "compress") -> tuple[Workload, ContextCounts]:
    """Sample the mix's requests and fit them to their models' context.

    Generated lengths are drawn to fit (output at most a quarter of the context); a tenant with a
    ``trace`` gets its file's requests, fitted by ``context`` (clamped or rejected, counted).
    ``skip_bad`` skips malformed lines of trace files. ``scaling`` says how ``load_scale`` is
    applied (:mod:`service.replay.loadscale`): ``compress`` multiplies every rate (a trace's
    clock sped up), ``thin`` thins and superposes copies of the load-1 workload.
    """
    if not load_scale > 0:
        raise InvalidInputError("load_scale must be positive")
    horizon = duration_s or mix.duration_s
    if parse_load_scaling(scaling) == "thin":
        requests = superpose(lambda _k, g, rot: _sample_requests(mix, g, horizon, 1.0, skip_bad, rot), load_scale, rng)
    else:
        requests = _sample_requests(mix, rng, horizon, load_scale, skip_bad, None)
    fitted, counts = fit_context(requests, context)
    return Workload(mix.name, fitted, horizon_s=horizon), counts


def _sample_requests(mix: TenantMix, rng: np.random.Generator, horizon: float, load_scale: float, skip_bad: bool,
                     rotation: np.random.Generator | None) -> list[RequestSpec]:
    """The mix's requests at ``load_scale`` before context fitting, sorted; with ``rotation``,
    every trace-timed tenant's file is first rotated to another window
    (:func:`~service.replay.loadscale.rotate_times`)."""
    requests: list[RequestSpec] = []
    for t in mix.tenants:
        if t.trace is not None:
            scale = t.trace["rate_scale"] * load_scale
            file_reqs = read_source(t.trace["source"], skip_bad).requests
            if rotation is not None:
                file_reqs = rotate_requests(file_reqs, rotation, horizon * scale)
            requests += tenant_requests(file_reqs, t, offset_s=t.trace["offset_s"], rate_scale=scale,
                                        horizon_s=horizon)
            continue
        times, servegen = _arrivals(rng, t, horizon, load_scale, rotation)
        lengths = _lengths(rng, t, len(times), servegen)
        max_ctx = MODEL_CONFIGS[t.model].max_seq_len
        for i, (at, (prompt, output)) in enumerate(zip(times, lengths, strict=True)):
            out = int(min(max(output, 1), max_ctx // 4))
            pr = int(min(max(prompt, 1), max_ctx - out))
            requests.append(RequestSpec(f"{t.tenant_id}:{i}", t.tenant_id, t.model, float(at), pr, out, t.sla_class))
    # ties by tenant, then in the tenant's own order (a trace's equal timestamps keep the file's order)
    requests.sort(key=lambda r: (r.arrival_s, r.tenant_id, int(r.request_id.rpartition(":")[2])))
    return requests

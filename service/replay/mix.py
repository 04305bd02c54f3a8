"""Tenant mixes: who sends what, when — a file users can write, turned into a workload.

A mix is YAML (or JSON)::

    name: four-tenants
    duration_s: 600
    tenants:
      - tenant_id: chat
        model: llama2-13b              # a built-in model (slicesched model list)
        sla_class: interactive         # interactive | standard | batch
        priority: 2                    # for the priority and aging queue policies
        weight: 2.0                    # for weighted fair share
        arrivals: {kind: servegen, source: reason/deepseek-r1, client: 3, rate_scale: 1.0}
        lengths: {kind: trace, source: azure-conv}

Arrival kinds: ``poisson`` (``rate_rps``), ``gamma`` (``rate_rps``, ``cv``: burstiness),
``servegen`` (a ServeGen client's per-window rate curve and fitted gap law: ``source`` folder
under ``servegen/``, ``client`` index, ``rate_scale``, ``start_s`` into its day) and ``trace``
(the arrival times of ``azure-code``, ``azure-conv`` or ``mooncake``, divided by ``rate_scale``).
Length kinds: ``lognormal`` (``prompt_median``, ``prompt_sigma``, ``output_median``,
``output_sigma``), ``trace`` (prompt/output pairs drawn from a trace's joint distribution) and
``servegen`` (the arrival client's own length PMFs). Lengths are clamped so that prompt plus
output fits the model's context.

Public data is read in place from ``$SLICESCHED_DATA`` (default ``../shared/data`` beside the
project); the built-in ``synthetic-3`` mix needs none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from service.document import builtin_documents, load_document
from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec, Workload
from service.models.family import MODEL_CONFIGS
from service.sim.sla import SLA_CLASSES

TRACE_FILES = {
    "azure-code": "azure-llm-2023/AzureLLMInferenceTrace_code.csv",
    "azure-conv": "azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
    "mooncake": "mooncake-synthetic/synthetic_trace.jsonl",
}
ARRIVAL_KINDS = ("poisson", "gamma", "servegen", "trace")
LENGTH_KINDS = ("lognormal", "trace", "servegen")


def data_dir() -> Path:
    root = Path(__file__).resolve().parents[2]
    return Path(os.environ.get("SLICESCHED_DATA", root.parent / "shared" / "data"))


@dataclass(frozen=True)
class TenantSpec:
    tenant_id: str
    model: str
    sla_class: str = "standard"
    priority: int = 0
    weight: float = 1.0
    arrivals: dict[str, Any] = field(default_factory=lambda: {"kind": "poisson", "rate_rps": 1.0})
    lengths: dict[str, Any] = field(default_factory=lambda: {"kind": "lognormal"})


@dataclass(frozen=True)
class TenantMix:
    name: str
    duration_s: float
    tenants: tuple[TenantSpec, ...]

    @property
    def models(self) -> set[str]:
        return {t.model for t in self.tenants}

    def tenant(self, tenant_id: str) -> TenantSpec:
        return next(t for t in self.tenants if t.tenant_id == tenant_id)


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
        if sla not in SLA_CLASSES:
            raise InvalidInputError(f"{where} ({tid}): unknown SLA class {sla!r} ({', '.join(SLA_CLASSES)})")
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
        try:
            tenants.append(TenantSpec(tid, str(model), str(sla), int(raw.get("priority", 0)),
                                      float(raw.get("weight", 1.0)), arrivals, lengths))
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{where} ({tid}): {exc}") from None
        if tenants[-1].weight <= 0:
            raise InvalidInputError(f"{where} ({tid}): weight must be positive")
    return TenantMix(str(data.get("name", source)), duration, tuple(tenants))


# ---- building workloads ------------------------------------------------------------------------
@cache
def _trace_pairs(source: str) -> tuple[np.ndarray, np.ndarray]:
    """(arrival_s, [prompt, output]) of a public trace, read once per process."""
    from service.workload.readers import read_azure, read_mooncake

    path = data_dir() / TRACE_FILES[source]
    if not path.is_file():
        raise InvalidInputError(f"trace {source!r} not found at {path} (set SLICESCHED_DATA to the public data folder)")
    reader = read_mooncake if source == "mooncake" else read_azure
    reqs = reader(path, tenant_id="t", model="llama2-7b").requests
    arrivals = np.array([r.arrival_s for r in reqs])
    lengths = np.array([[r.prompt_tokens, r.output_tokens] for r in reqs], dtype=np.int64)
    return arrivals, lengths


@cache
def _servegen_clients(source: str) -> tuple[Any, ...]:
    from service.workload.readers import read_servegen_clients

    folder = data_dir() / "servegen" / source
    if not folder.is_dir():
        raise InvalidInputError(f"ServeGen source {source!r} not found at {folder}")
    return tuple(read_servegen_clients(folder))


def _arrivals(rng: np.random.Generator, t: TenantSpec, duration_s: float, load_scale: float) -> tuple[np.ndarray, Any]:
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
        times = (arrivals - arrivals[0]) / scale
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
    """Sample the mix's requests; ``load_scale`` multiplies every tenant's arrival rate."""
    if not load_scale > 0:
        raise InvalidInputError("load_scale must be positive")
    horizon = duration_s or mix.duration_s
    requests: list[RequestSpec] = []
    for t in mix.tenants:
        times, servegen = _arrivals(rng, t, horizon, load_scale)
        lengths = _lengths(rng, t, len(times), servegen)
        max_ctx = MODEL_CONFIGS[t.model].max_seq_len
        for i, (at, (prompt, output)) in enumerate(zip(times, lengths, strict=True)):
            out = int(min(max(output, 1), max_ctx // 4))
            pr = int(min(max(prompt, 1), max_ctx - out))
            requests.append(RequestSpec(f"{t.tenant_id}:{i}", t.tenant_id, t.model, float(at), pr, out, t.sla_class))
    requests.sort(key=lambda r: (r.arrival_s, r.request_id))
    return Workload(mix.name, requests, horizon_s=horizon)

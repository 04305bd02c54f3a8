"""The live service's metrics read from its state at scrape time (a prometheus_client collector).

Per model (labels ``model_name``, ``tenant``; every registered model has a series, zero when idle):

- ``num_requests_waiting``: requests queued at the service (not yet leased);
- ``num_requests_running``: requests leased to an executor (in its batch, or about to join it);
- ``kv_cache_usage_perc`` (0..1): the KV the service reserves for the model's leases over the KV
  it set aside on devices for the model's replicas. A lease reserves KV for its whole sequence,
  ``prompt + max_tokens`` tokens (the most it can hold); placing a replica reserves
  ``kv_reserve_tokens`` tokens of KV on its devices besides the weights (what
  :meth:`~service.live.registry.Registry.free_bytes` counts), both times the model's KV bytes
  per token. Capped at 1 (leases past the reserve still run: the executor's pool is
  ``max_batch`` full contexts);
- ``slices_planned``: slices of the model's placed replicas (a replica's layers are cut over
  its devices, one slice of each iteration per device, :meth:`~service.live.registry.Registry.stages`);
- ``slices_running``: slices of its leases running now (a lease runs every slice of its replica).

Cluster-wide: device utilisation (leases over KV slots), leases by outcome (one per Slice end
state in the GMG), rejected completions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from service.domain.request import RequestStatus
from service.sim.iteration import kv_bytes_per_token

if TYPE_CHECKING:
    from service.live.state import LiveState

LEASE_EVENTS = ("granted", "expired", "completed", "failed", "cancelled")

_Key = tuple[str, str]  # (model_name, tenant)


class StateCollector(Collector):
    def __init__(self, state: LiveState, prefix: str) -> None:
        self.state = state
        self.prefix = prefix

    def collect(self) -> Iterator[Metric]:
        s, p = self.state, self.prefix
        keys = {uid: (m.model_id, m.tenant_id) for uid, m in s.models.items()}
        waiting: dict[_Key, float] = dict.fromkeys(keys.values(), 0)
        running = dict(waiting)
        for req in s.requests.values():
            if req.status == RequestStatus.QUEUED:
                waiting[(req.model_id, req.tenant_id)] = waiting.get((req.model_id, req.tenant_id), 0) + 1
            elif req.status == RequestStatus.LEASED:
                running[(req.model_id, req.tenant_id)] = running.get((req.model_id, req.tenant_id), 0) + 1
        yield _gauge(f"{p}num_requests_waiting", "Requests queued at the service, not yet leased", waiting)
        yield _gauge(f"{p}num_requests_running", "Requests leased to an executor", running)
        reserved_bytes: dict[_Key, int] = {}
        leased_bytes: dict[_Key, int] = {}
        planned: dict[_Key, float] = dict.fromkeys(keys.values(), 0)
        slices_running = dict(planned)
        for r in s.replicas.values():
            model = s.models.get(r.model_uid)
            if model is None:
                continue
            key = keys[r.model_uid]
            reserved_bytes[key] = reserved_bytes.get(key, 0) + s.kv_reserve_bytes(model)
            if not r.draining:
                planned[key] += len(r.device_ids)
        for lease in s.leases.values():
            req = s.requests[lease.request_id]
            model = s.models.get(req.model_uid)
            replica = s.replicas.get(lease.replica_id)
            if model is None:
                continue
            key = keys[req.model_uid]
            leased_bytes[key] = (leased_bytes.get(key, 0)
                                 + (len(req.prompt) + req.max_tokens) * kv_bytes_per_token(model.config))
            slices_running[key] += len(replica.device_ids) if replica is not None else 0
        usage = {key: min(1.0, leased_bytes.get(key, 0) / reserved_bytes[key]) if reserved_bytes.get(key) else 0.0
                 for key in keys.values()}
        yield _gauge(f"{p}kv_cache_usage_perc", "KV reserved by the model's leases over the KV reserved on devices "
                     "for its replicas (0..1; 1 is 100 percent)", usage)
        yield _gauge(f"{p}slices_planned", "Slices of the model's placed replicas (one per device of each; "
                     "draining replicas excluded)", planned)
        yield _gauge(f"{p}slices_running", "Slices of the model's leases running now", slices_running)
        util = GaugeMetricFamily(f"{p}device_utilisation", "Leases running on a device over its KV slots (0..1)",
                                 labels=["device"])
        for device_id in sorted(s.devices):
            slots = sum(r.max_batch for r in s.replicas.values() if device_id in r.device_ids)
            held = sum(len(r.leases) for r in s.replicas.values() if device_id in r.device_ids)
            util.add_metric([device_id], held / slots if slots else 0.0)
        yield util
        leases = CounterMetricFamily(f"{p}leases", "Leases by outcome (granted; then one end each: completed, "
                                     "expired, failed, cancelled)", labels=["event"])
        for event in LEASE_EVENTS:
            leases.add_metric([event], s.counters[f"leases_{event}"])
        yield leases
        yield CounterMetricFamily(f"{p}completions_rejected", "Completions of leases that were not live",
                                  value=s.counters["completions_rejected"])


def _gauge(name: str, doc: str, values: dict[_Key, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["model_name", "tenant"])
    for (model_name, tenant), value in sorted(values.items()):
        family.add_metric([model_name, tenant], value)
    return family

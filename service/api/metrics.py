"""Prometheus metrics of the live service (``GET /metrics``).

Latency histograms, SLA violations and the GMG write lag are observed as events happen; queue
lengths, device utilisation and lease counters are read from the live state at scrape time.
Every app has its own registry (tests run several apps in one process).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from service.api.records import LiveRequest
    from service.api.state import LiveState

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def sla_met(req: LiveRequest) -> bool:
    sla = req.sla  # its class's targets, or its own (x-slo-* headers)
    ttft = req.ttft_s or 0.0
    e2e = req.e2e_s or 0.0
    tbt = (e2e - ttft) / (len(req.output_tokens) - 1) if len(req.output_tokens) > 1 else 0.0
    return sla.slack_s(ttft, tbt, e2e) >= 0.0


class _StateCollector(Collector):
    def __init__(self, state: LiveState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        s = self.state
        for name, doc, requests in (
                ("slicesched_queue_length", "Requests waiting, per tenant", s.queued()),
                ("slicesched_requests_running", "Requests leased to executors, per tenant", s.in_flight())):
            family = GaugeMetricFamily(name, doc, labels=["tenant"])
            counts: dict[str, int] = dict.fromkeys(s.tenants, 0)
            for req in requests:
                counts[req.tenant_id] = counts.get(req.tenant_id, 0) + 1
            for tenant, n in sorted(counts.items()):
                family.add_metric([tenant], n)
            yield family
        util = GaugeMetricFamily("slicesched_device_utilisation",
                                 "Leases running on a device over its KV slots (0-1)", labels=["device"])
        for device_id in sorted(s.devices):
            slots = sum(r.max_batch for r in s.replicas.values() if device_id in r.device_ids)
            held = sum(len(r.leases) for r in s.replicas.values() if device_id in r.device_ids)
            util.add_metric([device_id], held / slots if slots else 0.0)
        yield util
        leases = CounterMetricFamily("slicesched_leases", "Leases by outcome", labels=["event"])
        for event in ("granted", "expired", "completed", "failed", "cancelled"):
            leases.add_metric([event], s.counters[f"leases_{event}"])
        yield leases
        rejected = CounterMetricFamily("slicesched_completions_rejected", "Completions of leases that were not live")
        rejected.add_metric([], s.counters["completions_rejected"])
        yield rejected


class _FunctionCollector(Collector):
    def __init__(self, fn: Callable[[], Iterable[Metric]]) -> None:
        self.fn = fn

    def collect(self) -> Iterator[Metric]:
        yield from self.fn()


class LiveMetrics:
    def __init__(self, state: LiveState) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_StateCollector(state))
        self.ttft = Histogram("slicesched_ttft_seconds", "Time to first token", ["tenant"],
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("slicesched_e2e_seconds", "Arrival to last token", ["tenant"],
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.violations = Counter("slicesched_sla_violations", "Finished requests that missed their SLA",
                                  ["tenant"], registry=self.registry)
        self.finished = Counter("slicesched_requests_finished", "Finished requests", ["tenant"],
                                registry=self.registry)
        self.arrivals = Counter("slicesched_requests_arrived", "Accepted requests", ["tenant"],
                                registry=self.registry)
        self.write_lag = Histogram("slicesched_gmg_write_lag_seconds",
                                   "From a live-state change to its commit in Neo4j",
                                   buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5),
                                   registry=self.registry)

    def watch(self, fn: Callable[[], Iterable[Metric]]) -> None:
        """Metrics read at scrape time from ``fn`` (the service's loops, Neo4j, the writer)."""
        self.registry.register(_FunctionCollector(fn))

    def arrived(self, req: LiveRequest) -> None:
        self.arrivals.labels(req.tenant_id).inc()

    def finished_request(self, req: LiveRequest) -> None:
        self.finished.labels(req.tenant_id).inc()
        self.ttft.labels(req.tenant_id).observe(req.ttft_s or 0.0)
        self.e2e.labels(req.tenant_id).observe(req.e2e_s or 0.0)
        if not sla_met(req):
            self.violations.labels(req.tenant_id).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

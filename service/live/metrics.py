"""Prometheus metrics of the live service (``GET /metrics``), named as serving engines name them.

The request-level names, units, labels and buckets are vLLM's with ``slicesched:`` in place of
``vllm:`` (``slicesched:time_to_first_token_seconds`` is ``vllm:time_to_first_token_seconds``),
so dashboards and gateways built for vLLM read them by changing the prefix; docs/API.md has the
mapping. Request series carry ``model_name`` (the model id a client names, the OpenAI ``model``)
and ``tenant`` (two tenants may both have a model ``chat``). The scheduler's own metrics
(placements, slices, what-ifs, steps, leases, the GMG writer) complete them.

Request latencies, token counts and ends are observed when a request ends (its result durable);
queue lengths, KV usage, slices and lease counters are read from the live state at scrape time
(:mod:`service.live.gauges`). Every app has its own registry (tests run several apps in one
process).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from service.domain.request import RequestStatus
from service.live.gauges import StateCollector

if TYPE_CHECKING:
    from service.live.records import LiveReplica, LiveRequest
    from service.live.state import LiveState

PREFIX = "slicesched:"
REQUEST_LABELS = ("model_name", "tenant")
# vLLM's buckets (vllm/v1/metrics/loggers.py), so percentiles compare across engines.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# The service's own durations: a scheduler step or a what-if takes milliseconds to seconds.
DECISION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WRITE_LAG_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def sla_met(req: LiveRequest) -> bool:
    """Whether a finished request met its targets: its SLA class's, or its own (x-slo-* headers)."""
    sla = req.sla
    ttft = req.ttft_s or 0.0
    e2e = req.e2e_s or 0.0
    return sla.slack_s(ttft, inter_token_s(req) or 0.0, e2e, len(req.prompt)) >= 0.0


def inter_token_s(req: LiveRequest) -> float | None:
    """A done request's mean gap between consecutive output tokens, ``(e2e - ttft) / (n - 1)``
    (the executor reports the first and the last token's time, not each token's); None with
    fewer than two tokens."""
    n = len(req.output_tokens)
    if n < 2 or req.ttft_s is None or req.e2e_s is None:
        return None
    return max(0.0, req.e2e_s - req.ttft_s) / (n - 1)


def finished_reason(req: LiveRequest) -> str:
    """vLLM's ``finished_reason``: ``length`` (ran to ``max_tokens``), ``stop`` (ended early on
    a stop token), ``abort`` (cancelled)."""
    if req.status == RequestStatus.CANCELLED:
        return "abort"
    return "length" if len(req.output_tokens) >= req.max_tokens else "stop"


def placement_kind(replica: LiveReplica) -> str:
    """``slice`` for a replica whose layers are cut over several devices (one slice of each
    iteration per device, :meth:`service.live.registry.Registry.stages`), else ``replica``."""
    return "slice" if len(replica.device_ids) > 1 else "replica"


class TokenHistogram(Collector):
    """A histogram whose observations carry a count: a request's ``n - 1`` inter-token gaps are
    one value observed ``n - 1`` times, in O(buckets) (prometheus_client's ``observe`` counts one).
    Used on the event loop only (observed and collected there: no lock)."""

    def __init__(self, name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> None:
        self.name, self.doc, self.labels, self.bounds = name, doc, labels, buckets
        self._series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}  # labels -> (per-bucket counts, [sum])

    def observe(self, labels: tuple[str, ...], value: float, count: int) -> None:
        counts, total = self._series.setdefault(labels, ([0] * (len(self.bounds) + 1), [0.0]))
        counts[bisect_left(self.bounds, value)] += count  # le: a value equal to a bound falls in its bucket
        total[0] += value * count

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=list(self.labels))
        for labels, (counts, total) in sorted(self._series.items()):
            cumulative, running = [], 0
            for bound, n in zip((*(str(float(b)) for b in self.bounds), "+Inf"), counts, strict=True):
                running += n
                cumulative.append((bound, float(running)))
            family.add_metric(list(labels), cumulative, total[0])
        yield family


class _FunctionCollector(Collector):
    def __init__(self, fn: Callable[[], Iterable[Metric]]) -> None:
        self.fn = fn

    def collect(self) -> Iterator[Metric]:
        yield from self.fn()


class LiveMetrics:
    """The registry behind ``/metrics`` and the hooks the service calls as things happen."""

    def __init__(self, state: LiveState) -> None:
        self.registry = r = CollectorRegistry()
        r.register(StateCollector(state, PREFIX))
        labels = REQUEST_LABELS
        p = PREFIX
        self.ttft = Histogram(f"{p}time_to_first_token_seconds", "Time to first token: arrival to the first "
                              "output token, in seconds", labels, buckets=TTFT_BUCKETS, registry=r)
        self.itl = TokenHistogram(f"{p}inter_token_latency_seconds", "Inter-token latency in seconds: each done "
                                  "request's mean gap (e2e - ttft) / (n - 1), observed once per gap", labels, ITL_BUCKETS)
        r.register(self.itl)
        self.e2e = Histogram(f"{p}e2e_request_latency_seconds", "End-to-end request latency: arrival to the last "
                             "output token, in seconds", labels, buckets=REQUEST_LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram(f"{p}request_queue_time_seconds", "Time waiting: arrival to admission into an "
                                    "executor's batch, in seconds", labels, buckets=REQUEST_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter(f"{p}prompt_tokens", "Prompt tokens of done requests", labels, registry=r)
        self.generation_tokens = Counter(f"{p}generation_tokens", "Output tokens of done requests", labels,
                                         registry=r)
        self.success = Counter(f"{p}request_success", "Requests that ended: done (finished_reason length or "
                               "stop) or cancelled (abort)", (*labels, "finished_reason"), registry=r)
        self.failure = Counter(f"{p}request_failure", "Requests failed after their last attempt", labels, registry=r)
        self.arrivals = Counter(f"{p}requests_arrived", "Accepted requests", labels, registry=r)
        self.violations = Counter(f"{p}sla_violations", "Done requests that missed their SLA class", labels,
                                  registry=r)
        self.placements = Counter(f"{p}placements_applied", "Replica placements applied, by the policy that "
                                  "decided them (container: homes, replica: the scheduler, admin: pinned), action "
                                  "(add, drain) and kind (replica: one device, slice: layers cut over devices)",
                                  ("policy", "action", "kind"), registry=r)
        self.step_s = Histogram(f"{p}scheduler_step_duration_seconds", "Wall time of one scheduler step, "
                                "what-ifs included", ("policy",), buckets=DECISION_BUCKETS, registry=r)
        self.whatif_s = Histogram(f"{p}whatif_duration_seconds", "Wall time of one what-if evaluation (the "
                                  "simulator without and with a change); _count counts them", ("source",),
                                  buckets=DECISION_BUCKETS, registry=r)
        self.write_lag = Histogram(f"{p}gmg_write_lag_seconds", "From a live-state change to the commit of its "
                                   "row in Neo4j (the GMG writer's batched mirror)", buckets=WRITE_LAG_BUCKETS,
                                   registry=r)

    def watch(self, fn: Callable[[], Iterable[Metric]]) -> None:
        """Metrics read at scrape time from ``fn`` (the service's loops, Neo4j, the writer)."""
        self.registry.register(_FunctionCollector(fn))

    def arrived(self, req: LiveRequest) -> None:
        self.arrivals.labels(req.model_id, req.tenant_id).inc()

    def request_ended(self, req: LiveRequest) -> None:
        """A request reached its end (done, cancelled or failed) and it is durable."""
        labels = (req.model_id, req.tenant_id)
        if req.status == RequestStatus.FAILED:
            self.failure.labels(*labels).inc()
            return
        self.success.labels(*labels, finished_reason(req)).inc()
        if req.status != RequestStatus.DONE:
            return
        self.ttft.labels(*labels).observe(req.ttft_s or 0.0)
        self.e2e.labels(*labels).observe(req.e2e_s or 0.0)
        self.queue_time.labels(*labels).observe(req.queued_s or 0.0)
        gap = inter_token_s(req)
        if gap is not None:
            self.itl.observe(labels, gap, len(req.output_tokens) - 1)
        self.prompt_tokens.labels(*labels).inc(len(req.prompt))
        self.generation_tokens.labels(*labels).inc(len(req.output_tokens))
        if not sla_met(req):
            self.violations.labels(*labels).inc()

    def placed(self, policy: str, action: str, replicas: Iterable[LiveReplica]) -> None:
        """Replicas added (``action="add"``) or set draining (``"drain"``) by ``policy``."""
        for replica in replicas:
            self.placements.labels(policy, action, placement_kind(replica)).inc()

    def what_if_timer(self, source: str) -> Callable[[float], None]:
        """The observer a live view calls with each what-if's seconds (``source``: scheduler, admin)."""
        return self.whatif_s.labels(source).observe

    def step_done(self, policy: str, seconds: float) -> None:
        self.step_s.labels(policy).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


"""The simulator's prediction of a testbench run: the same requests on a simulated cluster built
the way the live service's what-if mirror builds its own (:mod:`service.live.view`).

The cluster is :func:`~service.live.view.live_spec` of the executors' devices; the replica
has the live replica's KV slots (``max_num_seqs`` = the service's ``--max-batch``); iterations
are priced by the cost model the live service uses (``--cost-model``) plus a per-iteration host
overhead that replaces the model's own, as the mirror does with the mean iteration time the
executors report (``None``: the cost model's own overhead). The queue policy is the same object
the live service orders by, given the budget the live service gives: every request's
``max_tokens`` (:class:`LiveBudgetEstimator`).

Two calibrations of that overhead are compared (:func:`overheads`): ``mirror``, exactly the live
what-if mirror's (the executor's mean iteration time during the warm-up: what the service itself
would predict), and ``calibrated``, the time per iteration the replica *delivered* during the
warm-up with every KV slot busy (KV slots / measured output tokens per second), which also
charges what happens between iterations on a live replica and never in the simulator: a
finished request's slot waits for the completion to be written and for the next lease to be
polled, granted and prefilled.

A third, ``control-plane`` (:func:`predict_control_plane`), keeps the mirror's iterations and adds
the live control plane around them (:class:`ControlPlane`), measured on the same stack from lone
requests on the idle replica, except the executor's poll interval, a setting of the daemon: the
service holds the queue and orders it by the policy and hands leases out on the executor's polls,
as many as the replica has KV slots not held by a lease. An idle executor's long poll takes a
lease the moment there is one; a running one polls every ``poll_s``. A granted request joins the
batch ``dispatch_s`` later (the lease's commit and trip, the wait for the executor's next round),
and its lease holds its slot ``release_s`` after its last token (the completion's trip and
durable write). The simulator runs the batch; this module runs the service's and the executor's
side around it, event by event.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from service.core.cost import CostModel, IterationOverhead
from service.core.queue import FifoPolicy, QueuedRequest, QueuePolicy, RequestQueue
from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec
from service.harness.testbench.metrics import Outcome
from service.harness.testbench.workload import BenchWorkload
from service.live.view import live_spec
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.report import RequestOutcome

#: The live executors' devices a testbench run uses: (device id, executor id, kind, mem bytes).
Devices = Sequence[tuple[str, str, str, int]]


class LiveBudgetEstimator:
    """The live token budget: ``max_tokens`` scaled by the observed output/``max_tokens`` ratio,
    which stays 1 when every request runs to ``max_tokens`` (the built-in models have no stop
    ids), so the budget is the request's length. Learns nothing."""

    def estimate(self, req: RequestSpec) -> int:
        return req.output_tokens

    def observe(self, req: RequestSpec, true_output_tokens: int) -> None:
        pass


def overheads(*, iteration_s: float | None, tokens_per_s: float, max_batch: int) -> dict[str, float | None]:
    """The per-iteration overhead of each prediction (see the module docstring), by name."""
    return {"mirror": iteration_s, "calibrated": max_batch / tokens_per_s if tokens_per_s > 0 else None}


def _cluster(workload: BenchWorkload, policy: QueuePolicy, *, devices: Devices, cost_model: CostModel,
             max_batch: int, iteration_s: float | None, seed: int,
             observers: Sequence[_Finishes] = ()) -> SimulatedCluster:
    spec = live_spec(devices)
    model = workload.shape.model
    replica = ReplicaSpec("bench/1", model, (devices[0][0],), max_num_seqs=max_batch, tenant_id=workload.tenant_id)
    overheads = ({model: IterationOverhead(per_iteration_s=iteration_s, separate_prefill_passes=True)}
                 if iteration_s else None)
    return SimulatedCluster(spec, [replica], cost_model, rng=np.random.default_rng(seed),
                            sla_classes=workload.sla_classes(), overheads=overheads, queue_policy=policy,
                            estimator=LiveBudgetEstimator(), observers=list(observers))


def predict(workload: BenchWorkload, policy: QueuePolicy, *, devices: Devices, cost_model: CostModel,
            max_batch: int, iteration_s: float | None, seed: int = 0) -> list[Outcome]:
    """Every request's simulated outcome, by workload position (seconds from the first arrival);
    ``iteration_s`` is the per-iteration host overhead (None: the cost model's own)."""
    cluster = _cluster(workload, policy, devices=devices, cost_model=cost_model, max_batch=max_batch,
                       iteration_s=iteration_s, seed=seed)
    cluster.submit(workload.workload())
    cluster.run()
    index = {r.spec.request_id: i for i, r in enumerate(workload.requests)}
    first = min(r.spec.arrival_s for r in workload.requests)
    return sorted((Outcome(index[o.request_id], o.arrival_s - first, o.ttft_s, o.e2e_s, o.num_output_tokens,
                           o.admitted_s - o.arrival_s)
                   for o in cluster.report().requests if not o.dropped), key=lambda o: o.index)


@dataclass(frozen=True)
class ControlPlane:
    """The live control plane's two delays, measured (seconds; medians of ``samples`` lone requests).

    ``dispatch_s``: from a request's arrival at the idle service to its admission into the
    executor's batch (the service's ``queued_s`` of a request that found a free slot: the lease's
    grant and commit, the executor's poll, the wait for its next round). ``release_s``: from a
    request's last token (``arrival + e2e_s``) to when the request shows done (its completion's trip
    and durable write: its lease's end), during which the slot it held is not free to grant.
    ``poll_s``: the executor's poll interval while it runs leases, a setting of the daemon.
    """

    dispatch_s: float
    release_s: float
    samples: int = 0
    poll_s: float = 0.0  # 0: a running executor takes a lease at once

    def __post_init__(self) -> None:
        if not all(0.0 <= x < math.inf for x in (self.dispatch_s, self.release_s, self.poll_s)):
            raise InvalidInputError(f"control plane delays must be finite and >= 0, got dispatch "
                                    f"{self.dispatch_s}, release {self.release_s} and poll {self.poll_s}")


class _Finishes:
    """A simulator observer: each finished request's finish time, tenant and output tokens."""

    def __init__(self) -> None:
        self.done: list[tuple[float, str, int]] = []

    def slice_executed(self, device_id: str, start_s: float, end_s: float, owner: str) -> None:
        pass

    def request_finished(self, outcome: RequestOutcome) -> None:
        self.done.append((outcome.arrival_s + outcome.e2e_s, outcome.tenant_id, outcome.num_output_tokens))

    def take(self) -> list[tuple[float, str, int]]:
        out, self.done = self.done, []
        return out


def predict_control_plane(workload: BenchWorkload, policy: QueuePolicy, *, devices: Devices,
                          cost_model: CostModel, max_batch: int, iteration_s: float | None,
                          control: ControlPlane, seed: int = 0) -> list[Outcome]:
    """Every request's outcome with the live control plane around the simulated replica (see the
    module docstring), by workload position; latencies count from the request's arrival at the
    service, as the live service records them."""
    requests = sorted(workload.requests, key=lambda r: r.spec.arrival_s)
    first = requests[0].spec.arrival_s
    finishes = _Finishes()
    # the replica only ever holds what was granted (at most its KV slots): its own order is moot
    cluster = _cluster(workload, FifoPolicy(), devices=devices, cost_model=cost_model, max_batch=max_batch,
                       iteration_s=iteration_s, seed=seed, observers=[finishes])
    sla = workload.sla_classes()
    estimator = LiveBudgetEstimator()
    queue: RequestQueue[RequestSpec] = RequestQueue(policy)
    served: dict[str, float] = {}
    arrivals = deque(r.spec for r in requests)
    frees: list[float] = []  # when each granted lease ends at the service (a heap; only the finished ones)
    joined: dict[str, float] = {}  # request id -> when it joined the batch
    held = 0  # leases the replica holds
    step = max(control.release_s, 1e-3)  # no finish's lease can end before the next look
    now = 0.0
    last_poll = -math.inf  # when the executor last polled while it ran leases
    while arrivals or len(queue) or held:
        while frees and frees[0] <= now:
            heapq.heappop(frees)
            held -= 1
        while arrivals and arrivals[0].arrival_s - first <= now:
            spec = arrivals.popleft()
            budget = estimator.estimate(spec)
            arrival = spec.arrival_s - first
            queue.push(QueuedRequest(spec.request_id, spec.tenant_id, spec.model, arrival, spec.prompt_tokens,
                                     budget, priority=spec.priority or 0, true_output_tokens=spec.output_tokens,
                                     deadline_s=arrival + sla[spec.sla_class].deadline_s(spec.prompt_tokens, budget)),
                       spec)
        running = held - len(frees)  # leases the executor is running (the rest wait for their release)
        poll_at = now  # an idle executor's long poll takes a lease the moment there is one and a slot
        if running and control.poll_s > 0 and last_poll > -math.inf:  # a running one polls on its cadence
            ticks = math.ceil((now - last_poll) / control.poll_s - 1e-9)
            poll_at = last_poll + max(0, ticks) * control.poll_s
        granted = []
        if poll_at <= now + 1e-12:
            while held < max_batch and len(queue):
                spec = queue.pop(served)
                held += 1
                joined[spec.request_id] = now + control.dispatch_s
                granted.append(replace(spec, arrival_s=now + control.dispatch_s))
            if granted or running:
                last_poll = now
        if granted:
            cluster.submit(granted)
            running += len(granted)
        waiting = len(queue) > 0 and held < max_batch  # work and a slot, waiting for the next poll
        upcoming = (([arrivals[0].arrival_s - first] if arrivals else []) + frees[:1]
                    + ([now + step] if running else []) + ([poll_at] if waiting and poll_at > now else []))
        if not upcoming:  # every lease ended and nothing is left to arrive
            break
        now = max(now, min(upcoming))
        cluster.run_to(now)
        for t, tenant, tokens in finishes.take():  # the service counts a tenant's tokens at completion
            heapq.heappush(frees, t + control.release_s)
            served[tenant] = served.get(tenant, 0.0) + tokens
    cluster.run()
    index = {r.spec.request_id: i for i, r in enumerate(workload.requests)}
    arrival_of = {r.spec.request_id: r.spec.arrival_s - first for r in workload.requests}
    out = []
    for o in cluster.report().requests:
        if o.dropped:
            continue
        waited = joined[o.request_id] - arrival_of[o.request_id]
        out.append(Outcome(index[o.request_id], arrival_of[o.request_id], waited + o.ttft_s, waited + o.e2e_s,
                           o.num_output_tokens, waited + o.admitted_s - o.arrival_s))
    return sorted(out, key=lambda o: o.index)

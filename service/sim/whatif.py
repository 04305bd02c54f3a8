"""What-if: the consequences of placing slices, predicted on a fork of the simulated cluster.

In-process and pure. :meth:`WhatIf.evaluate` forks only the part of the cluster the candidate
placements can influence (their devices, the replicas on those devices and, transitively, those
replicas' other devices; see :meth:`SimulatedCluster.fork`), commits the candidates on the fork
and simulates it until its work is done or ``horizon_s`` passes. Nothing else is re-simulated,
and the original cluster is not changed.

Contract: for work already in the system (no arrivals after the snapshot reach the affected
replicas before the horizon), the prediction equals what the full simulator does when the same
placements are committed at the same time: same code, same event order, same cost tables.
Tenants that have no request on an affected replica are unaffected by construction and do not
appear in the slack maps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from service.core.memory import MemoryViolation
from service.domain.request import RequestSpec
from service.sim.cluster import Placement, SimulatedCluster, SliceSpec, SliceTiming
from service.sim.report import RequestOutcome


@dataclass(frozen=True, slots=True)
class WhatIfResult:
    slices: dict[str, SliceTiming]  # slice_id -> predicted inputs-ready, start and finish times
    request_finish_s: dict[str, float]  # request_id -> predicted finish (inf: not by the horizon)
    tenant_slack_s: dict[str, float]  # tenant -> smallest SLA slack of its affected requests
    baseline_tenant_slack_s: dict[str, float]  # the same without the candidates
    device_peak_bytes: dict[str, int]  # affected device -> peak memory from the snapshot on
    violations: list[MemoryViolation]  # memory overflows the candidates would cause or meet
    affected_device_ids: tuple[str, ...]  # what was re-simulated
    horizon_s: float  # simulated up to here (inf: until the affected work drained)

    @property
    def min_slack_s(self) -> float:
        return min(self.tenant_slack_s.values(), default=math.inf)

    def slack_delta_s(self, tenant_id: str) -> float:
        """How much the candidates change a tenant's slack (negative: they hurt it)."""
        return self.tenant_slack_s.get(tenant_id, math.inf) - self.baseline_tenant_slack_s.get(tenant_id, math.inf)


class WhatIf:
    """Evaluates candidate placements against the cluster's state at ``cluster.now_s``.

    ``horizon_s`` bounds each re-simulation in simulated seconds after the snapshot (``None``:
    until the affected replicas drain). Baselines are memoised per snapshot (the cluster's time
    and number of handled events) and affected set.
    """

    def __init__(self, cluster: SimulatedCluster, *, horizon_s: float | None = None) -> None:
        self.cluster = cluster
        self.horizon_s = horizon_s
        self._baselines: dict[tuple[float, int, frozenset[str]], dict[str, float]] = {}

    def evaluate(self, candidates: Sequence[tuple[SliceSpec, Placement]]) -> WhatIfResult:
        cluster = self.cluster
        touched = [p.device_id for _, p in candidates]
        touched += [s.input_device_id for s, _ in candidates if s.input_device_id is not None]
        devices, _ = cluster.affected(touched)
        until = None if self.horizon_s is None else cluster.now_s + self.horizon_s

        fork = cluster.fork(devices)
        violations_before = len(fork.ledger.violations)
        timings = {s.slice_id: fork.commit(s, p) for s, p in candidates}
        in_flight = fork.in_flight()
        fork.run(until)
        outcomes = fork.metrics.outcomes

        key = (cluster.now_s, cluster.engine.num_handled, frozenset(devices))
        baseline = self._baselines.get(key)
        if baseline is None:
            base = cluster.fork(devices)
            base_in_flight = base.in_flight()
            base.run(until)
            baseline = self._baselines[key] = _tenant_slack(base, base_in_flight, base.metrics.outcomes, until)

        finish = {spec.request_id: math.inf for _, spec in in_flight}
        finish.update({o.request_id: o.finish_s for o in outcomes if not o.dropped})
        return WhatIfResult(
            slices=timings,
            request_finish_s=finish,
            tenant_slack_s=_tenant_slack(fork, in_flight, outcomes, until),
            baseline_tenant_slack_s=baseline,
            device_peak_bytes={d: fork.ledger.peak_bytes(d) for d in sorted(devices)},
            violations=fork.ledger.violations[violations_before:],
            affected_device_ids=tuple(sorted(devices)),
            horizon_s=math.inf if until is None else until,
        )


def _tenant_slack(fork: SimulatedCluster, in_flight: list[tuple[str, RequestSpec]],
                  outcomes: list[RequestOutcome], until: float | None) -> dict[str, float]:
    """Smallest slack per tenant over the in-flight requests. One not finished by the horizon
    counts with its end-to-end slack so far (an upper bound: the truth can only be worse)."""
    slack: dict[str, float] = {}
    done = {o.request_id: o for o in outcomes}
    now = until if until is not None else fork.now_s
    for _, spec in in_flight:
        o = done.get(spec.request_id)
        if o is not None:
            value = o.slack_s
        else:
            sla = fork.sla_classes.get(spec.sla_class) or fork.sla_classes["standard"]
            value = sla.e2e_s - (now - spec.arrival_s)
        slack[spec.tenant_id] = min(slack.get(spec.tenant_id, math.inf), value)
    return slack

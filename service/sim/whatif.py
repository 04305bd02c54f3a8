"""What-if: the consequences of a change, predicted on a fork of the simulated cluster. The one
home of the simulator's what-ifs: placement policies reach it through
``SimClusterView.what_if`` (a new replica, :meth:`WhatIf.replica_change`) and
``SimClusterView.drain_what_if`` (a guest kept or drained, :meth:`WhatIf.drain`); the scheduler of
operator slices through :meth:`WhatIf.evaluate` (placed slices).

A replica change forks the part of the simulation it can touch (the tenant's replicas and the
candidate devices, closed over the replicas sharing them), applies the change on the fork,
and runs the queued work forward together with a persistence forecast of arrivals (the last
``horizon_s`` of arrivals of the tenants involved, replayed shifted by ``horizon_s``: only the
past is used, as a deployed scheduler would). Predicted late requests are those that finished
late or are still in flight at the horizon past their end-to-end deadline, or past their TTFT
target without a first token (a request queued behind a backlog is late before it finishes).

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
from dataclasses import dataclass, replace

from service.core.memory import MemoryViolation
from service.core.scheduler import WhatIfOutcome
from service.domain.error import InvariantError
from service.domain.request import RequestSpec
from service.sim.cluster import Placement, ReplicaSpec, SimulatedCluster, SliceSpec, SliceTiming
from service.sim.report import RequestOutcome

MIN_HISTORY_S = 5.0  # the shortest history a load forecast repeats (a tenant's first seconds are a poor sample)
# Rounding error of simulated times: far below any duration the simulator models (an iteration
# takes milliseconds), far above the rounding of a time of day in seconds (~1e-12 at 1e4 s).
FLOAT_NOISE_S = 1e-6


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
    until the affected replicas drain). Runs without a change (the baselines of
    :meth:`evaluate` and :meth:`replica_change`, the kept side of :meth:`drain`) are memoised per
    snapshot (:attr:`SimulatedCluster.version`), affected set and horizon: every candidate of a
    step whose affected devices close over the same set shares one baseline, and a drain's kept
    side is that baseline too. Only the current snapshot's entries are kept. Keep one
    ``WhatIf`` per cluster across a step's what-ifs to share them.
    """

    def __init__(self, cluster: SimulatedCluster, *, horizon_s: float | None = None) -> None:
        self.cluster = cluster
        self.horizon_s = horizon_s
        self._baselines: dict[tuple[tuple[float, int, int, int], frozenset[str]], dict[str, float]] = {}
        self._unchanged: dict[tuple[tuple[float, int, int, int], frozenset[str], float, float], WhatIfOutcome] = {}
        self.num_baseline_runs = 0  # runs without a change simulated (not answered from the memo)

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

        key = (cluster.version, frozenset(devices))
        baseline = self._baselines.get(key)
        if baseline is None:
            self._baselines = {k: v for k, v in self._baselines.items() if k[0] == cluster.version}
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


    def replica_change(self, spec: ReplicaSpec, horizon_s: float, *, drain_s: float = 0.0
                       ) -> tuple[WhatIfOutcome, WhatIfOutcome | None]:
        """The next ``horizon_s`` without and with the replica ``spec`` (its weights copied from
        the tenant's first home device unless that is one of its own), over the same affected
        devices: ``(baseline, changed)``; ``changed`` is ``None`` when its weights do not fit.
        ``drain_s`` > 0: each run then goes on for up to ``drain_s`` without arrivals, and counts
        which requests in flight at the horizon end late (``late_after_horizon_by_tenant``)."""
        cluster = self.cluster
        homes = [d for rid in cluster.replica_ids if cluster.replica_spec(rid).tenant_id == spec.tenant_id
                 for d in cluster.replica_spec(rid).device_ids]
        devices = set(homes) | set(spec.device_ids)
        base = self._unchanged_run(devices, horizon_s, drain_s=drain_s)
        source = homes[0] if homes else None
        weights_from = source if source not in spec.device_ids else None
        return base, self._forecast_run(cluster.fork(devices), spec, horizon_s, weights_from=weights_from,
                                        drain_s=drain_s)

    def drain(self, replica_id: str, horizon_s: float) -> tuple[WhatIfOutcome, WhatIfOutcome]:
        """The next ``horizon_s`` with the replica kept and with it drained (its queue handed to
        its tenant's other replicas, its running requests finishing there), over the same
        affected devices: ``(kept, drained)``."""
        cluster = self.cluster
        tenant = cluster.replica_spec(replica_id).tenant_id
        devices = {d for rid in cluster.replica_ids if rid == replica_id or cluster.replica_spec(rid).tenant_id == tenant
                   for d in cluster.replica_spec(rid).device_ids}
        kept = self._unchanged_run(devices, horizon_s)
        drained = self._forecast_run(cluster.fork(devices), None, horizon_s, drain=replica_id)
        if drained is None:
            raise InvariantError("a what-if without a replica to add always has an outcome")
        return kept, drained

    def _unchanged_run(self, device_ids: set[str], horizon_s: float, *, drain_s: float = 0.0) -> WhatIfOutcome:
        """The next ``horizon_s`` of the part of the cluster ``device_ids`` close over, changed in
        nothing (memoised: the class doc). The run depends only on that part, the snapshot and
        the horizon: the fork holds exactly the affected replicas, and the forecast is of their
        tenants."""
        cluster = self.cluster
        devices, _ = cluster.affected(device_ids)
        key = (cluster.version, frozenset(devices), horizon_s, drain_s)
        got = self._unchanged.get(key)
        if got is None:
            self._unchanged = {k: v for k, v in self._unchanged.items() if k[0] == cluster.version}
            got = self._forecast_run(cluster.fork(devices), None, horizon_s, drain_s=drain_s)
            if got is None:
                raise InvariantError("a what-if without a change always has an outcome")
            self.num_baseline_runs += 1
            self._unchanged[key] = got
        return got

    def _forecast(self, fork: SimulatedCluster, horizon_s: float) -> list[RequestSpec]:
        """Persistence forecast: the next ``horizon_s`` brings what the last ``horizon_s`` brought,
        for the tenants whose replicas are in the fork (only the past is used). A tenant seen for
        less than that (its history span, at least :data:`MIN_HISTORY_S`) is forecast to go on as
        it began: its history repeats every span (shifting only by ``horizon_s`` would have a
        tenant that began sending five seconds ago send nothing for fifteen).

        Every forecast arrival is at or after ``now``. In real numbers the shift guarantees it (a
        request of the window arrived at or after ``now - span``), but not in floats: the tenant's
        first arrival ``seen`` shifted by the rounded ``now - seen`` lands one float step before
        ``now`` for about 1.5% of random pairs of times (issue 37: seed 7 of a100-8tenants), and
        the engine refuses an event in the past. :func:`not_before` moves such an arrival to
        ``now``, where exact arithmetic puts it; every other forecast time is unchanged, bit for bit."""
        now = self.cluster.now_s
        tenants = {fork.replica_spec(rid).tenant_id for rid in fork.replica_ids}
        past = [r for r in self.cluster.arrivals_since(now - horizon_s) if r.tenant_id in tenants]
        span: dict[str | None, float] = {}
        for t in tenants:
            seen = None if t is None else self.cluster.seen_since(t)
            span[t] = horizon_s if seen is None else min(horizon_s, max(MIN_HISTORY_S, now - seen))
        out = [replace(r, request_id=r.request_id + "~f", arrival_s=not_before(now, r.arrival_s + span[r.tenant_id]))
               for r in past]
        for k in range(2, math.ceil(horizon_s / min(span.values(), default=horizon_s)) + 1):
            out += [replace(r, request_id=f"{r.request_id}~f{k}", arrival_s=not_before(now, at)) for r in past
                    if (at := r.arrival_s + k * span[r.tenant_id]) < now + horizon_s]
        out.sort(key=lambda r: r.arrival_s)
        return out

    def _forecast_run(self, fork: SimulatedCluster, spec: ReplicaSpec | None, horizon_s: float, *,
                      weights_from: str | None = None, drain: str | None = None,
                      drain_s: float = 0.0) -> WhatIfOutcome | None:
        now = fork.now_s
        violations_before = len(fork.ledger.violations)
        tokens_before = fork.tokens_out
        if spec is not None and fork.add_replica(spec, weights_from=weights_from) is None:
            return None  # its weights do not fit there
        if drain is not None:
            fork.drain_replica(drain)
        end = now + horizon_s
        fork.submit(self._forecast(fork, horizon_s))
        fork.run(until=end)
        tokens = fork.tokens_out - tokens_before  # produced within the horizon, finished or not
        late: dict[str, int] = {}
        for o in fork.metrics.outcomes:
            if not o.sla_met:
                late[o.tenant_id] = late.get(o.tenant_id, 0) + 1
        late_now = fork.late_in_flight(end)
        for req in late_now:
            late[req.tenant_id] = late.get(req.tenant_id, 0) + 1
        peaks = {d: fork.ledger.peak_bytes(d) for d in {d for rid in fork.replica_ids
                                                        for d in fork.replica_spec(rid).device_ids}}
        memory = len(fork.ledger.violations) - violations_before
        after = late_after_horizon(fork, end, drain_s, {r.request_id for r in late_now}) if drain_s > 0.0 else {}
        return WhatIfOutcome(horizon_s, tokens, late, memory, peaks, after)


DRAIN_STEP_S = 1.0  # how often a drain run checks whether every request it follows is settled


def late_after_horizon(fork: SimulatedCluster, end_s: float, drain_s: float, late_ids: set[str]) -> dict[str, int]:
    """Per tenant, the requests in flight at ``end_s`` (the horizon) and not late then (not in
    ``late_ids``) that end late once ``fork`` runs on, for at most ``drain_s``, with no further
    arrivals (the forecast stops at the horizon): finished past their SLA, or in flight and late
    by the time the run stops. The run stops early, checked every :data:`DRAIN_STEP_S`, once
    each of those requests has finished or is late (nothing it follows can change after that).
    Runs ``fork`` on; call it after every other figure is read."""
    pending = {req.request_id for _, req in fork.in_flight() if req.request_id not in late_ids}
    done = len(fork.metrics.outcomes)
    out: dict[str, int] = {}
    until = end_s
    while pending and until < end_s + drain_s:
        until = min(end_s + drain_s, until + DRAIN_STEP_S)
        fork.run(until=until)
        for o in fork.metrics.outcomes[done:]:
            if o.request_id in pending:
                pending.discard(o.request_id)
                if not o.sla_met:
                    out[o.tenant_id] = out.get(o.tenant_id, 0) + 1
        done = len(fork.metrics.outcomes)
        for req in fork.late_in_flight(until):
            if req.request_id in pending:
                pending.discard(req.request_id)
                out[req.tenant_id] = out.get(req.tenant_id, 0) + 1
    return out


def not_before(now_s: float, at_s: float) -> float:
    """``at_s``, or ``now_s`` when rounding put it before ``now_s``. Only for times that are at or
    after ``now_s`` in exact arithmetic (a shift of a past time by at least its age): a time
    truly in the past is a bug the engine must still see, so a gap wider than float noise
    (a millionth of a second) raises ``InvariantError`` here instead of being hidden."""
    if at_s >= now_s:
        return at_s
    if now_s - at_s > FLOAT_NOISE_S:
        raise InvariantError(f"a forecast arrival at {at_s!r} is {now_s - at_s:.3g} s before now ({now_s!r})")
    return now_s


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

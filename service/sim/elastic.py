"""Instant, free reallocation of whole devices: what the ``oracle-elastic`` ceiling does to a
simulated cluster (:func:`reallocate`). Not a deployable mechanism: it moves devices between
tenants at once, with no weight copy, which no real cluster can do.

A replica that loses its devices is evicted: its queued requests and its running ones go back
to its tenant's replicas after the move (a running request keeps the tokens it produced and
prefills its prompt plus those tokens again, as after a preemption by recompute); the iteration
it was running is abandoned (its device stays busy until that iteration's end, its tokens are
not counted). New replicas take requests at once: new arrivals, and an even share of their
tenant's queued requests (as a guest replica does when it becomes ready).
"""

from __future__ import annotations

from collections.abc import Sequence

from service.core.queue import QueuedRequest
from service.sim.cluster import SimulatedCluster
from service.sim.engine import StepRequested
from service.sim.replica import Live, ReplicaSpec

__all__ = ["reallocate"]

_UNKEYED = QueuedRequest("", "", "", 0.0, 0, 0)


def reallocate(cluster: SimulatedCluster, wanted: Sequence[ReplicaSpec]) -> tuple[int, int]:
    """Make the cluster's replicas ``wanted`` (matched by model, tenant and devices; ids of new
    ones are taken from ``wanted``): evict the others, add the missing ones, hand the evicted
    requests to their tenants' replicas. Returns ``(evicted, added)``."""
    st = cluster.state
    now = cluster.now_s
    key = {(s.tenant_id, s.model, s.device_ids) for s in wanted}
    have = {(st.replicas[r].spec.tenant_id, st.replicas[r].spec.model, st.replicas[r].spec.device_ids): r
            for r in list(st.replicas)}
    orphans: list[Live] = []
    evicted = 0
    for k, rid in have.items():
        if k not in key:
            orphans += _evict(cluster, rid)
            evicted += 1
    added = 0
    fresh: list[str] = []
    for spec in wanted:
        k = (spec.tenant_id, spec.model, spec.device_ids)
        if k in have:
            continue
        uid = f"{spec.replica_id}~{now:g}"  # never an evicted replica's id: its events are still queued
        while uid in st.replicas:
            uid += "+"
        st.dynamic = True
        cluster._add_replica(ReplicaSpec(uid, spec.model, spec.device_ids, spec.max_batched_tokens,
                                         spec.max_num_seqs, tenant_id=spec.tenant_id))
        st.last_active_s[uid] = now
        fresh.append(uid)
        added += 1
    wake: set[str] = set()
    for live in orphans:
        peers = [r for r in st.by_model.get(live.spec.model, ())
                 if st.replicas[r].spec.tenant_id == live.spec.tenant_id]
        if not peers:  # the allocation keeps one replica per tenant: cannot happen
            raise RuntimeError(f"no replica left for tenant {live.spec.tenant_id}")
        dest = min(peers, key=lambda r: (st.replicas[r].load(), r))
        st.replicas[dest].preempted.push(_UNKEYED, live)
        wake.add(dest)
    for uid in fresh:  # after the orphans are placed: the share counts them
        cluster._routing.steal(st.replicas[uid])
    for rid in sorted(wake | {r for r in st.replicas if st.replicas[r].waiting}):
        r = st.replicas[rid]
        if not r.busy and not r.step_pending:
            r.step_pending = True
            cluster.engine.schedule(StepRequested(time_s=now, replica_id=rid))
    return evicted, added


def _evict(cluster: SimulatedCluster, rid: str) -> list[Live]:
    """Remove a replica now; its requests, made ready to be readmitted elsewhere."""
    st = cluster.state
    r = st.replicas[rid]
    lives: list[Live] = []
    last = r.iteration - 1  # the last completed step (a running iteration is abandoned)
    lives += r.prefilling
    for ls in r.finishing.values():
        for live in ls:  # decoding: keep the tokens of the completed steps
            live.generated = min(live.generated + last - live.decode_iter, live.spec.output_tokens - 1)
            lives.append(live)
    for live in lives:
        cluster._batcher.recomputed_tokens += live.prefilled
        live.prefilled = 0
        live.decode_iter = -1
        live.preempted_s = cluster.now_s
    lives += r.preempted.take(len(r.preempted), st.served)
    lives += r.waiting.take(len(r.waiting), st.served)
    r.prefilling.clear()
    r.finishing.clear()
    r.num_decodes = 0
    for a in [*r.kv_allocs, *r.act_allocs]:
        cluster.ledger.free(a)
    for d in r.device_ids:
        for a in [a for a in cluster.ledger.allocations(d) if a.owner == f"{rid}/weights"]:
            cluster.ledger.free(a)
    st.remove_replica(rid)
    st.dynamic = True
    return lives

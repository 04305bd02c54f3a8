"""Routing: which replica's queue a request waits in.

A request goes to a replica of its model that serves its tenant (or any tenant), is ready and
is not draining; among several, to a custom router's choice or to the one with the fewest
requests in it, ties broken by the state's ``rng``. A request that could never fit any of them
(its whole KV on an empty replica) is dropped. Each queued request carries its token budget
(from the ``estimator``; the true length for an oracle policy without one), its priority (its
own, else its tenant's), its tenant's weight and its deadline (arrival plus its SLA class's
finish-by target for that budget), what the queue policy orders by. Run-time replicas move queued requests:
a draining replica hands its queue to its peers, a new one takes an even share of its tenant's.

A sliced guest (operator-level slices, :mod:`service.sim.pipeline`) keeps no queue of its own:
an arriving request goes to it only when its queue is empty and it has a free batch slot (it
can start the request at its next iteration), and at each iteration it admits, after its own
queue, what fits from the heads of its tenant's other replicas' queues (:meth:`Routing.pull_from`);
it takes no share at start, and when drained hands back its preempted requests as well as its
queue. Its requests thus never wait behind a pipeline slower than the replica they came from.

Nor does it take a request whose pace it cannot keep: once its last iteration waited longer for
the owners' gaps (its span less its own run time: what each token there waits beyond the
model's pace) than the request's TBT target, an arrival is not routed to it and a queue whose
head has such a target is not pulled from. Measured before this rule and the owner's-backlog
rule of :mod:`service.sim.pipeline` (a100-8tenants, seed 1, load 1.45, 120 s): the what-if
refused 49 of 54 sliced plans because a tenant was predicted worse, mostly an owner of the
borrowed devices (coder 26, docs 19); with both, 29 of 39.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from service.core.queue import QueuedRequest, QueuePolicy, WaitingQueue
from service.domain.request import RequestSpec
from service.sim.batcher import Batcher
from service.sim.replica import Live, OutputEstimator, Replica
from service.sim.sla import SlaClass
from service.sim.state import SimState

__all__ = ["Routing"]

Choose = Callable[[RequestSpec, Sequence[str]], str]  # (request, candidate replica ids) -> replica id


class Routing:
    __slots__ = ("batcher", "choose", "estimator", "queue_policy", "sla_classes", "state", "tenant_priority",
                 "tenant_weight")

    def __init__(self, state: SimState, batcher: Batcher, *, choose: Choose | None,
                 queue_policy: QueuePolicy | None, estimator: OutputEstimator | None,
                 tenant_priority: Mapping[str, int], tenant_weight: Mapping[str, float],
                 sla_classes: Mapping[str, SlaClass]) -> None:
        self.state = state
        self.batcher = batcher
        self.choose = choose
        self.queue_policy = queue_policy
        self.estimator = estimator
        self.tenant_priority = tenant_priority  # missing tenants: 0
        self.tenant_weight = tenant_weight  # missing tenants: 1.0
        self.sla_classes = sla_classes  # by name; a request of an unknown class has no deadline

    def routable(self, req: RequestSpec, now: float) -> list[str]:
        """Replicas that may take ``req`` now: its model, its tenant (or any), ready, not draining."""
        st = self.state
        ids = st.by_model.get(req.model, [])
        replicas = st.replicas
        if not st.dynamic:
            return [rid for rid in ids if replicas[rid].spec.tenant_id in (None, req.tenant_id)]
        return [rid for rid in ids if replicas[rid].spec.tenant_id in (None, req.tenant_id)
                and rid not in st.draining and st.ready_at.get(rid, 0.0) <= now]

    def fits_ever(self, req: RequestSpec, candidates: Sequence[str]) -> bool:
        """Could the whole request's KV fit on an otherwise empty replica of its model?"""
        return any(self.batcher.fits_ever(req, self.state.replicas[rid]) for rid in candidates)

    def route(self, req: RequestSpec, candidates: Sequence[str]) -> str:
        if len(candidates) > 1:
            replicas = self.state.replicas
            # a sliced guest takes an arrival only when it can start it at its next iteration and
            # keep its pace
            ready = [c for c in candidates if not _pulls(replicas[c])
                     or (_can_start(replicas[c]) and self._keeps_pace(replicas[c], req))]
            candidates = ready or candidates
        if len(candidates) == 1:
            return candidates[0]
        if self.choose is not None:
            return self.choose(req, candidates)
        replicas = self.state.replicas
        loads = [replicas[c].load() for c in candidates]
        least = min(loads)
        ties = [c for c, load in zip(candidates, loads, strict=True) if load == least]
        return ties[0] if len(ties) == 1 else ties[int(self.state.rng.integers(len(ties)))]

    # ---- queues ------------------------------------------------------------------------------
    def enqueue(self, r: Replica, req: RequestSpec) -> None:
        """Queue an arriving request on ``r`` with its token budget."""
        policy = self.queue_policy
        truth = policy is not None and policy.needs_truth
        # without an estimator only an oracle gets a budget: the true length
        estimate = (self.estimator.estimate(req) if self.estimator is not None
                    else req.output_tokens if truth else 0)
        self.push(r, Live(req, estimate))

    def push(self, r: Replica, live: Live) -> None:
        spec = live.spec
        truth = self.queue_policy is not None and self.queue_policy.needs_truth
        priority = spec.priority if spec.priority is not None else self.tenant_priority.get(spec.tenant_id, 0)
        sla = self.sla_classes.get(spec.sla_class)
        deadline = spec.arrival_s + sla.deadline_s(spec.prompt_tokens, live.estimate) if sla is not None else math.inf
        q = QueuedRequest(spec.request_id, spec.tenant_id, spec.model, spec.arrival_s, spec.prompt_tokens,
                          live.estimate, 0, priority, self.tenant_weight.get(spec.tenant_id, 1.0),
                          spec.output_tokens if truth else None, deadline)
        r.waiting.push(q, live)

    def steal(self, r: Replica) -> None:
        """A new replica takes an even share of its tenant's queued requests (a sliced guest
        takes none: it admits from its peers' queues what it can start, see :meth:`pull_from`)."""
        if _pulls(r):
            return
        st = self.state
        tenant = r.spec.tenant_id
        peers = [st.replicas[x] for x in st.by_model.get(r.spec.model, [])
                 if x != r.spec.replica_id and st.replicas[x].spec.tenant_id == tenant]
        target = sum(len(p.waiting) for p in peers) // (len(peers) + 1)  # each replica's fair share
        share = target
        for p in sorted(peers, key=lambda p: -len(p.waiting)):
            take = min(share, max(0, len(p.waiting) - target))
            for live in reversed(p.waiting.take(take, st.served)):
                self.push(r, live)
            share -= take

    def pull_from(self, r: Replica, now: float) -> list[WaitingQueue[Live]]:
        """The queues a sliced guest admits from after its own: those of its tenant's other
        replicas of the model that take requests now, longest first (none for other replicas)."""
        if not _pulls(r):
            return []
        st = self.state
        rid = r.spec.replica_id
        peers = [st.replicas[x] for x in st.by_model.get(r.spec.model, []) if x != rid
                 and st.replicas[x].spec.tenant_id == r.spec.tenant_id and x not in st.draining
                 and st.ready_at.get(x, 0.0) <= now]
        return [p.waiting for p in sorted(peers, key=lambda p: (-len(p.waiting), p.spec.replica_id))
                if p.waiting and self._keeps_pace(r, p.waiting.peek(st.served).spec)]

    def _keeps_pace(self, r: Replica, req: RequestSpec) -> bool:
        """Whether what the sliced guest ``r``'s last iteration waited for gaps is within
        ``req``'s TBT target (or none has ended yet, or the request has no target): the module doc."""
        sla = self.sla_classes.get(req.sla_class)
        return sla is None or not r.gap_wait_s > sla.tbt_s

    def hand_off(self, r: Replica, now: float) -> list[str]:
        """Move a draining replica's queue to its peers (a request with nowhere else to go stays;
        a sliced guest's preempted requests go too: they hold no KV); returns the idle peers that
        now need a step, in the order they became so."""
        st = self.state
        wake: list[str] = []
        unstarted = r.waiting.take(len(r.waiting), st.served)
        if _pulls(r):
            unstarted += r.preempted.take(len(r.preempted), st.served)
        for live in unstarted:
            others = self.routable(live.spec, now)
            if not others:
                self.push(r, live)  # nowhere else: it stays and is served before removal
                continue
            dest = st.replicas[self.route(live.spec, others)]
            self.push(dest, live)
            if not dest.busy and not dest.step_pending:
                dest.step_pending = True
                wake.append(dest.spec.replica_id)
        return wake


def _pulls(r: Replica) -> bool:
    """A sliced guest: it admits from its peers' queues rather than keep one (module doc)."""
    return r.spec.guest and bool(r.spec.stages)


def _can_start(r: Replica) -> bool:
    """Nothing queued on it and a free batch slot: an arrival would start at its next iteration."""
    return not r.waiting and not r.preempted and len(r.prefilling) + r.num_decodes < r.spec.max_num_seqs

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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from service.core.cost import CostModel, IterationOverhead
from service.core.queue import QueuePolicy
from service.domain.request import RequestSpec
from service.harness.testbench.metrics import Outcome
from service.harness.testbench.workload import BenchWorkload
from service.live.view import live_spec
from service.sim.cluster import ReplicaSpec, SimulatedCluster

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


def predict(workload: BenchWorkload, policy: QueuePolicy, *, devices: Devices, cost_model: CostModel,
            max_batch: int, iteration_s: float | None, seed: int = 0) -> list[Outcome]:
    """Every request's simulated outcome, by workload position (seconds from the first arrival);
    ``iteration_s`` is the per-iteration host overhead (None: the cost model's own)."""
    spec = live_spec(devices)
    model = workload.shape.model
    replica = ReplicaSpec("bench/1", model, (devices[0][0],), max_num_seqs=max_batch, tenant_id=workload.tenant_id)
    overheads = ({model: IterationOverhead(per_iteration_s=iteration_s, separate_prefill_passes=True)}
                 if iteration_s else None)
    cluster = SimulatedCluster(spec, [replica], cost_model, rng=np.random.default_rng(seed),
                               sla_classes=workload.sla_classes(), overheads=overheads, queue_policy=policy,
                               estimator=LiveBudgetEstimator())
    cluster.submit(workload.workload())
    cluster.run()
    index = {r.spec.request_id: i for i, r in enumerate(workload.requests)}
    first = min(r.spec.arrival_s for r in workload.requests)
    return sorted((Outcome(index[o.request_id], o.arrival_s - first, o.ttft_s, o.e2e_s, o.num_output_tokens,
                           o.admitted_s - o.arrival_s)
                   for o in cluster.report().requests if not o.dropped), key=lambda o: o.index)

"""Queue policies and output-length estimates inside the simulated cluster: SJF against FIFO
under queueing load, the oracle as a bound, fair share, priorities, starvation reporting and
online calibration during a run."""

from __future__ import annotations

import numpy as np
import pytest

from learned.estimator import OutputLengthEstimator
from service.core.queue import QueuePolicy, make_queue_policy
from service.domain.cluster import ClusterSpec
from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec
from service.sim.analytic import RooflineLike
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.report import SimReport


def _spec() -> ClusterSpec:
    return ClusterSpec.from_dict({"name": "t", "hosts": [{
        "host_id": "h", "devices": [{"device_id": "h/gpu0", "kind": "A100-80GB"}],
        "intra_link": {"gbps": 100.0, "latency_us": 5.0}}]})


def _requests(rng: np.random.Generator, n: int, *, tenants: tuple[str, ...] = ("t",), gap_s: float = 1e-3,
              start: int = 0) -> list[RequestSpec]:
    """Short prompts get short answers (~8 tokens), long prompts long ones (~150): a prompt-length
    class an estimator can learn."""
    out = []
    for i in range(n):
        long = rng.random() < 0.4
        prompt = int(rng.integers(800, 1200)) if long else int(rng.integers(50, 120))
        output = max(1, round(float((150 if long else 8) * np.exp(0.3 * rng.standard_normal()))))
        tenant = tenants[i % len(tenants)]
        out.append(RequestSpec(f"q{start + i}", tenant, "tiny", i * gap_s, prompt, output))
    return out


def _run(policy: QueuePolicy | None, reqs: list[RequestSpec], *, estimator: OutputLengthEstimator | None = None,
         max_num_seqs: int = 4, **kw: object) -> tuple[SimReport, SimulatedCluster]:
    sim = SimulatedCluster(_spec(), [ReplicaSpec("r", "tiny", ("h/gpu0",), max_num_seqs=max_num_seqs)],
                           RooflineLike(), rng=np.random.default_rng(0), queue_policy=policy,
                           estimator=estimator, **kw)  # type: ignore[arg-type]
    sim.submit(reqs)
    sim.run()
    return sim.report(), sim


def _median_e2e_s(report: SimReport) -> float:
    return float(np.median([o.e2e_s for o in report.requests if not o.dropped]))


def _fitted(seed: int = 1) -> OutputLengthEstimator:
    return OutputLengthEstimator().fit(_requests(np.random.default_rng(seed), 400))


def test_sjf_beats_fifo_on_median_latency_and_the_oracle_is_at_least_as_good() -> None:
    reqs = _requests(np.random.default_rng(7), 120)
    fifo, _ = _run(None, reqs)
    sjf, _ = _run(make_queue_policy("sjf"), reqs, estimator=_fitted())
    oracle, _ = _run(make_queue_policy("oracle-remaining"), reqs)
    assert len([o for o in sjf.requests if not o.dropped]) == len(reqs)
    assert _median_e2e_s(sjf) < 0.7 * _median_e2e_s(fifo)
    assert _median_e2e_s(oracle) <= _median_e2e_s(sjf) * 1.001
    # SJF pays with the long requests' wait: starvation is what max_wait_s_long shows (all 120
    # arrive within 0.12 s, far inside sjf's 30 s bound: here it orders as plain SJF)
    assert sjf.max_wait_s_long > fifo.max_wait_s_long
    assert fifo.max_wait_s_long <= fifo.max_wait_s


def test_an_explicit_fifo_policy_and_an_estimator_leave_fifo_outcomes_unchanged() -> None:
    reqs = _requests(np.random.default_rng(8), 60)
    plain, _ = _run(None, reqs)
    explicit, sim = _run(make_queue_policy("fifo"), reqs, estimator=_fitted())
    assert plain.requests == explicit.requests
    assert sim.estimator is not None and sim.estimator.num_observed == len(reqs)  # type: ignore[attr-defined]


def test_the_estimator_calibrates_online_from_completions_during_a_run() -> None:
    est = _fitted()
    probe = RequestSpec("p", "t", "tiny", 0.0, 1000, 1)
    before = est.estimate(probe)
    # the same tenant now answers long prompts with 4x more tokens
    shifted = [RequestSpec(r.request_id, r.tenant_id, r.model, r.arrival_s, r.prompt_tokens,
                           r.output_tokens * (4 if r.prompt_tokens >= 800 else 1))
               for r in _requests(np.random.default_rng(9), 80)]
    _run(make_queue_policy("sjf"), shifted, estimator=est)
    assert est.num_observed == len(shifted)
    assert 2.5 * before < est.estimate(probe) < 5.5 * before


def test_weighted_fair_share_splits_served_tokens_by_weight() -> None:
    reqs = _requests(np.random.default_rng(10), 300, tenants=("a", "b"), gap_s=1e-4)
    _, sim = _run(make_queue_policy("weighted"), reqs, max_num_seqs=2,
                  tenant_weight={"a": 1.0, "b": 3.0})
    # stop while both tenants are still backlogged and compare their shares
    sim2 = SimulatedCluster(_spec(), [ReplicaSpec("r", "tiny", ("h/gpu0",), max_num_seqs=2)], RooflineLike(),
                            rng=np.random.default_rng(0), queue_policy=make_queue_policy("weighted"),
                            tenant_weight={"a": 1.0, "b": 3.0})
    sim2.submit(reqs)
    sim2.run(until=sim.now_s * 0.3)
    served = sim2.served_tokens
    assert served["b"] / served["a"] == pytest.approx(3.0, rel=0.15)
    total = sum(r.prompt_tokens + r.output_tokens for r in reqs)
    assert sum(sim.served_tokens.values()) == total  # every token counted once by the end


def test_priority_tenants_wait_less_and_aging_bounds_the_low_priority_wait() -> None:
    reqs = _requests(np.random.default_rng(11), 150, tenants=("hi", "lo"))
    prio = {"hi": 1, "lo": 0}

    def mean_wait(report: SimReport, tenant: str) -> float:
        return float(np.mean([o.admitted_s - o.arrival_s for o in report.requests if o.tenant_id == tenant]))

    by_priority, _ = _run(make_queue_policy("priority"), reqs, tenant_priority=prio)
    assert mean_wait(by_priority, "hi") < 0.5 * mean_wait(by_priority, "lo")
    aged, _ = _run(make_queue_policy("aging", aging_s=1e-3), reqs, tenant_priority=prio)
    worst = max(o.admitted_s - o.arrival_s for o in by_priority.requests if o.tenant_id == "lo")
    assert max(o.admitted_s - o.arrival_s for o in aged.requests if o.tenant_id == "lo") < worst


def test_a_request_priority_of_its_own_wins_over_its_tenants_and_slack_serves_tight_deadlines_first() -> None:
    from dataclasses import replace

    from service.sim.sla import SLA_CLASSES

    base = _requests(np.random.default_rng(13), 150)

    def mean_wait(report: SimReport, ids: set[str]) -> float:
        return float(np.mean([o.admitted_s - o.arrival_s for o in report.requests if o.request_id in ids]))

    # one tenant (priority 0); every third request asks for priority 1 itself (x-priority live)
    marked = {r.request_id for r in base[::3]}
    reqs = [replace(r, priority=1) if r.request_id in marked else r for r in base]
    by_priority, _ = _run(make_queue_policy("priority"), reqs, tenant_priority={"t": 0})
    assert mean_wait(by_priority, marked) < 0.5 * mean_wait(by_priority, {r.request_id for r in base} - marked)

    # the same third with a tight SLA of its own: slack (deadline minus remaining work) serves it first
    tight = SLA_CLASSES["standard"].with_targets(0.2, 0.01)
    reqs = [replace(r, sla_class=tight.name) if r.request_id in marked else r for r in base]
    classes = {**SLA_CLASSES, tight.name: tight}

    class Exact:
        def estimate(self, req: RequestSpec) -> int:
            return req.output_tokens

        def observe(self, req: RequestSpec, true_output_tokens: int) -> None:
            pass

    slack, _ = _run(make_queue_policy("slack", token_s=0.001), reqs, estimator=Exact(), sla_classes=classes)
    fifo, _ = _run(None, reqs, sla_classes=classes)
    assert mean_wait(slack, marked) < 0.5 * mean_wait(fifo, marked)


def test_a_policy_that_reads_estimates_needs_an_estimator() -> None:
    with pytest.raises(InvalidInputError, match="estimator"):
        _run(make_queue_policy("sjf"), [])


def test_a_fork_keeps_the_queue_order_and_does_not_calibrate_the_real_estimator() -> None:
    est = _fitted()
    reqs = _requests(np.random.default_rng(12), 40)
    sim = SimulatedCluster(_spec(), [ReplicaSpec("r", "tiny", ("h/gpu0",), max_num_seqs=2)], RooflineLike(),
                           rng=np.random.default_rng(0), queue_policy=make_queue_policy("sjf"), estimator=est)
    sim.submit(reqs)
    sim.run(until=reqs[-1].arrival_s)
    observed = est.num_observed
    fork = sim.fork(["h/gpu0"])
    fork.run()
    assert est.num_observed == observed
    sim.run()
    assert {o.request_id: o.finish_s for o in fork.report().requests} == {
        o.request_id: o.finish_s for o in sim.report().requests if o.finish_s > reqs[-1].arrival_s}

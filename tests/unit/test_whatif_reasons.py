"""What-if verdicts and scores: every what-if a step runs is kept with a structured reason
(accepted, beaten by which plan, unsafe for which tenant by how many, memory, no fit, no
gain), the ``slice`` policy's sustained-lateness score prefers the plan that leaves less
lateness behind the horizon, the replay report counts the reasons, and the what-if measures
the lateness still to come."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from service.core.placement import best_by_what_if, describe, late_then_tokens, sustained_then_tokens
from service.core.scheduler import VERDICTS, Decision, ReplicaChange, WhatIfOutcome
from service.domain.cluster import ClusterSpec
from service.domain.request import RequestSpec
from service.replay.report import WhatIfLog
from service.sim.analytic import RooflineLike
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.whatif import WhatIf, pending_lateness

BASE = WhatIfOutcome(20.0, 1000, {"a": 4, "b": 1}, 0, {}, {"a": 2.5})


def _outcome(tokens: int, late: dict[str, int], *, memory: int = 0, pending: dict[str, float] | None = None
             ) -> WhatIfOutcome:
    return WhatIfOutcome(20.0, tokens, late, memory, {}, pending or {})


def _change(i: int, *, sliced: bool = False) -> ReplicaChange:
    device = f"node0/gpu{i}"
    return ReplicaChange("a/llama2-7b", "llama2-7b", (device,), ((device, 0, 31),) if sliced else ())


class _ScriptedView:
    """A cluster view whose what-ifs answer from a script, in order."""

    def __init__(self, outcomes: Sequence[WhatIfOutcome | None]) -> None:
        self.outcomes = list(outcomes)
        self.asked = 0

    def what_if(self, change: ReplicaChange, horizon_s: float) -> tuple[WhatIfOutcome, WhatIfOutcome | None]:
        self.asked += 1
        return BASE, self.outcomes.pop(0)


def _judge(outcomes: Sequence[WhatIfOutcome | None], *, score: Callable[..., tuple[float, float]] = late_then_tokens,
           out_of_time: Callable[[], bool] | None = None) -> tuple[Decision, _ScriptedView]:
    view = _ScriptedView(outcomes)
    decision = Decision()
    best = best_by_what_if(view, [_change(i) for i in range(len(outcomes))], 20.0, decision,  # type: ignore[arg-type]
                           score=score, out_of_time=out_of_time)
    if best is not None:
        decision.add.append(best.change)
    return decision, view


def test_every_what_if_is_kept_with_a_structured_reason() -> None:
    decision, _ = _judge([
        None,                                           # no fit
        _outcome(1500, {"a": 4, "b": 1}, memory=1),     # memory at risk
        _outcome(1500, {"a": 2, "b": 3}),               # b predicted worse by 2
        _outcome(900, {"a": 4, "b": 1}),                # safe, no good done
        _outcome(1100, {"a": 3, "b": 1}),               # one spared: beaten by the next
        _outcome(1050, {"a": 2, "b": 1}),               # two spared: accepted
    ])
    reasons = [r.reason for r in decision.whatifs]
    assert all(r is not None for r in reasons)
    assert [r.verdict for r in reasons if r is not None] == \
        ["no_fit", "memory", "tenant_worse", "no_gain", "beaten", "accepted"]
    assert decision.num_whatifs == 6 and decision.add == [_change(5)]
    worse = decision.whatifs[2].reason
    assert worse is not None and (worse.tenant, worse.late_delta) == ("b", 2)
    beaten = decision.whatifs[4].reason
    assert beaten is not None and beaten.beaten_by == describe(_change(5))
    assert (beaten.late_before, beaten.late_after, beaten.tokens_gain) == (5, 4, 100)
    assert beaten.as_dict()["beaten_by"] == describe(_change(5)) and "tenant" not in beaten.as_dict()
    assert decision.whatifs[2].reason is not None and decision.whatifs[2].reason.as_dict()["late_delta"] == 2


def test_no_good_change_leaves_every_safe_one_without_gain() -> None:
    decision, _ = _judge([_outcome(1000, {"a": 4, "b": 1}), _outcome(990, {"a": 4, "b": 1})])
    assert not decision.add
    assert [r.reason.verdict for r in decision.whatifs if r.reason is not None] == ["no_gain", "no_gain"]


def test_sustained_lateness_prefers_the_plan_that_leaves_a_shorter_queue_behind_the_horizon() -> None:
    """The measured case: two plans spare as many late requests within the horizon; the one
    with more tokens (a whole guest, decoding faster) leaves more lateness behind it. Replica's
    score takes the tokens, the slice policy's the shorter queue."""
    guest = _outcome(1021, {"a": 2, "b": 1}, pending={"a": 3.0})  # +21 tokens, queue left behind
    sliced = _outcome(1011, {"a": 2, "b": 1}, pending={"a": 1.2})  # +11 tokens, queue drained
    by_tokens, _ = _judge([guest, sliced], score=late_then_tokens)
    by_lateness, _ = _judge([guest, sliced], score=sustained_then_tokens)
    assert by_tokens.add == [_change(0)]
    assert by_lateness.add == [_change(1)]
    spared, gain = sustained_then_tokens(BASE, sliced)
    assert spared == pytest.approx(2 + 2.5 - 1.2) and gain == 11.0
    # A plan that spares no late request within the horizon but leaves less behind does good.
    drains, _ = _judge([_outcome(990, {"a": 4, "b": 1}, pending={"a": 1.0})], score=sustained_then_tokens)
    assert drains.add == [_change(0)]


def test_a_plan_that_gains_tokens_by_pushing_lateness_past_the_horizon_does_no_good() -> None:
    later = _outcome(1200, {"a": 4, "b": 1}, pending={"a": 3.5})
    decision, _ = _judge([later], score=sustained_then_tokens)
    assert not decision.add and decision.whatifs[0].reason is not None
    assert decision.whatifs[0].reason.verdict == "no_gain"
    assert decision.whatifs[0].reason.lateness_gain == pytest.approx(-1.0)


def test_out_of_time_stops_judging_and_counts_the_plans_left() -> None:
    readings = iter([False, True])
    decision, view = _judge([_outcome(1100, {"a": 4, "b": 1})] * 4, out_of_time=lambda: next(readings))
    assert view.asked == 2 and decision.num_whatifs == 2 and decision.whatifs_skipped == 2
    # the first what-if always runs, however late the step
    decision, view = _judge([_outcome(1100, {"a": 4, "b": 1})] * 2, out_of_time=lambda: True)
    assert view.asked == 1 and decision.whatifs_skipped == 1 and decision.add == [_change(0)]


def test_the_report_counts_every_verdict_and_keeps_a_capped_list() -> None:
    decision, _ = _judge([None, _outcome(1500, {"a": 2, "b": 3}), _outcome(1100, {"a": 3, "b": 1})])
    log = WhatIfLog(max_runs=4)
    log.add(5.0, decision)
    log.add(10.0, decision)
    summary = log.summary()
    assert set(summary["by_verdict"]) == set(VERDICTS)
    assert summary["by_verdict"]["no_fit"] == summary["by_verdict"]["tenant_worse"] == 2
    assert summary["by_verdict"]["accepted"] == 2 and summary["num_runs"] == 6
    assert summary["runs_kept"] == len(summary["runs"]) == 4
    first = summary["runs"][1]
    assert first["t_s"] == 5.0 and first["verdict"] == "tenant_worse" and first["tenant"] == "b"
    assert first["plan"] == describe(_change(1)) and first["model"] == "a/llama2-7b"


def test_pending_lateness_weights_each_waiting_request_by_the_allowance_it_used() -> None:
    """One batch slot, a long request holding it: the queued interactive requests (1 s TTFT)
    count the share of their allowance used at the horizon, and none once they are late."""
    spec = ClusterSpec.from_dict({"name": "t", "hosts": [{"host_id": "h", "devices": {"kind": "A100-80GB", "count": 1}}]})
    sim = SimulatedCluster(spec, [ReplicaSpec("r0", "gpt2-small", ("h/gpu0",), max_num_seqs=1, tenant_id="t0")],
                           RooflineLike(), rng=np.random.default_rng(0))
    reqs = [RequestSpec("long", "t0", "gpt2-small", 0.0, 64, 4000, "interactive")]
    reqs += [RequestSpec(f"q{i}", "t0", "gpt2-small", 0.1 * (i + 1), 16, 4, "interactive") for i in range(3)]
    sim.submit(reqs)
    sim.run(until=0.5)
    ttft = sim.sla_classes["interactive"].ttft_target_s(16)
    e2e = sim.sla_classes["interactive"].e2e_s
    # q0..q2 waited 0.4, 0.3, 0.2 s of their TTFT allowance; the long one decodes (e2e allowance)
    expected = sum((0.5 - 0.1 * (i + 1)) / ttft for i in range(3)) + 0.5 / e2e
    assert pending_lateness(sim, 0.5) == {"t0": pytest.approx(expected)}
    assert pending_lateness(sim, ttft + 0.5)["t0"] == pytest.approx((ttft + 0.5) / e2e)  # the queued ones are late
    baseline, _ = WhatIf(sim).replica_change(ReplicaSpec("g", "gpt2-small", ("h/gpu0",), tenant_id="t0"), 0.2)
    assert baseline.pending_lateness_by_tenant["t0"] > 0.0
    assert baseline.sustained_lateness == baseline.late + baseline.pending_lateness_by_tenant["t0"]

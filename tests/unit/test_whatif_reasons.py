"""What-if verdicts and scores: every what-if a step runs is kept with a structured reason
(accepted, beaten by which plan, unsafe for which tenant by how many, memory, no fit, no
gain), the ``slice`` policy's sustained-lateness score prefers the plan that leaves less
lateness behind the horizon, the replay report counts the reasons, and the what-if counts the
requests it leaves behind that end late."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from service.core.placement import best_by_what_if, describe, late_then_tokens, sustained_then_tokens
from service.core.scheduler import VERDICTS, Decision, ReplicaChange, WhatIfOutcome
from service.domain.cluster import ClusterSpec
from service.domain.request import RequestSpec
from service.replay.report import WhatIfLog
from service.sim.analytic import RooflineLike
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.whatif import WhatIf

BASE = WhatIfOutcome(20.0, 1000, {"a": 4, "b": 1}, 0, {}, {"a": 3})


def _outcome(tokens: int, late: dict[str, int], *, memory: int = 0, after: dict[str, int] | None = None
             ) -> WhatIfOutcome:
    return WhatIfOutcome(20.0, tokens, late, memory, {}, after or {})


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


def test_sustained_lateness_prefers_the_plan_that_leaves_less_lateness_behind_the_horizon() -> None:
    """The measured cases: two plans spare as many late requests within the horizon, and the
    one with more tokens (a whole guest, decoding faster) leaves more requests that end late
    after it; a plan that spares one within the horizon and leaves two late after it, against
    one that spares none within it and leaves none after. Replica's score takes the tokens and
    the horizon's count, the slice policy's what is left behind."""
    guest = _outcome(1021, {"a": 2, "b": 1}, after={"a": 3})  # +21 tokens, a queue left behind
    sliced = _outcome(1011, {"a": 2, "b": 1}, after={"a": 1})  # +11 tokens, the queue drained
    by_tokens, _ = _judge([guest, sliced], score=late_then_tokens)
    by_lateness, _ = _judge([guest, sliced], score=sustained_then_tokens)
    assert by_tokens.add == [_change(0)]
    assert by_lateness.add == [_change(1)]
    assert sustained_then_tokens(BASE, sliced) == (2.0 + 3 - 1, 11.0)
    spares_now = _outcome(900, {"a": 3, "b": 1}, after={"a": 5})  # 9 in all
    spares_all = _outcome(900, {"a": 4, "b": 1}, after={"a": 1})  # 6 in all
    assert _judge([spares_now, spares_all], score=late_then_tokens)[0].add == [_change(0)]
    decision, _ = _judge([spares_now, spares_all], score=sustained_then_tokens)
    assert decision.add == [_change(1)]
    assert [r.reason.verdict for r in decision.whatifs if r.reason is not None] == ["no_gain", "accepted"]


def test_a_plan_that_gains_tokens_by_pushing_lateness_past_the_horizon_does_no_good() -> None:
    later = _outcome(1200, {"a": 4, "b": 1}, after={"a": 4})
    decision, _ = _judge([later], score=sustained_then_tokens)
    assert not decision.add and decision.whatifs[0].reason is not None
    assert decision.whatifs[0].reason.verdict == "no_gain"
    assert decision.whatifs[0].reason.lateness_gain == -1


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


def test_the_what_if_counts_the_requests_it_leaves_behind_that_end_late() -> None:
    """One batch slot, a long request holding it, interactive requests (1 s TTFT) queued behind
    it: at a 0.3 s horizon none is late yet, but run on without arrivals the queued ones end
    late; without ``drain_s`` nothing is counted, and the horizon's figures do not change."""
    spec = ClusterSpec.from_dict({"name": "t", "hosts": [{"host_id": "h", "devices": {"kind": "A100-80GB", "count": 2},
                                                         "intra_link": {"gbps": 800, "latency_us": 2}}]})
    sim = SimulatedCluster(spec, [ReplicaSpec("r0", "gpt2-small", ("h/gpu0",), max_num_seqs=1, tenant_id="t0")],
                           RooflineLike(), rng=np.random.default_rng(0))
    reqs = [RequestSpec("long", "t0", "gpt2-small", 0.0, 64, 4000, "interactive")]
    reqs += [RequestSpec(f"q{i}", "t0", "gpt2-small", 0.05 * (i + 1), 16, 4, "interactive") for i in range(3)]
    sim.submit(reqs)
    sim.run(until=0.2)
    guest = ReplicaSpec("g", "gpt2-small", ("h/gpu1",), max_num_seqs=1, tenant_id="t0")
    plain, _ = WhatIf(sim).replica_change(guest, 0.3)
    base, changed = WhatIf(sim).replica_change(guest, 0.3, drain_s=30.0)
    assert plain.late_after_horizon_by_tenant == {} and plain.late == base.late == 0
    assert (plain.output_tokens, plain.violations_by_tenant) == (base.output_tokens, base.violations_by_tenant)
    # the three queued behind the long one, and the forecast's repeats of them, end late
    assert set(base.late_after_horizon_by_tenant) == {"t0"} and base.late_after_horizon_by_tenant["t0"] >= 3
    assert base.sustained_lateness == base.late_after_horizon_by_tenant["t0"]
    assert changed is not None and changed.sustained_lateness < base.sustained_lateness  # the guest takes them

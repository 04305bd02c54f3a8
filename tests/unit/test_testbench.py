"""The testbench's pieces without a live stack: the workload every policy gets (identical for a
seed, its headers and targets named as the live service names them), the prediction (the same
requests, deterministic), the figures of a run and the report's comparison."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from service.core.queue import QueuedRequest, make_queue_policy
from service.domain.error import InvalidInputError
from service.harness.testbench.command import POLICIES, BenchOptions, policy_params
from service.harness.testbench.metrics import Outcome, RunMetrics, run_metrics
from service.harness.testbench.predict import ControlPlane, overheads, predict, predict_control_plane
from service.harness.testbench.report import assemble, kendall_tau, plot_cdfs, plot_metrics, plot_ratios, rank
from service.harness.testbench.workload import BenchWorkload, WorkloadShape, bench_workload

SHAPE = WorkloadShape(rate_rps=8.0, duration_s=5.0)
DEVICES = (("bench-exec/cpu:0", "bench-exec", "cpu", 2 << 30),)


def test_the_workload_is_the_same_for_a_seed_and_every_request_is_what_the_policies_order_by() -> None:
    a, b = bench_workload(SHAPE, 3), bench_workload(SHAPE, 3)
    assert a.requests == b.requests and a.digest() == b.digest()
    assert bench_workload(SHAPE, 4).digest() != a.digest()
    arrivals = [r.spec.arrival_s for r in a.requests]
    assert arrivals == sorted(arrivals) and len(a.requests) > 10
    assert all(len(r.prompt) == r.spec.prompt_tokens and all(1 <= t < 256 for t in r.prompt) for r in a.requests)
    assert {r.priority for r in a.requests} == {0, 1}
    own = [r for r in a.requests if r.slo_ttft_s is not None]
    assert own and len(own) < len(a.requests)
    # a request's own targets are named as the live service names them (LiveRequest.sla)
    from service.sim.sla import SLA_CLASSES

    r = own[0]
    assert r.spec.sla_class == SLA_CLASSES["standard"].with_targets(r.slo_ttft_s, r.slo_tpot_s).name
    assert r.spec.sla_class in a.sla_classes()
    assert r.headers() == {"x-priority": str(r.priority), "x-slo-ttft-ms": "1000", "x-slo-tpot-ms": "100"}
    assert a.summary()["requests"] == len(a.requests)


def test_offering_a_rate_stretches_arrivals_and_keeps_the_requests() -> None:
    w = bench_workload(SHAPE, 0)
    at = w.offered_at(50.0)
    assert at.output_tokens / at.shape.duration_s == pytest.approx(50.0)
    assert [r.prompt for r in at.requests] == [r.prompt for r in w.requests]
    factor = at.requests[-1].spec.arrival_s / w.requests[-1].spec.arrival_s
    assert factor == pytest.approx(w.output_tokens / w.shape.duration_s / 50.0)
    assert at.digest() != w.digest() and at.offered_at(50.0).digest() == at.digest()


def test_the_prediction_replays_every_request_once_and_is_deterministic() -> None:
    from service.sim.analytic import RooflineLike

    w = bench_workload(SHAPE, 1)
    for name in POLICIES:
        policy = make_queue_policy(name, **policy_params(name, 0.02))
        one = predict(w, policy, devices=DEVICES, cost_model=RooflineLike(), max_batch=4, iteration_s=0.01)
        assert one == predict(w, policy, devices=DEVICES, cost_model=RooflineLike(), max_batch=4, iteration_s=0.01)
        assert [o.index for o in one] == list(range(len(w.requests)))
        assert [o.output_tokens for o in one] == [r.spec.output_tokens for r in w.requests]
    assert overheads(iteration_s=0.005, tokens_per_s=400.0, max_batch=8) == {"mirror": 0.005, "calibrated": 0.02}


def _spaced(w: BenchWorkload, gap_s: float) -> BenchWorkload:
    """``w``'s requests, ``gap_s`` apart."""
    return replace(w, requests=tuple(replace(r, spec=replace(r.spec, arrival_s=i * gap_s))
                                     for i, r in enumerate(w.requests)))


def test_the_control_plane_delays_a_lone_request_by_its_dispatch_and_nothing_else() -> None:
    from service.sim.analytic import RooflineLike

    w = _spaced(bench_workload(SHAPE, 2), 5.0)  # each request alone on the replica
    fifo = make_queue_policy("fifo")
    kw: dict[str, Any] = {"devices": DEVICES, "cost_model": RooflineLike(), "max_batch": 4, "iteration_s": 0.01}
    plain = predict(w, fifo, **kw)
    cp = predict_control_plane(w, fifo, **kw, control=ControlPlane(dispatch_s=0.05, release_s=0.03))
    assert [o.index for o in cp] == list(range(len(w.requests)))
    for a, b in zip(plain, cp, strict=True):
        assert b.arrival_s == pytest.approx(a.arrival_s)
        assert b.ttft_s == pytest.approx(a.ttft_s + 0.05) and b.e2e_s == pytest.approx(a.e2e_s + 0.05)
        assert b.queued_s == pytest.approx(a.queued_s + 0.05) and b.output_tokens == a.output_tokens


def test_a_lease_holds_its_slot_until_its_release_and_the_service_queue_keeps_the_policys_order() -> None:
    from service.sim.analytic import RooflineLike

    w = _spaced(bench_workload(SHAPE, 3), 0.0)  # everything at once, one KV slot
    n = len(w.requests)
    kw: dict[str, Any] = {"devices": DEVICES, "cost_model": RooflineLike(), "max_batch": 1, "iteration_s": 0.01}
    dispatch, release = 0.02, 0.05
    for name in ("fifo", "sjf"):
        policy = make_queue_policy(name, **policy_params(name, 0.02))
        alone = predict_control_plane(w, policy, **kw, control=ControlPlane(0.0, 0.0))
        held = predict_control_plane(w, policy, **kw, control=ControlPlane(dispatch, release))
        assert held == predict_control_plane(w, policy, **kw, control=ControlPlane(dispatch, release))  # deterministic
        order = sorted(range(n), key=lambda i: held[i].queued_s)
        assert order == sorted(range(n), key=lambda i: alone[i].queued_s)  # the policy's order, either way
        # one slot: each request joins a dispatch after the lease before it was released
        for prev, nxt in itertools.pairwise(order):
            assert held[nxt].queued_s == pytest.approx(held[prev].e2e_s + release + dispatch, abs=1e-6)
        # its own service time is what the replica alone would take (the batch holds one request)
        for i in range(n):
            assert held[i].e2e_s - held[i].queued_s == pytest.approx(alone[i].e2e_s - alone[i].queued_s, abs=1e-6)
    # all arrive at once, so the grants follow the policy's keys exactly
    sjf = make_queue_policy("sjf")
    got = predict_control_plane(w, sjf, **kw, control=ControlPlane(dispatch, release))
    keys = {i: sjf.key(QueuedRequest(r.spec.request_id, r.spec.tenant_id, r.spec.model, 0.0, r.spec.prompt_tokens,
                                     r.spec.output_tokens)) for i, r in enumerate(w.requests)}
    assert sorted(range(n), key=lambda i: got[i].queued_s) == sorted(range(n), key=lambda i: (keys[i], i))
    with pytest.raises(InvalidInputError):
        ControlPlane(-0.1, 0.0)


def test_a_running_executor_takes_new_leases_only_on_its_polls() -> None:
    from service.sim.analytic import RooflineLike

    w = bench_workload(SHAPE, 2)
    long_first = max(range(len(w.requests)), key=lambda i: w.requests[i].spec.output_tokens)
    pair = (w.requests[long_first], w.requests[(long_first + 1) % len(w.requests)])
    w = replace(w, requests=tuple(replace(r, spec=replace(r.spec, arrival_s=t)) for r, t in zip(pair, (0.0, 0.001),
                                                                                                strict=True)))
    kw: dict[str, Any] = {"devices": DEVICES, "cost_model": RooflineLike(), "max_batch": 4, "iteration_s": 0.01}
    assert w.requests[0].spec.output_tokens * 0.01 > 0.1  # the first still runs at the first poll
    fifo = make_queue_policy("fifo")
    at_once = predict_control_plane(w, fifo, **kw, control=ControlPlane(0.02, 0.03))
    polled = predict_control_plane(w, fifo, **kw, control=ControlPlane(0.02, 0.03, poll_s=0.05))
    assert polled[0].queued_s == at_once[0].queued_s == 0.02  # the idle executor's long poll took the first at once
    # the second came while the first ran: it waits for the poll 50 ms after the long poll's answer
    second_joined_at_once = 0.001 + 0.02
    second_joined_polled = 0.05 + 0.02
    waited = polled[1].queued_s - at_once[1].queued_s
    assert 0.0 < waited <= second_joined_polled - second_joined_at_once + 0.01 + 1e-9  # plus at most one iteration
    with pytest.raises(InvalidInputError):
        ControlPlane(0.0, 0.0, poll_s=-1.0)


def test_a_runs_figures() -> None:
    outcomes = [Outcome(i, float(i), 0.1 * (i + 1), 1.0 + i, 10) for i in range(5)]
    m = run_metrics(outcomes)
    assert m.requests == 5 and m.output_tokens == 50
    assert m.makespan_s == pytest.approx(4.0 + 5.0)  # first arrival 0, last end 4 + 5
    assert m.tokens_per_s == pytest.approx(50 / 9.0)
    assert m.ttft_p50_s == pytest.approx(0.3) and m.e2e_p50_s == pytest.approx(3.0)
    assert m.e2e_p99_s == pytest.approx(4.96)
    with pytest.raises(InvalidInputError):
        run_metrics([])


def test_ranks_and_kendall_tau() -> None:
    assert rank({"a": 3.0, "b": 1.0, "c": 2.0}, higher_is_better=False) == ["b", "c", "a"]
    assert rank({"a": 3.0, "b": 1.0, "c": math.nan}, higher_is_better=True) == ["a", "b", "c"]
    assert kendall_tau(["a", "b", "c"], ["a", "b", "c"]) == 1.0
    assert kendall_tau(["a", "b", "c"], ["c", "b", "a"]) == -1.0
    assert kendall_tau(["a", "b", "c"], ["b", "a", "c"]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        kendall_tau(["a"], ["b"])


def _metrics(tps: float, e2e: float, tokens: int = 100) -> RunMetrics:
    return RunMetrics(10, tokens, tokens / tps, tps, e2e / 4, e2e, e2e / 2, e2e * 2)


@pytest.mark.slow
def test_the_report_compares_each_prediction_with_the_measured_repeats(tmp_path: Path) -> None:
    measured = {"fifo": [_metrics(100.0, 2.0), _metrics(110.0, 2.4), _metrics(90.0, 2.2)],
                "sjf": [_metrics(100.0, 1.0), _metrics(104.0, 1.2), _metrics(98.0, 1.1)],
                "weighted": [_metrics(101.0, 2.1), _metrics(99.0, 2.3), _metrics(100.0, 2.2)]}
    predictions = {"mirror": {"fifo": _metrics(200.0, 1.0), "sjf": _metrics(200.0, 0.4),
                              "weighted": _metrics(200.0, 1.0)},
                   "calibrated": {"fifo": _metrics(100.0, 2.2), "sjf": _metrics(100.0, 1.3),
                                  "weighted": _metrics(100.0, 2.2)}}
    r = assemble(measured, predictions, headline="calibrated")
    assert r["headline"] == {"prediction": "calibrated", "metric": "e2e_p50_s"}
    assert r["prediction_ratio"] == pytest.approx({"fifo": 1.1 / 1.1, "sjf": 0.65 / 0.55, "weighted": 1.1 / 1.1})
    assert r["prediction_ratio_within_target"]
    assert r["prediction_ratio_by_metric"]["sjf"]["tokens_per_s"] == pytest.approx(100.0 / 100.0)
    assert r["kendall_tau"] == r["rank"]["calibrated"]["e2e_p50_s"]["kendall_tau"]
    assert r["kendall_tau_by_metric"]["ttft_p99_s"] == 1.0
    assert any(n.startswith("headline (calibrated): e2e_p50_s") for n in r["notes"])
    assert assemble(measured, predictions)["headline"]["prediction"] == "calibrated"  # the last by default
    assert not assemble(measured, predictions, headline="mirror")["prediction_ratio_within_target"]
    with pytest.raises(ValueError):
        assemble(measured, predictions, headline="nope")
    fifo = r["per_policy"]["fifo"]
    assert fifo["measured"]["tokens_per_s"] == {"median": 100.0, "min": 90.0, "max": 110.0,
                                                "runs": [100.0, 110.0, 90.0]}
    assert fifo["repeat_spread"]["tokens_per_s"] == pytest.approx(0.2)
    assert fifo["predicted"]["mirror"]["tokens_per_s"] == 200.0
    assert fifo["ratio_predicted_over_measured"]["mirror"]["tokens_per_s"] == pytest.approx(2.0)
    assert fifo["ratio_predicted_over_measured"]["calibrated"]["e2e_p50_s"] == pytest.approx(1.1 / 1.1)
    assert fifo["within_repeat_range"]["calibrated"]["ttft_p99_s"] and not fifo["within_repeat_range"]["mirror"][
        "ttft_p99_s"]
    assert r["rank"]["measured"]["ttft_p99_s"] == ["sjf", "fifo", "weighted"]
    assert r["rank"]["calibrated"]["ttft_p99_s"]["order"] == ["sjf", "fifo", "weighted"]  # ties by name
    assert r["rank"]["calibrated"]["ttft_p99_s"]["kendall_tau"] == 1.0
    assert r["rank"]["mirror"]["ttft_p99_s"]["same_best"]
    assert r["ratio_range"]["mirror"]["ttft_p99_s"]["min_policy"] == "sjf"
    assert r["reproducibility"]["output_tokens_identical"]
    assert any("weighted orders like fifo" in n for n in r["notes"])
    assert any(n.startswith("mirror: rank order by") for n in r["notes"])
    r = assemble({**measured, "fifo": [*measured["fifo"][:2], _metrics(90.0, 2.2, tokens=99)]}, predictions)
    assert not r["reproducibility"]["output_tokens_identical"]
    # the plots draw from the report as it is
    plot_metrics(tmp_path / "m.png", r, "t")
    plot_ratios(tmp_path / "r.png", r)
    runs = {p: [[Outcome(0, 0.0, 0.1, 1.0, 5), Outcome(1, 0.5, 0.2, 2.0, 5)]] for p in measured}
    plot_cdfs(tmp_path / "c.png", runs, {"mirror": {p: v[0] for p, v in runs.items()}})
    assert all((tmp_path / f).stat().st_size > 1000 for f in ("m.png", "r.png", "c.png"))


def test_options_refuse_unknown_policies_and_models() -> None:
    assert BenchOptions.quick().repeats == 2 and set(BenchOptions().policies) == set(POLICIES)
    with pytest.raises(InvalidInputError, match="policies"):
        BenchOptions(policies=("fifo", "lifo"))
    with pytest.raises(InvalidInputError, match="policies"):
        BenchOptions(policies=("fifo", "fifo"))
    with pytest.raises(InvalidInputError, match="llama2-7b"):
        BenchOptions(shape=WorkloadShape(model="llama2-7b"))
    assert policy_params("slack", 0.02) == {"token_s": 0.02} and policy_params("sjf", 0.02) == {}


def test_the_command_line_quick_preset_and_overrides() -> None:
    from service.cli.main import build_parser
    from service.harness.testbench.command import options_from

    quick = options_from(build_parser().parse_args(["testbench", "--quick"]))
    assert quick.repeats == 2 and quick.shape.duration_s == 10.0 and quick.policies == POLICIES
    opts = options_from(build_parser().parse_args(
        ["testbench", "--policies", "fifo, slack", "--repeats", "4", "--duration-s", "20", "--rate-rps", "3",
         "--max-batch", "4", "--seed", "7"]))
    assert opts.policies == ("fifo", "slack") and opts.repeats == 4 and opts.shape.duration_s == 20.0
    assert opts.rate_rps == 3.0 and opts.max_batch == 4 and opts.seed == 7

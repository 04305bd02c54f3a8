"""Workflows in the simulator: a step runs only after its inputs; routers, the slack policy and
scalers decide deterministically for a seed; the learned predictor's quantiles are monotone and
it trains, saves, loads and refits online; the benchmark's quick path is wired."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from learned.records import read_records, write_records
from service.core.queue import QueuedRequest, SlackPolicy
from service.core.tail import QUANTILES, CallFeatures, NaivePredictor, ToolFeatures, mean_of
from service.domain.cluster import ClusterSpec
from service.domain.workflow import Workflow
from service.replay.agentic import AgenticConfig, run_agentic
from service.sim.analytic import RooflineLike
from service.sim.tail_routing import ScaleAction, TailScaler
from service.sim.workflow import CallRecord, ToolRecord

SHAPES_DOC = {"workflow_id": "w0", "tenant_id": "coder", "slo_s": 60.0, "shape": "code-generation",
              "inputs": {"task": 300},
              "steps": [
                  {"step_id": "plan", "kind": "model", "role": "planner", "model": "tiny", "prompt_tokens": 20,
                   "inputs": ["task"], "output_tokens": 30},
                  {"step_id": "c0", "kind": "model", "role": "coder", "model": "tiny", "uses": ["plan"],
                   "output_tokens": 60},
                  {"step_id": "c1", "kind": "model", "role": "coder", "model": "tiny", "uses": ["plan"],
                   "output_tokens": 10},
                  {"step_id": "t0", "kind": "tool", "role": "code-exec", "tool": "python", "uses": ["c0"],
                   "duration_s": 0.5, "output_tokens": 5},
                  {"step_id": "review", "kind": "model", "role": "reviewer", "model": "tiny", "uses": ["t0", "c1"],
                   "output_tokens": 8}]}


def _spec(n: int = 4) -> ClusterSpec:
    return ClusterSpec.from_dict({"name": "t", "hosts": [{
        "host_id": "h", "devices": [{"device_id": f"h/gpu{i}", "kind": "A100-80GB"} for i in range(n)],
        "intra_link": {"gbps": 100.0, "latency_us": 5.0}}]})


def _config(seed: int = 0) -> AgenticConfig:
    from service.workload.workflows import ShapeConfig

    return AgenticConfig(_spec(), RooflineLike(), {"code-generation": ShapeConfig("coder", "tiny", 60.0)},  # type: ignore[arg-type]
                         seed=seed, interval_s=0.5)


def _workflows(n: int, gap_s: float) -> list[Workflow]:
    return [Workflow.from_dict({**SHAPES_DOC, "workflow_id": f"w{i}", "arrival_s": i * gap_s}) for i in range(n)]


def test_a_step_runs_only_after_its_inputs() -> None:
    r = run_agentic(_config(), _workflows(6, 0.05), router="round-robin", horizon_s=0.5)
    assert len(r.outcomes) == 6 and all(not math.isnan(o.finish_s) for o in r.outcomes)
    for o in r.outcomes:
        steps = {s.step_id: s for s in o.steps}
        uses = {s["step_id"]: s.get("uses", []) for s in SHAPES_DOC["steps"]}  # type: ignore[attr-defined]
        for sid, s in steps.items():
            assert s.finished_s >= s.released_s
            for u in uses[sid]:
                assert s.released_s >= steps[u].finished_s  # released no earlier than its inputs' end
            if uses[sid]:
                assert s.released_s == max(steps[u].finished_s for u in uses[sid])  # and at once
        assert steps["t0"].finished_s == pytest.approx(steps["t0"].released_s + 0.5)
        assert o.finish_s == max(s.finished_s for s in o.steps)
        assert steps["plan"].released_s == o.arrival_s


@pytest.mark.parametrize("router,queue", [("round-robin", "fifo"), ("least-loaded", "fifo"), ("mean", "fifo"),
                                          ("tail", "slack")])
def test_router_decisions_are_deterministic_for_a_seed(router: str, queue: str) -> None:
    runs = [run_agentic(_config(seed), _workflows(12, 0.02), router=router, queue=queue, predictor=NaivePredictor(),
                        horizon_s=0.3) for seed in (1, 1)]
    placed = [[(o.workflow_id, s.step_id, s.replica_id, s.finished_s) for o in r.outcomes for s in o.steps] for r in runs]
    assert placed[0] == placed[1]
    assert {s[2] for s in placed[0] if s[2]} - {""}  # calls ran on replicas


@pytest.mark.parametrize("scaler", ["reactive", "tail"])
def test_scaler_decisions_are_deterministic_and_use_free_devices(scaler: str) -> None:
    runs = [run_agentic(_config(3), _workflows(40, 0.01), router="tail", queue="slack", scaler=scaler,
                        predictor=NaivePredictor(), horizon_s=2.0) for _ in range(2)]
    replicas = [sorted({s.replica_id for o in r.outcomes for s in o.steps if s.replica_id}) for r in runs]
    assert replicas[0] == replicas[1]
    assert runs[0].summary() == runs[1].summary()
    assert runs[0].replica_s <= 4 * runs[0].cutoff_s


def test_tail_scaler_adds_where_the_predicted_tail_is_worst() -> None:
    config = _config()
    config.startup_s, config.interval_s = 0.0, 0.02
    r = run_agentic(config, _workflows(400, 0.0), router="tail", queue="fifo", scaler="tail",
                    predictor=NaivePredictor(), horizon_s=1.0)
    assert any("/+" in s.replica_id for o in r.outcomes for s in o.steps)  # a replica was added and served
    assert ScaleAction("add", "coder", "tiny").kind == "add"
    assert isinstance(TailScaler(NaivePredictor()).up, float)


def test_slack_policy_orders_by_latest_start_then_by_the_request_deadline() -> None:
    latest = {"a": 10.0, "b": 5.0}
    policy = SlackPolicy(latest_start=lambda q: latest.get(q.request_id))
    qa, qb, qc = (QueuedRequest(i, "t", "m", at, 10, 0) for i, at in (("a", 1.0), ("b", 2.0), ("c", 3.0)))
    # c is of no workflow and has no deadline of its own: after every request with one
    assert sorted([qa, qb, qc], key=policy.key) == [qb, qa, qc]
    assert SlackPolicy().key(qb) == (math.inf, 2.0)


def _records(n: int, seed: int = 0) -> tuple[list[CallRecord], list[ToolRecord]]:
    rng = np.random.default_rng(seed)
    calls, tools = [], []
    for _ in range(n):
        role = ["planner", "coder", "vlm"][int(rng.integers(3))]
        q = int(rng.integers(0, 20))
        prompt = int(rng.integers(50, 3000))
        out = max(1, int(rng.lognormal(math.log(50 if role == "vlm" else 200), 0.8)))
        lat = (0.02 * out + prompt * 1e-4) * (1 + q / 4) * float(rng.lognormal(0, 0.2))
        calls.append(CallRecord(CallFeatures(role, "m", 7.0, prompt, 1, 1, 5, 4.0, q, 8, 0.2, q * 500), out, lat))
        tool = ["python", "search"][int(rng.integers(2))]
        tools.append(ToolRecord(ToolFeatures(tool, prompt), float(rng.lognormal(0.4 if tool == "python" else -0.5, 0.6))))
    return calls, tools


@pytest.mark.slow
def test_learned_quantiles_are_monotone_calibrated_and_persist(tmp_path: Path) -> None:
    from learned.distributional import DistributionalPredictor, OnlinePredictor, calibration, fit

    calls, tools = _records(1500)
    pred = fit(calls, tools, seed=0, epochs=12)
    held_calls, held_tools = _records(600, seed=1)
    q = pred.call_quantiles([c.features for c in held_calls])
    assert q.shape == (600, 2, len(QUANTILES))
    assert np.all(np.diff(q, axis=-1) >= 0) and np.all(q > 0)
    tq = pred.tool_quantiles([t.features for t in held_tools])
    assert np.all(np.diff(tq, axis=-1) >= 0)
    rng = np.random.default_rng(5)  # arbitrary inputs, far from the data: still monotone
    odd = [CallFeatures("unseen", "m", 70.0, int(rng.integers(1, 10**6)), 9, 9, 99, 9.0, int(rng.integers(0, 10**4)),
                        300, 1.5, 10**7) for _ in range(50)]
    assert np.all(np.diff(pred.call_quantiles(odd), axis=-1) >= 0)
    cal = calibration(pred, held_calls, held_tools)
    assert 0.75 <= cal["latency_s"][QUANTILES.index(0.9)] <= 0.99
    assert cal["output_tokens"][QUANTILES.index(0.1)] < cal["output_tokens"][QUANTILES.index(0.99)]
    pred.save(tmp_path / "p")
    again = DistributionalPredictor.load(tmp_path / "p")
    assert np.allclose(again.call_quantiles([c.features for c in held_calls[:20]]), q[:20], rtol=1e-5)
    online = OnlinePredictor(pred, min_new=100, epochs=1)
    assert not online.refit()  # nothing new yet
    for c in held_calls[:200]:
        online.observe_call(c.features, c.output_tokens, c.latency_s)
    before = online.current
    assert online.refit() and online.current is not before and online.num_refits == 1  # swapped in
    assert np.all(np.diff(online.call_quantiles(odd), axis=-1) >= 0)


def test_mean_of_quantiles_and_records_round_trip(tmp_path: Path) -> None:
    flat = np.full((1, len(QUANTILES)), 3.0)
    assert mean_of(flat)[0] == pytest.approx(3.0)
    calls, tools = _records(5)
    path = tmp_path / "r.jsonl"
    assert write_records(path, calls, tools) == 10
    assert read_records(path) == (calls, tools)
    path.write_text('{"kind": "call"}\n')
    with pytest.raises(Exception, match=r"r.jsonl:1: not a predictor record"):
        read_records(path)


def test_the_benchmark_defines_its_keys() -> None:
    import benchmarks.agentic_tail as bench

    assert bench.sustained([(1.0, 1.0, 2.0), (2.0, 0.9, 3.0)], 0.95) == pytest.approx((1.5, 2.5))
    assert bench.sustained([(1.0, 0.5, 2.0)], 0.95) == (0.0, 0.0)
    text = Path(bench.__file__).read_text()
    for key in ("p99_change_vs_best_baseline", "throughput_at_slo_ratio", "p90_coverage"):
        assert f'"{key}"' in text


def test_learned_latency_never_falls_as_a_replica_gets_busier() -> None:
    """The contract routers rely on: for any call, a busier replica (longer queue, larger
    running batch, more KV, more queued prompt) never gets a lower predicted latency at any
    quantile, even far outside the training data; the output length ignores the replica."""
    from dataclasses import replace

    from learned.distributional import fit

    calls, tools = _records(800)
    pred = fit(calls, tools, seed=0, epochs=6)
    rng = np.random.default_rng(2)
    for c in calls[:40]:
        f = c.features
        busier = [replace(f, queue_len=f.queue_len + int(rng.integers(0, 500)), running=f.running + int(rng.integers(0, 300)),
                          kv_frac=f.kv_frac + float(rng.uniform(0, 1)),
                          queued_prompt_tokens=f.queued_prompt_tokens + int(rng.integers(0, 10**6)))]
        idle = replace(f, queue_len=0, running=0, kv_frac=0.0, queued_prompt_tokens=0)
        q = pred.call_quantiles([idle, f, *busier])
        assert np.all(q[1, 1] >= q[0, 1] - 1e-9) and np.all(q[2, 1] >= q[1, 1] - 1e-9)
        assert np.allclose(q[0, 0], q[2, 0])  # output tokens: the same call writes the same


def test_a_predicted_latency_router_sends_a_call_to_the_idle_replica() -> None:
    """The mean router asks the learned predictor about each candidate: it must not herd onto
    the busier one (what a state-blind or non-monotone predictor did)."""
    from learned.distributional import fit
    from service.sim.tail_routing import MeanRouter, TailRouter
    from service.sim.workflow import ReplicaState

    calls, tools = _records(800)
    pred = fit(calls, tools, seed=0, epochs=6)

    states = {"a": ReplicaState(12, 40, 0.6, 6000), "b": ReplicaState(0, 2, 0.05, 0)}

    class Driver:

        def replica_state(self, rid: str) -> ReplicaState:
            return states[rid]

        def call_features(self, req: object, s: ReplicaState) -> CallFeatures:
            return CallFeatures("coder", "m", 7.0, 500, 1, 1, 5, 4.0, s.queue_len, s.running, s.kv_frac,
                                s.queued_prompt_tokens)

        def downstream_p99(self, rid: str) -> tuple[float, float]:
            return 0.0, 0.0

        def note_routed(self, *a: object) -> None:
            pass

    class Spec:
        max_num_seqs = 64

    class Cluster:
        now_s = 0.0

        def replica_load(self, rid: str) -> int:
            return states[rid].queue_len + states[rid].running

        def replica_spec(self, rid: str) -> Spec:
            return Spec()

        def can_ever_fit(self, req: object, rid: str) -> bool:
            return True

    from service.domain.request import RequestSpec

    req = RequestSpec("w/s", "t", "m", 0.0, 500, 10)
    for router in (MeanRouter(Driver(), pred), TailRouter(Driver(), pred)):  # type: ignore[arg-type]
        assert router(req, ["a", "b"], Cluster()) == "b"  # type: ignore[arg-type]

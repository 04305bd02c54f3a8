"""The executor daemon: leases run in their replica's batcher and come back as completions.

The worker (the torch side) is tested with objects. The protocol loop is tested through an
in-process httpx transport that answers from a script (no server, no sockets); end-to-end
tests against the real service live with the service.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
import torch
from torch import Tensor

from executor.batcher import generate_alone
from executor.command import describe_devices, main
from executor.daemon import ExecutorDaemon
from executor.device import parse_device_ids
from executor.runner import Stage, StagedModel, load_staged
from executor.settings import Settings
from executor.worker import Lease, Worker
from service.domain.error import NotFoundError, RegisterRefused, TransientError
from service.domain.model_config import model_config
from service.domain.wire import Completion, Failure
from service.models.family import build_model

ONE = [{"device_id": "cpu:0", "layers": [0, 2]}]
TWO = [{"device_id": "cpu:0", "layers": [0, 1]}, {"device_id": "cpu:1", "layers": [1, 2]}]


def lease_json(lease_id: str, *, replica: str = "acme/chat@cpu:0", family: str = "tiny", seed: int = 3,
               stages: list[dict[str, Any]] = ONE, prompt: Sequence[int] = (1, 2, 3), max_tokens: int = 4,
               stream: bool = False) -> dict[str, Any]:
    return {"lease_id": lease_id, "request_id": f"req-{lease_id}", "tenant_id": "acme", "model_id": "chat",
            "family": family, "seed": seed, "replica_id": replica, "stages": stages,
            "prompt_tokens": list(prompt), "max_tokens": max_tokens, "expires_in_s": 10.0, "stream": stream}


def run_rounds(worker: Worker) -> dict[str, Completion]:
    done: dict[str, Completion] = {}
    while worker.busy:
        result = worker.step_round()
        assert not result.failed
        done.update((c.lease_id, c) for _, c in result.completed)
    return done


def test_leases_of_several_replicas_complete_with_the_tokens_of_the_model_run_alone() -> None:
    torch.set_num_threads(1)
    loads: list[tuple[str, int]] = []

    def loader(family: str, seed: int, stages: Sequence[Stage], path: str | None) -> StagedModel:
        loads.append((family, seed))
        return load_staged(family, seed, stages, path)

    worker = Worker(max_batch=8, loader=loader)
    specs = {
        "L1": lease_json("L1", prompt=[5, 6, 7, 8], max_tokens=6),
        "L2": lease_json("L2", prompt=[9], max_tokens=3),
        "L3": lease_json("L3", replica="acme/chat@cpu:0+cpu:1", family="tiny-llama", stages=TWO, max_tokens=5),
        "L4": lease_json("L4", replica="beta/chat@cpu:0", prompt=[1, 2], max_tokens=2),  # same weights as L1, L2
    }
    for raw in specs.values():
        assert worker.accept(Lease.from_json(raw, time.perf_counter()))
    assert worker.free_slots == 4 and sorted(worker.lease_ids) == sorted(specs)
    done = run_rounds(worker)
    assert loads == [("tiny", 3), ("tiny-llama", 3)]  # a model is built once per (family, seed, stages)
    assert set(done) == set(specs) and worker.free_slots == 8
    for lease_id, raw in specs.items():
        reference = build_model(model_config(raw["family"]), seed=raw["seed"])
        c = done[lease_id]
        assert c.output_tokens == generate_alone(reference, raw["prompt_tokens"], raw["max_tokens"]), lease_id
        assert 0 <= c.queued_s <= c.ttft_s <= c.e2e_s
        assert c.iterations == raw["max_tokens"]
        assert 0 < c.busy_s <= c.e2e_s
        assert c.peak_bytes > 0
    assert set(done["L1"].to_json()) == {"lease_id", "output_tokens", "queued_s", "ttft_s", "e2e_s", "iterations",
                                        "busy_s", "peak_bytes", "prefill_stage_s", "decode_stage_s", "decode_batch",
                                        "decode_context"}
    assert len(done["L1"].prefill_stage_s) == len(specs["L1"]["stages"])
    assert all(t is not None and t > 0 for t in done["L1"].prefill_stage_s)
    # one decode iteration of each request timed per stage, with its batch and longest context
    for c in done.values():
        assert len(c.decode_stage_s) == len(specs[c.lease_id]["stages"])
        assert all(t is not None and t > 0 for t in c.decode_stage_s)
        assert 1 <= c.decode_batch <= 8 and c.decode_context >= len(specs[c.lease_id]["prompt_tokens"])


def test_completion_times_count_from_lease_receipt() -> None:
    ticks = itertools.count(1)
    worker = Worker(clock=lambda: float(next(ticks)))  # every clock reading is one second later
    worker.accept(Lease.from_json(lease_json("L1", max_tokens=3), received_s=0.0))
    (c,) = run_rounds(worker).values()
    # iterations run over [1, 2], [3, 4], [5, 6]: admitted at 1, first token at 2, last at 6
    assert (c.queued_s, c.ttft_s, c.e2e_s, c.iterations, c.busy_s) == (1.0, 2.0, 6.0, 3, 3.0)


def test_a_cancelled_lease_frees_its_slot_and_never_completes() -> None:
    worker = Worker(max_batch=2)
    for lease_id in ("L1", "L2"):
        worker.accept(Lease.from_json(lease_json(lease_id, max_tokens=5), time.perf_counter()))
    assert worker.free_slots == 0
    assert not worker.accept(Lease.from_json(lease_json("L1"), time.perf_counter()))  # a duplicate is ignored
    worker.step_round()
    assert worker.cancel("L1") and not worker.cancel("L1")
    assert worker.free_slots == 1
    assert set(run_rounds(worker)) == {"L2"}


def test_leases_that_cannot_run_here_are_refused_and_not_held() -> None:
    worker = Worker(max_batch=4)
    now = time.perf_counter()
    with pytest.raises(NotFoundError):
        worker.accept(Lease.from_json(lease_json("L1", family="no-such-model"), now))
    with pytest.raises(ValueError, match="cover layers"):
        worker.accept(Lease.from_json(lease_json("L2", stages=[{"device_id": "cpu:0", "layers": [0, 1]}]), now))
    with pytest.raises(ValueError, match="exceeds"):
        worker.accept(Lease.from_json(lease_json("L3", prompt=[1] * 500, max_tokens=100), now))
    with pytest.raises(ValueError, match="unknown device"):
        worker.accept(Lease.from_json(lease_json("L4", stages=[{"device_id": "tpu:0", "layers": [0, 2]}]), now))
    with pytest.raises(KeyError):
        Lease.from_json({"lease_id": "L5"}, now)
    assert not worker.busy and worker.free_slots == 4


class _Broken(StagedModel):
    def forward(self, input_ids: Tensor, positions: Tensor, kv_cache: Sequence[Tensor] | None = None,
                attn_bias: Tensor | None = None, last_logits_only: bool = False,
                stage_times: list[float] | None = None) -> tuple[Tensor, list[Tensor]]:
        raise RuntimeError("out of memory (simulated)")


def test_a_failing_iteration_fails_the_leases_of_its_replica_only() -> None:
    def loader(family: str, seed: int, stages: Sequence[Stage], path: str | None) -> StagedModel:
        if family == "tiny-llama":
            return _Broken(build_model(model_config(family), seed=seed), stages)
        return load_staged(family, seed, stages, path)

    worker = Worker(loader=loader, background_loads=False)
    now = time.perf_counter()
    worker.accept(Lease.from_json(lease_json("ok", max_tokens=2), now))
    worker.accept(Lease.from_json(lease_json("bad", replica="x", family="tiny-llama"), now))
    first = worker.step_round()
    assert [(f.lease_id, "simulated" in f.reason) for f in first.failed] == [("bad", True)]
    assert worker.lease_ids == ["ok"]
    assert set(run_rounds(worker)) == {"ok"}


def test_a_replica_is_built_off_the_main_thread_while_the_others_run() -> None:
    """A guest's model loads while the owner's batch keeps running (measured live: building a
    guest's batcher took 0.96 s, which the owner's requests waited out); the guest's leases
    wait for it, and a build that fails fails its leases only."""
    release = threading.Event()

    def loader(family: str, seed: int, stages: Sequence[Stage], path: str | None) -> StagedModel:
        if family == "tiny-llama":
            release.wait(30.0)
        if seed == 99:
            raise RuntimeError("out of memory (simulated)")
        return load_staged(family, seed, stages, path)

    worker = Worker(loader=loader)
    now = time.perf_counter()
    assert worker.accept(Lease.from_json(lease_json("own", max_tokens=3), now))
    assert worker.accept(Lease.from_json(lease_json("bad", replica="x", seed=99), now))  # built one at a time
    for lease_id in ("gst1", "gst2"):
        assert worker.accept(Lease.from_json(lease_json(lease_id, replica="acme/m@cpu:1", family="tiny-llama"), now))
    assert worker.free_slots == 4 and sorted(worker.lease_ids) == ["bad", "gst1", "gst2", "own"]
    done: dict[str, Completion] = {}
    failed: list[Failure] = []
    deadline = time.monotonic() + 30.0
    while "own" not in done or not failed:
        assert time.monotonic() < deadline
        result = worker.step_round()
        done.update((c.lease_id, c) for _, c in result.completed)
        failed += result.failed
    assert [(f.lease_id, "simulated" in f.reason) for f in failed] == [("bad", True)]
    assert set(done) == {"own"} and sorted(worker.lease_ids) == ["gst1", "gst2"]  # still building
    assert len(worker.ready) == 1 and "acme/m@cpu:1" not in worker.ready  # what a poll tells the service
    assert worker.cancel("gst2") and not worker.cancel("gst2")  # a waiting lease can be cancelled
    release.set()
    done |= run_rounds(worker)
    assert set(done) == {"own", "gst1"} and "acme/m@cpu:1" in worker.ready
    reference = build_model(model_config("tiny-llama"), seed=3)
    assert done["gst1"].output_tokens == generate_alone(reference, [1, 2, 3], 4)


def test_a_lease_its_replica_could_not_run_is_refused_before_the_build() -> None:
    worker = Worker(max_batch=4)
    now = time.perf_counter()
    with pytest.raises(ValueError, match="exceeds"):
        worker.accept(Lease.from_json(lease_json("L1", family="tiny-llama", prompt=[1] * 500, max_tokens=100), now))
    assert not worker.busy


# ---- sharing the executor's time ------------------------------------------------------------------
class _Costly(StagedModel):
    """A real model whose every forward pass takes ``cost`` seconds of a scripted clock."""

    def __init__(self, family: str, seed: int, stages: Sequence[Stage], now: list[float], cost: float) -> None:
        super().__init__(build_model(model_config(family), seed=seed), stages)
        self.now, self.cost = now, cost

    def forward(self, input_ids: Tensor, positions: Tensor, kv_cache: Sequence[Tensor] | None = None,
                attn_bias: Tensor | None = None, last_logits_only: bool = False,
                stage_times: list[float] | None = None) -> tuple[Tensor, list[Tensor]]:
        self.now[0] += self.cost
        return super().forward(input_ids, positions, kv_cache, attn_bias, last_logits_only, stage_times)


def _costly_worker(costs: dict[str, float], **kw: Any) -> tuple[Worker, list[float]]:
    """A worker whose models cost ``costs[family]`` seconds per forward on a scripted clock."""
    now = [0.0]

    def loader(family: str, seed: int, stages: Sequence[Stage], path: str | None) -> StagedModel:
        return _Costly(family, seed, stages, now, costs[family])

    # Built on the main thread: a scripted clock's timings must not depend on when a build ends.
    return Worker(**{"max_batch": 8, **kw}, clock=lambda: now[0], loader=loader, background_loads=False), now


def test_replicas_share_the_executor_by_time_and_a_guest_by_its_weight() -> None:
    """An owner whose iterations cost 1 s next to a guest whose cost 10 s: round robin by
    iterations would give the guest 10/11 of the time; by time the guest gets its weight's
    share, 0.5 / 1.5, while both are busy, and all of it once the owner is done."""
    worker, now = _costly_worker({"tiny": 1.0, "tiny-llama": 10.0})
    owner = lease_json("own", replica="globex/m@cpu:0", max_tokens=60)
    guest = {**lease_json("gst", replica="acme/m@cpu:0", family="tiny-llama", max_tokens=12, stream=True),
             "guest": True}
    assert worker.accept(Lease.from_json(owner, 0.0)) and worker.accept(Lease.from_json(guest, 0.0))
    done: dict[str, Completion] = {}
    while "own" not in done:
        done.update((c.lease_id, c) for _, c in worker.step_round().completed)
    # The owner's 60 s of work at 2/3 of the time: 90 s (round robin: 60 + 60 x 10 s).
    assert done["own"].e2e_s == pytest.approx(90.0, abs=10.0)
    (meanwhile,) = worker.progress()  # the guest's tokens so far: a third of 90 s is 3 of its iterations
    assert len(meanwhile.tokens) in (3, 4)
    done |= run_rounds(worker)
    assert done["gst"].e2e_s == pytest.approx(now[0])  # then it ran alone to the end
    assert done["gst"].busy_s == 12 * 10.0


def test_a_tighter_tpot_target_claims_more_of_the_time() -> None:
    """An interactive guest (a token every 0.1 s) next to a batch owner (1 s), equal costs:
    weights 0.5 / 0.1 = 5 against 1 / 1 = 1, so the guest runs 5 of every 6 iterations."""
    worker, _ = _costly_worker({"tiny": 1.0})
    owner = {**lease_json("own", replica="initech/m@cpu:0", max_tokens=60), "tpot_s": 1.0}
    guest = {**lease_json("gst", replica="acme/m@cpu:0", max_tokens=50), "guest": True, "tpot_s": 0.1}
    assert worker.accept(Lease.from_json(owner, 0.0)) and worker.accept(Lease.from_json(guest, 0.0))
    done = run_rounds(worker)
    assert done["gst"].e2e_s == pytest.approx(60.0, abs=2.0)  # its 50 s of work at 5/6 of the time
    assert done["own"].e2e_s == pytest.approx(110.0)  # and the owner's 10 s meanwhile, then the rest alone


def test_a_batcher_ahead_of_its_tpot_pace_yields_to_one_that_is_due() -> None:
    """A standard owner (a token every 0.2 s; cheap iterations, 0.01 s) next to an interactive
    guest (0.1 s; 0.04 s iterations) of equal weights, 5 and 5. Fair by time alone, the owner
    would make a token every 0.02 s while the guest waited half the time (0.08 s a token). Paced,
    the owner is due half its target after its last iteration began and otherwise runs only
    when the guest is not due: the guest's tokens come at its own pace (0.05 s), the owner's
    still four times faster than its target, and the owner's work is not lost: it finishes
    when it would have."""
    worker, _ = _costly_worker({"tiny": 0.01, "tiny-llama": 0.04})
    owner = {**lease_json("own", replica="globex/m@cpu:0", max_tokens=200, stream=True), "tpot_s": 0.2}
    guest = {**lease_json("gst", replica="acme/m@cpu:0", family="tiny-llama", max_tokens=40), "guest": True,
             "tpot_s": 0.1}
    assert worker.accept(Lease.from_json(owner, 0.0)) and worker.accept(Lease.from_json(guest, 0.0))
    done: dict[str, Completion] = {}
    while "gst" not in done:
        done.update((c.lease_id, c) for _, c in worker.step_round().completed)
    gst = done["gst"]
    assert (gst.e2e_s - gst.ttft_s) / 39 == pytest.approx(0.05, abs=0.005)  # WFQ alone: 0.08
    (meanwhile,) = worker.progress()
    assert gst.e2e_s / len(meanwhile.tokens) < 0.2 / 4
    done |= run_rounds(worker)
    assert done["own"].e2e_s == pytest.approx(200 * 0.01 + 40 * 0.04)  # the executor never idled


def test_a_batcher_with_requests_waiting_for_a_kv_slot_is_always_due() -> None:
    """Pacing a batcher whose batch is full would hold its waiting requests back for longer than
    their targets allow: with one KV slot and two requests, a batch owner (pace 0.5 s) shares by
    weight with an interactive guest (whose iterations, 0.06 s, outlast its own pace) while its
    second request waits."""
    worker, _ = _costly_worker({"tiny": 0.01, "tiny-llama": 0.06}, max_batch=1)
    for name in ("own1", "own2"):
        assert worker.accept(Lease.from_json({**lease_json(name, replica="initech/m@cpu:0", max_tokens=10),
                                              "tpot_s": 1.0}, 0.0))
    guest = {**lease_json("gst", replica="acme/m@cpu:0", family="tiny-llama", max_tokens=40), "guest": True,
             "tpot_s": 0.1}
    assert worker.accept(Lease.from_json(guest, 0.0))
    done = run_rounds(worker)
    assert done["own1"].e2e_s < 1.0  # paced while its second request waited: 5 s
    assert set(done) == {"own1", "own2", "gst"}


def test_a_batcher_whose_kv_slots_are_all_taken_is_always_due() -> None:
    """The service leases a replica no more than its KV slots, so a full batcher's queue waits at
    the service, out of the batcher's sight: pacing it would hold that queue back. With one KV
    slot, a batch owner's one request (pace 0.5 s) shares by weight with an interactive guest."""
    worker, _ = _costly_worker({"tiny": 0.01, "tiny-llama": 0.06}, max_batch=1)
    assert worker.accept(Lease.from_json({**lease_json("own", replica="initech/m@cpu:0", max_tokens=10),
                                          "tpot_s": 1.0}, 0.0))
    guest = {**lease_json("gst", replica="acme/m@cpu:0", family="tiny-llama", max_tokens=40), "guest": True,
             "tpot_s": 0.1}
    assert worker.accept(Lease.from_json(guest, 0.0))
    done = run_rounds(worker)
    assert done["own"].e2e_s < 1.0  # paced: a token every 0.5 s, 4.5 s
    assert set(done) == {"own", "gst"}


@pytest.mark.slow
def test_a_request_waiting_for_its_prefill_goes_before_a_batch_ahead_of_its_pace() -> None:
    """A guest's new request waits for its prefill while the owner beside it, four of its eight
    KV slots taken (so always due), has the less virtual time: by time alone the owner's cheap
    iterations would run first until they caught up with the guest's last costly one (measured
    live: a guest's first requests waited 0.2 s so). A request that can be admitted is
    prefilled at the next pick: its TTFT is running, and one iteration admits all that wait."""
    worker, now = _costly_worker({"tiny": 0.001, "tiny-llama": 0.2})
    for i in range(4):
        assert worker.accept(Lease.from_json({**lease_json(f"own{i}", replica="globex/m@cpu:0", max_tokens=500),
                                              "tpot_s": 0.2}, 0.0))
    guest = {**lease_json("gst1", replica="acme/m@cpu:0", family="tiny-llama", max_tokens=40), "guest": True,
             "tpot_s": 0.1}
    assert worker.accept(Lease.from_json(guest, 0.0))
    done: dict[str, Completion] = {}
    for _ in range(3):
        done.update((c.lease_id, c) for _, c in worker.step_round().completed)
    arrived = now[0]
    assert worker.accept(Lease.from_json({**guest, "lease_id": "gst2", "max_tokens": 2}, arrived))
    while "gst2" not in done:
        done.update((c.lease_id, c) for _, c in worker.step_round().completed)
    # Its prefill with gst1's decode (two forwards of 0.2 s), after at most one owner iteration;
    # by virtual time alone the owner's 0.001 s iterations first ran 0.4 s.
    assert done["gst2"].ttft_s <= 0.4 + 0.01


def test_equal_weights_and_costs_are_round_robin() -> None:
    worker, _ = _costly_worker({"tiny": 1.0})
    for name, replica in (("a", "acme/m@cpu:0"), ("b", "beta/m@cpu:0")):
        assert worker.accept(Lease.from_json(lease_json(name, replica=replica, max_tokens=5), 0.0))
    done = run_rounds(worker)
    assert (done["a"].e2e_s, done["b"].e2e_s) == (9.0, 10.0)  # alternating: a's 5th at 9 s, b's at 10 s


def test_idle_time_banks_no_credit() -> None:
    """A guest that ran alone for 100 s does not then wait 100 s for an owner arriving, nor does
    the owner get those 100 s to itself: from its arrival they share by weight."""
    worker, now = _costly_worker({"tiny": 1.0}, guest_weight=1.0)
    worker.accept(Lease.from_json({**lease_json("gst", replica="acme/m@cpu:0", max_tokens=150), "guest": True}, 0.0))
    while now[0] < 100.0:
        worker.step_round()
    worker.accept(Lease.from_json(lease_json("own", replica="globex/m@cpu:0", max_tokens=10), now[0]))
    done = run_rounds(worker)
    assert done["own"].e2e_s <= 21.0  # half the time: 10 s of work in ~20 s
    assert "gst" in done


def test_the_guest_weight_must_be_positive() -> None:
    with pytest.raises(ValueError, match="guest_weight"):
        Worker(guest_weight=0.0)


# ---- the protocol loop, through a scripted in-process transport ---------------------------------
class ScriptedService:
    """Answers the executor protocol from a script and records every call."""

    def __init__(self, leases: list[dict[str, Any]], *, cancel: Sequence[str] = (), register_status: int = 200,
                 transient: Sequence[str] = ()) -> None:
        self.pending = list(leases)
        self.cancel = set(cancel)
        self.register_status = register_status
        self.transient = list(transient)  # paths that fail once each (connection error or 503), in order
        self.calls: list[tuple[str, str, Any]] = []
        self.completed: dict[str, dict[str, Any]] = {}
        self.heartbeats: list[list[str]] = []
        self.lock = threading.Lock()
        self.daemon: ExecutorDaemon | None = None
        self.stop_when: set[str] = set()  # request a stop once these leases are completed or cancelled
        self.cancelled: set[str] = set()
        self.streamed: dict[str, list[int]] = {}  # lease id -> tokens reported by progress
        self.cancel_after: dict[str, int] = {}  # progress answers cancel a lease once it reported this many

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        path = request.url.path
        with self.lock:
            self.calls.append((request.method, path, body))
            if path in self.transient:
                self.transient.remove(path)
                if path == "/v1/executors":
                    raise httpx.ConnectError("connection refused (scripted)", request=request)
                return httpx.Response(503, json={"error": {"kind": "unavailable", "message": "scripted"}})
            return self._answer(request.method, path, body)

    def _answer(self, method: str, path: str, body: Any) -> httpx.Response:
        if path == "/v1/executors":
            if self.register_status != 200:
                return httpx.Response(self.register_status, json={"error": {"kind": "unauthorized", "message": "bad key"}})
            return httpx.Response(200, json={"executor_id": body["executor_id"], "lease_ttl_s": 5.0, "heartbeat_s": 0.02})
        if path == "/v1/leases/poll":
            leases, self.pending = self.pending[: body["max_leases"]], self.pending[body["max_leases"]:]
            return httpx.Response(200, json={"leases": leases})
        if path.endswith("/heartbeat"):
            self.heartbeats.append(body["running"])
            cancel = sorted(self.cancel & set(body["running"]))
            self.cancelled.update(cancel)
            self._maybe_stop()
            return httpx.Response(200, json={"renewed": body["running"], "cancel": cancel, "drain": False})
        if path == "/v1/leases/progress":
            for u in body["updates"]:
                got = self.streamed.setdefault(u["lease_id"], [])
                assert u["offset"] == len(got), "progress is contiguous"
                got.extend(u["tokens"])
            cancel = sorted(lid for lid, n in self.cancel_after.items() if len(self.streamed.get(lid, ())) >= n)
            self.cancelled.update(cancel)
            self._maybe_stop()
            return httpx.Response(200, json={"cancel": cancel})
        if path == "/v1/leases/complete":
            for result in body["results"]:
                self.completed[result["lease_id"]] = result
            self._maybe_stop()
            return httpx.Response(200, json={"accepted": [r["lease_id"] for r in body["results"]], "rejected": []})
        if method == "DELETE":
            return httpx.Response(200, json={})
        return httpx.Response(404, json={"error": {"kind": "not_found", "message": path}})

    def _maybe_stop(self) -> None:
        """Stop the daemon (once: a second stop would abandon its leases), as SIGTERM would."""
        if self.daemon is not None and self.stop_when <= set(self.completed) | self.cancelled:
            self.daemon.request_stop()
            self.daemon = None


def daemon_for(service: ScriptedService, **settings: Any) -> ExecutorDaemon:
    s = Settings(server="http://service.test", key="k", executor_id="node-1", host_id="node",
                 devices=({"device_id": "cpu:0", "kind": "cpu", "mem_bytes": 2**30},),
                 poll_wait_s=0.01, retry_base_s=0.01, **settings)
    daemon = ExecutorDaemon(s, transport=httpx.MockTransport(service))
    service.daemon = daemon
    return daemon


def test_the_daemon_registers_runs_leases_honours_cancellation_and_leaves() -> None:
    torch.set_num_threads(1)
    short = lease_json("L1", prompt=[4, 5], max_tokens=4)
    long = lease_json("L2", prompt=[1, 2, 3], max_tokens=500)  # runs long enough to be cancelled by a heartbeat
    service = ScriptedService([short, long], cancel=["L2"])
    service.stop_when = {"L1", "L2"}
    daemon = daemon_for(service, max_batch=4)
    assert daemon.run() == 0
    method, path, body = service.calls[0]
    assert (method, path, body["executor_id"], body["devices"][0]["device_id"]) == ("POST", "/v1/executors", "node-1",
                                                                                   "cpu:0")
    assert set(service.completed) == {"L1"}
    reference = build_model(model_config("tiny"), seed=3)
    assert service.completed["L1"]["output_tokens"] == generate_alone(reference, [4, 5], 4)
    assert any("L2" in running for running in service.heartbeats)
    polls = [b for m, p, b in service.calls if p == "/v1/leases/poll"]
    held = 2 * 4 * 1  # two batchers' KV slots per device, one device
    assert all(0 < b["max_leases"] <= held for b in polls) and polls[0]["max_leases"] == held
    assert service.calls[-1][:2] == ("DELETE", "/v1/executors/node-1")


def test_streaming_leases_report_their_tokens_and_stop_when_a_progress_answer_cancels_them() -> None:
    torch.set_num_threads(1)
    service = ScriptedService([lease_json("L1", max_tokens=40, stream=True),
                               lease_json("L2", prompt=[7, 8], max_tokens=500, stream=True),
                               lease_json("L3", max_tokens=6)])
    service.cancel_after = {"L2": 5}
    service.stop_when = {"L1", "L2", "L3"}
    assert daemon_for(service, max_batch=4).run() == 0
    assert set(service.completed) == {"L1", "L3"} and "L2" in service.cancelled
    out = service.completed["L1"]["output_tokens"]
    assert len(service.streamed["L1"]) >= 2 and out[: len(service.streamed["L1"])] == service.streamed["L1"]
    assert "L3" not in service.streamed  # not a streaming lease
    assert 5 <= len(service.streamed["L2"]) < 250  # stopped promptly, long before its 500 tokens


def test_taking_a_lease_makes_the_worker_busy_before_its_round_publishes() -> None:
    from executor.daemon import _Mailbox

    box = _Mailbox(4)
    assert not box.occupied()
    box.receive([{"lease_id": "L1"}], 0.0)
    assert not box.busy and box.has_received() and box.occupied()
    assert len(box.take_received()) == 1
    # between the take and the worker's next publish, nothing is received and nothing unsent: the
    # exchange thread decides its poll on ``busy`` alone, and must not start a long poll
    assert box.busy and not box.has_received() and box.unsent() == 0 and box.to_poll() == 3
    assert box.occupied()
    box.publish([], 4, 0.0, [])
    assert not box.busy
    assert box.take_received() == [] and not box.busy  # an empty take changes nothing


def test_a_busy_exchange_thread_sleeps_until_its_next_poll_is_due() -> None:
    from executor.daemon import IDLE_PAUSE_S

    now = [10.0]
    s = Settings(server="http://service.test", key="k", executor_id="node-1", host_id="node",
                 devices=({"device_id": "cpu:0", "kind": "cpu", "mem_bytes": 2**30},), busy_poll_s=0.05)
    daemon = ExecutorDaemon(s, transport=httpx.MockTransport(ScriptedService([])), clock=lambda: now[0])
    assert daemon._until_next_poll() == IDLE_PAUSE_S  # idle: the long poll is the wait
    daemon._mailbox.publish(["L1"], 3, 0.0, [])
    assert daemon._until_next_poll() == 0.05  # never polled
    daemon._last_poll_s = 10.0
    now[0] = 10.02  # a completion woke it 20 ms after the last poll: the next is due in 30 ms, not 50
    assert daemon._until_next_poll() == pytest.approx(0.03)
    now[0] = 10.06  # due and not polled (no free slot): a whole interval, never a spin
    assert daemon._until_next_poll() == 0.05


def test_no_long_poll_while_a_lease_runs_or_its_completion_is_unsent() -> None:
    """Every poll from the one that hands over a lease to the lease's completion is a short poll
    (wait 0): a long poll there holds the completion until it returns. End to end through the
    daemon's threads; the window it guards (a lease taken, its first round not yet published) is
    held deterministically by the mailbox test above."""
    torch.set_num_threads(1)
    for _ in range(3):  # the race it guards against is a window of a round's length: try it a few times
        service = ScriptedService([lease_json("L1", prompt=[4, 5, 6, 7], max_tokens=12)])
        service.stop_when = {"L1"}
        assert daemon_for(service, max_batch=4).run() == 0
        calls = [(p, b) for _, p, b in service.calls if p in ("/v1/leases/poll", "/v1/leases/complete")]
        handed = 1 + next(i for i, (p, _) in enumerate(calls) if p == "/v1/leases/poll")  # the first poll has it
        done = next(i for i, (p, _) in enumerate(calls) if p == "/v1/leases/complete")
        between = [b["wait_s"] for p, b in calls[handed:done] if p == "/v1/leases/poll"]
        assert all(w == 0.0 for w in between), between


class SlowCompletions(ScriptedService):
    """Holds the first completion call until the streaming lease ``streamer`` has reported all
    its ``tokens``: the torch loop must go on while a lease call waits on the service (its
    answer waits on a Neo4j write)."""

    def __init__(self, leases: list[dict[str, Any]], streamer: str, tokens: int) -> None:
        super().__init__(leases)
        self.streamer, self.tokens = streamer, tokens
        self.streamed_all = threading.Event()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/leases/complete" and not self.completed:
            self.streamed_all.wait(30.0)  # outside the lock: the progress calls go on meanwhile
        response = super().__call__(request)
        if path == "/v1/leases/progress" and len(self.streamed.get(self.streamer, ())) >= self.tokens:
            self.streamed_all.set()
        return response


def test_the_torch_loop_runs_on_while_a_completion_waits_on_the_service() -> None:
    torch.set_num_threads(1)
    service = SlowCompletions([lease_json("L1", max_tokens=2), lease_json("L2", prompt=[7, 8], max_tokens=60,
                                                                           stream=True)], "L2", 59)
    service.stop_when = {"L1", "L2"}
    assert daemon_for(service, max_batch=4).run() == 0
    # L2 streamed its tokens while L1's completion call was held: the call did not stop the rounds.
    assert service.streamed_all.is_set()
    assert set(service.completed) == {"L1", "L2"}
    reference = build_model(model_config("tiny"), seed=3)
    assert service.completed["L2"]["output_tokens"] == generate_alone(reference, [7, 8], 60)


def test_transient_failures_are_retried_and_each_completion_is_posted_once() -> None:
    service = ScriptedService([lease_json("L1", max_tokens=2)], transient=["/v1/executors", "/v1/leases/complete"])
    service.stop_when = {"L1"}
    assert daemon_for(service).run() == 0
    paths = [p for _, p, _ in service.calls]
    assert paths.count("/v1/executors") == 2 and paths.count("/v1/leases/complete") == 2
    assert set(service.completed) == {"L1"}


def test_a_refused_registration_is_fatal() -> None:
    service = ScriptedService([], register_status=401)
    with pytest.raises(RegisterRefused, match="401"):
        daemon_for(service).run()
    assert len(service.calls) == 1


def test_a_registration_refused_again_later_is_fatal() -> None:
    class Revoked(ScriptedService):
        """Registers the executor, then forgets it (every heartbeat a 404) and refuses it again.
        The heartbeats stay 404: a forgotten executor's heartbeat never reaches ``_maybe_stop``,
        whose stop would race the refusal (a stop before the exchange thread re-registered
        returned 0, once in CI)."""

        def _answer(self, method: str, path: str, body: Any) -> httpx.Response:
            if path.endswith("/heartbeat"):
                self.register_status = 401
                return httpx.Response(404, json={"error": {"kind": "not_found", "message": "unknown executor"}})
            return super()._answer(method, path, body)

    service = Revoked([])
    with pytest.raises(RegisterRefused, match="401"):
        daemon_for(service).run()
    assert [p for _, p, _ in service.calls].count("/v1/executors") == 2


def test_a_lease_that_cannot_run_here_is_failed_back_to_the_service() -> None:
    service = ScriptedService([lease_json("L1", family="no-such-model"), lease_json("L2", max_tokens=1)])
    service.stop_when = {"L2"}
    assert daemon_for(service).run() == 0
    fails = [(p, b) for _, p, b in service.calls if p.endswith("/fail")]
    assert len(fails) == 1 and fails[0][0] == "/v1/leases/L1/fail" and "no-such-model" in fails[0][1]["reason"]
    assert set(service.completed) == {"L2"}


# ---- the command ---------------------------------------------------------------------------------
def test_the_command_refuses_bad_arguments_before_any_network(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SLICESCHED_EXECUTOR_KEY", raising=False)
    monkeypatch.delenv("SLICESCHED_ADMIN_KEY", raising=False)
    assert main(["--server", "http://127.0.0.1:9", "--devices", "cpu:0"]) == 2
    assert "no key" in capsys.readouterr().err
    monkeypatch.setenv("SLICESCHED_ADMIN_KEY", "admin-key-is-not-an-executor-key")  # never a fallback
    assert main(["--server", "http://127.0.0.1:9", "--devices", "cpu:0"]) == 2
    assert "no key" in capsys.readouterr().err
    assert main(["--server", "http://127.0.0.1:9", "--devices", "cpu:0,tpu:0", "--key", "k"]) == 2
    assert "unknown device" in capsys.readouterr().err


def test_devices_are_described_for_registration() -> None:
    (a, b) = describe_devices(["cpu:0", "cpu:1"], 1.5)
    assert a == {"device_id": "cpu:0", "kind": "cpu", "mem_bytes": 3 * 2**29} and b["device_id"] == "cpu:1"
    (detected,) = describe_devices(["cpu:0"], None)
    assert detected["mem_bytes"] > 0
    with pytest.raises(ValueError, match="repeat"):
        describe_devices(["cpu:0", "cpu:0"], None)


def test_devices_auto_names_every_cuda_device_torch_sees_else_one_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    here = parse_device_ids("auto")
    assert [d["device_id"] for d in describe_devices(here, None)] == here  # each one exists in this process
    assert here == (["cpu:0"] if not torch.cuda.is_available() else [f"cuda:{i}" for i in range(len(here))])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)  # a node whose device plugin gave this pod 3 GPUs
    assert parse_device_ids(" auto ") == ["cuda:0", "cuda:1", "cuda:2"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert parse_device_ids("auto") == ["cpu:0"]
    assert parse_device_ids("cpu:0, cpu:1,") == ["cpu:0", "cpu:1"]  # explicit ids as before


def test_an_executor_given_several_addresses_moves_past_a_standby_and_an_unreachable_one() -> None:
    """Serve processes under leader election with no one address in front: a 503 ``not_leader``
    or a refused connection moves the executor's calls to the next address."""
    seen: list[str] = []

    def service(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        if request.url.host == "standby.test":
            return httpx.Response(503, json={"error": {"kind": "not_leader", "message": "the standby"}})
        if request.url.host == "gone.test":
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, json={"ok": True})

    s = Settings(server="http://standby.test, http://gone.test,http://leader.test", key="k", executor_id="node-1",
                 host_id="node", devices=({"device_id": "cpu:0", "kind": "cpu", "mem_bytes": 1 << 30},))
    assert s.servers == ("http://standby.test", "http://gone.test", "http://leader.test")
    daemon = ExecutorDaemon(s, transport=httpx.MockTransport(service))
    with daemon._client() as client:
        for _ in range(2):
            with pytest.raises(TransientError):
                daemon._call(client, "GET", "/v1/x")
        assert daemon._call(client, "GET", "/v1/x") == {"ok": True}
        assert daemon._call(client, "GET", "/v1/x") == {"ok": True}  # it stays with the leader
    assert seen == ["standby.test", "gone.test", "leader.test", "leader.test"]
    # A single address is kept whatever the answer (a Service in front routes to the leader).
    one = ExecutorDaemon(Settings(server="http://standby.test", key="k", executor_id="n", host_id="n",
                                  devices=s.devices), transport=httpx.MockTransport(service))
    with one._client() as client:
        with pytest.raises(TransientError):
            one._call(client, "GET", "/v1/x")
        assert client.base_url.host == "standby.test"

"""The live state's lease rules, with a hand-driven clock: no server, no Neo4j."""

from __future__ import annotations

import pytest

from service.core.queue import make_queue_policy
from service.domain.error import ConflictError, InvalidInputError, NotFoundError
from service.domain.tokenizer import ByteTokenizer
from service.domain.wire import Completion
from service.live.credential import hash_key
from service.live.records import LiveModel
from service.live.state import LiveState


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def complete(state: LiveState, executor_id: str, c: Completion) -> None:
    """A completion as the service applies it: checked and claimed, (written), then applied."""
    state.complete(c, state.completion_row(executor_id, c))


def make_state(queue: str = "fifo", **kw: object) -> tuple[LiveState, Clock]:
    clock = Clock()
    state = LiveState(make_queue_policy(queue), clock=clock, wall=clock, lease_ttl_s=5.0, **kw)  # type: ignore[arg-type]
    for tenant in ("a", "b"):
        state.add_tenant(tenant, "standard", 1.0, 0, hash_key(tenant))
        state.add_model(LiveModel(tenant, "m", "tiny", 1, 1))
    state.register_executor("e1", "h", [("cpu:0", "cpu", 2 << 30)])
    state.register_executor("e2", "h", [("cpu:0", "cpu", 2 << 30)])
    state.add_replica("a/m", ("e1/cpu:0",), guest=False)
    state.add_replica("b/m", ("e2/cpu:0",), guest=False)
    return state, clock


def submit(state: LiveState, tenant: str, n: int = 1, max_tokens: int = 3) -> list[str]:
    ids = []
    for _ in range(n):
        req = state.new_request(tenant, "m", [1, 2], max_tokens, None)
        state.accept(req)
        ids.append(req.request_id)
    return ids


def done(lease_id: str, n: int = 3) -> Completion:
    return Completion(lease_id, [7] * n, 0.0, 0.1, 0.2, n, 0.05, 1000)


def test_leases_go_to_the_executor_holding_the_replica_in_fifo_order() -> None:
    state, _ = make_state()
    a = submit(state, "a", 3)
    submit(state, "b", 1)
    grants = state.grant("e1", 8)
    assert [req.request_id for _, _, req in grants] == a  # only tenant a's replica is on e1
    assert all(req.status == "leased" for _, _, req in grants)


def test_a_replica_never_holds_more_leases_than_its_kv_slots() -> None:
    state, _ = make_state(max_batch=2)
    submit(state, "a", 5)
    assert len(state.grant("e1", 8)) == 2
    assert state.grant("e1", 8) == []


def test_a_replica_its_executor_has_not_built_holds_one_lease_until_it_says_so() -> None:
    """An executor that says which replicas it has built gets one lease for any other (the one
    that has it built); the rest of the backlog stays queued for replicas already running."""
    state, _ = make_state()
    guest = state.add_replica("a/m", ("e2/cpu:0",), guest=True).replica_id
    ids = submit(state, "a", 6)
    (first,) = state.grant("e2", 8, ready=frozenset())  # neither replica on e2 is built yet
    assert first[1].replica_id == guest and first[2].request_id == ids[0]
    assert state.grant("e2", 8, ready=frozenset()) == []  # still loading: the others wait
    assert [req.request_id for _, _, req in state.grant("e1", 2, ready=frozenset({"a/m@e1/cpu:0"}))] == ids[1:3]
    built = state.grant("e2", 8, ready=frozenset({guest}))
    assert [req.request_id for _, _, req in built] == ids[3:]  # built: its batch fills
    assert all(r.replica_id == guest for _, r, _ in built)
    # An executor that says nothing (ready None) has no such limit.
    more = submit(state, "b", 3)
    assert [req.request_id for _, _, req in state.grant("e2", 8)] == more


def test_expired_lease_requeues_and_its_late_completion_changes_nothing() -> None:
    state, clock = make_state()
    [rid] = submit(state, "a")
    [(lease, _, _)] = state.grant("e1", 1)
    clock.t += 6.0  # past the TTL, no heartbeat
    state.expire()
    assert state.requests[rid].status == "queued" and state.counters["leases_expired"] == 1
    with pytest.raises(ConflictError):
        complete(state, "e1", done(lease.lease_id))
    [(again, _, _)] = state.grant("e1", 1)
    complete(state, "e1", done(again.lease_id))
    req = state.requests[rid]
    assert req.status == "done" and req.attempts == 2 and req.output_tokens == [7, 7, 7]
    with pytest.raises(ConflictError):  # a second completion of the same lease
        complete(state, "e1", done(again.lease_id))


def test_heartbeat_renews_the_leases_the_executor_reports() -> None:
    state, clock = make_state()
    submit(state, "a", 3)
    leases = [lease.lease_id for lease, _, _ in state.grant("e1", 8)]
    clock.t += 4.0
    renewed, cancel = state.heartbeat("e1", 0.0, [*leases[:2], "L-unknown"])
    assert renewed == sorted(leases[:2]) and cancel == ["L-unknown"]  # not live here: its result would be refused
    clock.t += 4.0  # 8 s after the grant, 4 s after the renewal
    state.expire()
    # The lease it no longer reports (its result dropped) expires and its request runs again.
    assert state.counters["leases_expired"] == 1 and set(state.leases) == set(leases[:2])


def test_cancel_of_a_running_request_is_announced_at_the_next_heartbeat() -> None:
    state, _ = make_state()
    [rid] = submit(state, "a")
    [(lease, _, _)] = state.grant("e1", 1)
    state.cancel(state.requests[rid])
    assert state.requests[rid].status == "cancelled"
    assert state.heartbeat("e1", 0.0, [lease.lease_id]) == ([], [lease.lease_id])
    with pytest.raises(ConflictError):
        complete(state, "e1", done(lease.lease_id))
    with pytest.raises(ConflictError):
        state.cancel(state.requests[rid])


def test_a_request_fails_after_max_attempts() -> None:
    state, _ = make_state(max_attempts=2)
    [rid] = submit(state, "a")
    for _ in range(2):
        [(lease, _, _)] = state.grant("e1", 1)
        state.fail(lease.lease_id, "e1", "boom")
    assert state.requests[rid].status == "failed" and state.requests[rid].error == "boom"
    assert state.grant("e1", 1) == []


def test_a_silent_executor_is_dropped_with_its_replicas_and_leases() -> None:
    state, clock = make_state()
    [rid] = submit(state, "a")
    state.grant("e1", 1)
    clock.t += 16.0  # three TTLs without a word
    state.heartbeat("e2", 0.0, [])
    state.expire()
    assert "e1" not in state.executors and not any("e1/" in d for d in state.devices)
    assert state.requests[rid].status == "queued"


def test_tenants_cannot_see_each_others_requests_and_bad_requests_are_refused() -> None:
    state, _ = make_state()
    [rid] = submit(state, "a")
    assert state.request(rid, "a").tenant_id == "a"
    with pytest.raises(NotFoundError):
        state.request(rid, "b")
    for prompt, max_tokens in (([], 1), ([1], 0), ([300], 1), ([1] * 500, 100)):
        with pytest.raises(InvalidInputError):
            state.new_request("a", "m", prompt, max_tokens, None)
    with pytest.raises(InvalidInputError):
        state.new_request("a", "m", [1], 1, "gold")


def test_completion_must_carry_the_asked_number_of_tokens() -> None:
    state, _ = make_state()
    submit(state, "a", max_tokens=3)
    [(lease, _, _)] = state.grant("e1", 1)
    with pytest.raises(InvalidInputError):
        complete(state, "e1", done(lease.lease_id, n=2))
    assert state.leases  # still live: a corrected completion is accepted
    complete(state, "e1", done(lease.lease_id))


def test_budget_calibration_follows_observed_outputs() -> None:
    state, _ = make_state()
    state.calibrator.observe("a/m", 100, 100, 50)
    assert state.calibrator.budget("a/m", 100) < 100
    assert state.calibrator.budget("b/m", 100) == 100


def test_a_requests_own_priority_orders_the_queue_before_its_tenants() -> None:
    state, clock = make_state("priority")
    ids = []
    for priority in (None, 5, -3, 5):  # the tenant's priority is 0
        req = state.new_request("a", "m", [1, 2], 3, None)
        req.priority = priority
        state.accept(req)
        ids.append(req.request_id)
        clock.t += 1.0
    assert [req.request_id for _, _, req in state.grant("e1", 8)] == [ids[1], ids[3], ids[0], ids[2]]


def test_the_queue_policy_switches_only_between_runs_and_slack_reads_a_requests_own_targets() -> None:
    state, clock = make_state()
    submit(state, "a", 1)
    with pytest.raises(ConflictError, match="queued or leased"):
        state.set_queue_policy(make_queue_policy("slack"))
    ((lease, _, _),) = state.grant("e1", 8)
    with pytest.raises(ConflictError, match="queued or leased"):  # leased
        state.set_queue_policy(make_queue_policy("slack"))
    complete(state, "e1", done(lease.lease_id))
    state.set_queue_policy(make_queue_policy("slack", token_s=0.01))
    assert state.policy.name == state.book.policy.name == "slack" and state.served == {}
    ids = []
    for ttft_s in (None, 0.5, None, 0.2):  # the tenant's class (standard: 3 s TTFT) or the request's own
        req = state.new_request("a", "m", [1, 2], 3, None)
        req.slo_ttft_s = ttft_s
        state.accept(req)
        ids.append(req.request_id)
        clock.t += 0.1
    # deadlines (arrival + TTFT + 2 x 0.2 s TPOT): 3.4, 1.0, 3.6, 0.9 s after the first arrival
    assert [req.request_id for _, _, req in state.grant("e1", 8)] == [ids[3], ids[1], ids[0], ids[2]]


def test_a_completion_may_end_early_only_at_a_stop_id() -> None:
    state, _ = make_state()
    state.models["a/m"].tokenizer = StopAt(9)
    submit(state, "a", 2, max_tokens=5)
    (first, _, _), (second, _, _) = state.grant("e1", 2)
    with pytest.raises(InvalidInputError, match="stop id"):
        complete(state, "e1", Completion(first.lease_id, [7, 7], 0.0, 0.1, 0.2, 2, 0.05, 1000))
    complete(state, "e1", Completion(second.lease_id, [7, 9], 0.0, 0.1, 0.2, 2, 0.05, 1000))
    assert state.requests[second.request_id].status == "done"


class StopAt(ByteTokenizer):
    """Bytes, with one stop id."""

    def __init__(self, stop: int) -> None:
        self.stop = stop

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return (self.stop,)


def test_a_sliced_change_keeps_its_cut_its_leases_carry_it_and_it_yields_unless_it_takes_turns() -> None:
    from service.core.scheduler import Decision, ReplicaChange

    state, _ = make_state()
    state.executors["e2"].stage_url = "http://e2:9000"
    units = {"e1": ("e1/cpu:0",), "e2": ("e2/cpu:0",)}
    sliced = ReplicaChange("a/m", "tiny", ("e2", "e1"), (("e2", 0, 0), ("e1", 1, 1)))  # inclusive layer ranges
    applied = state.apply(Decision(add=[sliced]), units)
    (rid,) = applied.added
    replica = state.replicas[rid]
    assert rid == "a/m@e2/cpu:0:0-1+e1/cpu:0:1-2" and replica.guest and replica.yields
    assert replica.plan == (("e2/cpu:0", 0, 1), ("e1/cpu:0", 1, 2)) and replica.device_ids == ("e2/cpu:0", "e1/cpu:0")
    # each device holds half the model's layers: half its weights and KV reserve
    model = state.models["a/m"]
    whole = model.weight_bytes + state.kv_reserve_bytes(model)
    assert state.free_bytes("e2/cpu:0") == (2 << 30) - (model.weight_bytes + state.kv_reserve_bytes(model)) - whole // 2
    # the first slice's executor leads: its own layers local, the other's through its stage server
    state.executors["e1"].stage_url = "http://e1:9000"
    stages = state.stages(replica, "e2", model.config.n_layers)
    assert [(s.device_id, s.start, s.end, s.url) for s in stages] == [("cpu:0", 0, 1, None),
                                                                       ("cpu:0", 1, 2, "http://e1:9000")]
    # the same cut again, or one that does not cover the layers, is skipped; turns: no yield
    again = state.apply(Decision(add=[sliced, ReplicaChange("a/m", "tiny", ("e2",), (("e2", 0, 0),))]), units)
    assert again.added == [] and len(again.skipped) == 2
    turns = state.apply(Decision(add=[ReplicaChange("b/m", "tiny", ("e1", "e2"), (("e1", 0, 0), ("e2", 1, 1)),
                                                    turns=True)]), units)
    assert not state.replicas[turns.added[0]].yields


def test_a_sliced_replicas_lease_says_it_yields() -> None:
    from service.core.scheduler import Decision, ReplicaChange
    from service.domain.wire import LeaseGrant

    state, _ = make_state()
    state.executors["e1"].stage_url = "http://e1:9000"
    state.replicas.pop("a/m@e1/cpu:0")  # tenant a's only replica: the sliced one
    state.apply(Decision(add=[ReplicaChange("a/m", "tiny", ("e2", "e1"), (("e2", 0, 0), ("e1", 1, 1)))]),
                {"e1": ("e1/cpu:0",), "e2": ("e2/cpu:0",)})
    (req,) = submit(state, "a")
    ((lease, replica, _),) = state.grant("e2", 8)
    assert replica.yields and lease.request_id == req
    grant = LeaseGrant(lease.lease_id, req, replica.replica_id, "tiny", 1, state.stages(replica, "e2", 2), (1, 2), 3,
                       guest=True, yields=replica.yields)
    assert LeaseGrant.from_json(grant.to_json()).yields
    assert "yields" not in LeaseGrant(**{**grant.__dict__, "yields": False}).to_json()


def test_a_sliced_guest_leases_only_its_tenants_overflow() -> None:
    """While tenant a's home has a free KV slot, a's requests wait for it, not for the sliced
    guest; once the home is full, the guest takes the overflow."""
    from service.core.scheduler import Decision, ReplicaChange

    state, _ = make_state(max_batch=2)
    state.executors["e1"].stage_url = "http://e1:9000"
    state.apply(Decision(add=[ReplicaChange("a/m", "tiny", ("e2", "e1"), (("e2", 0, 0), ("e1", 1, 1)))]),
                {"e1": ("e1/cpu:0",), "e2": ("e2/cpu:0",)})
    submit(state, "a", 3)
    assert state.grant("e2", 8) == []  # the home (on e1) has room: the guest waits
    home = state.grant("e1", 8)
    assert [r.replica_id for _, r, _ in home] == ["a/m@e1/cpu:0"] * 2  # the home full (2 slots)
    (guest,) = state.grant("e2", 8)
    assert guest[1].yields and guest[1].replica_id.startswith("a/m@e2/cpu:0:0-1")


def test_a_completion_records_its_prefill_per_stage_as_slice_observations() -> None:
    """Each timed stage of a lease's prefill becomes one observation row for the GMG: the
    service's device id, the stage's layers, one sequence of the prompt's tokens, the measured
    latency; the first on the lease's own Slice. Untimed stages and a stage count that does not
    match the placement record nothing."""
    from service.core.scheduler import Decision, ReplicaChange

    state, _ = make_state()
    state.executors["e1"].stage_url = "http://e1:9000"
    state.replicas.pop("a/m@e1/cpu:0")  # tenant a's only replica: the sliced one
    state.apply(Decision(add=[ReplicaChange("a/m", "tiny", ("e2", "e1"), (("e2", 0, 0), ("e1", 1, 1)))]),
                {"e1": ("e1/cpu:0",), "e2": ("e2/cpu:0",)})

    def run(stage_s: tuple[float | None, ...]) -> tuple[str, list[dict[str, object]]]:
        submit(state, "a")
        ((lease, _, _),) = state.grant("e2", 8)
        c = Completion(**{**done(lease.lease_id).__dict__, "prefill_stage_s": stage_s})
        writes = state.complete(c, state.completion_row("e2", c))
        assert all(w.kind == "observation" for w in writes)
        return lease.lease_id, [w.row for w in writes]

    first, rows = run((0.004, 0.006))
    assert [(r["uid"], r["device_id"], r["layer_start"], r["layer_end"]) for r in rows] == [
        (first, "e2/cpu:0", 0, 1), (f"{first}/1", "e1/cpu:0", 1, 2)]
    assert all(r["tenant_id"] == "a" and r["family"] == "tiny" and r["batch"] == 1 and r["tokens"] == 2
               and r["phase"] == "prefill" for r in rows)
    assert [r["latency_s"] for r in rows] == [0.004, 0.006]
    second, rows = run((None, 0.006))
    assert [r["uid"] for r in rows] == [f"{second}/1"]
    assert run((0.004,))[1] == []  # not the placement's two stages
    assert state.counters["slice_observations"] == 3

    # A timed decode iteration: one row per stage on Slices of their own, its batch of one new
    # token per sequence over the longest cached context.
    submit(state, "a")
    ((lease, _, _),) = state.grant("e2", 8)
    c = Completion(**{**done(lease.lease_id).__dict__, "prefill_stage_s": (0.004, 0.006),
                      "decode_stage_s": (0.001, None), "decode_batch": 3, "decode_context": 40})
    rows = [w.row for w in state.complete(c, state.completion_row("e2", c))]
    decode = [r for r in rows if r["phase"] == "decode"]
    assert [(r["uid"], r["device_id"], r["batch"], r["tokens"], r["context"], r["latency_s"]) for r in decode] == [
        (f"{lease.lease_id}/d0", "e2/cpu:0", 3, 3, 40, 0.001)]
    assert [r["context"] for r in rows if r["phase"] == "prefill"] == [0, 0]


def test_takers_are_the_executors_with_a_free_slot_on_a_replica_of_the_model() -> None:
    """Who a submission's wake-up goes to: the leaders of the model's replicas that have room,
    not draining ones, not full ones, not other models' executors."""
    state, _ = make_state(max_batch=2)
    assert state.takers(["a/m"], 1)[0] == {"e1"}
    guest = state.add_replica("a/m", ("e2/cpu:0",), guest=True)
    assert state.takers(["a/m"], 1)[0] == {"e1", "e2"}  # the index saw the new replica
    submit(state, "a", 2)
    assert len(state.grant("e1", 8)) == 2  # e1's home is full now
    assert state.takers(["a/m"], 1)[0] == {"e2"}
    guest.draining = True
    assert state.takers(["a/m"], 1)[0] == set()
    assert state.takers(["b/m"], 1)[0] == {"e2"}


def test_a_grant_sees_replicas_added_and_removed_after_the_last_one() -> None:
    state, _ = make_state()
    submit(state, "a", 2)
    assert state.grant("e2", 8) == []  # nothing of tenant a on e2
    state.add_replica("a/m", ("e2/cpu:0",), guest=True)
    assert len(state.grant("e2", 1)) == 1
    assert [r.replica_id for r in state.registry.replicas_led_on(["e1/cpu:0"])] == ["a/m@e1/cpu:0"]
    state.drop_executor("e1")
    assert state.registry.replicas_led_on(["e1/cpu:0"]) == []
    assert [r.replica_id for r in state.registry.replicas_of_model("a/m")] == ["a/m@e2/cpu:0"]


def test_a_wake_up_counts_one_executor_per_request_and_one_per_sliced_guest() -> None:
    """A sliced guest takes only what its peers leave: it is woken besides the peers, not
    instead of one of them."""
    state, _ = make_state()
    assert state.takers(["a/m"], 3)[1] == 3
    guest = state.add_replica("a/m", ("e2/cpu:0",), guest=True, yields=True)
    assert state.takers(["a/m"], 3)[1] == 4
    assert state.takers(["b/m"], 3)[1] == 3
    guest.draining = True
    assert state.takers(["a/m"], 3)[1] == 3

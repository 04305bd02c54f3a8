"""Queue policies: each policy's order on hand-made queues, the heap queue against the linear
reference, weighted fairness, aging against starvation (the wait bound of ``sjf`` and
``aging-spf`` as a property), and the registry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.queue import (
    QUEUE_POLICIES,
    QueuedRequest,
    QueuePolicy,
    RequestQueue,
    make_queue_policy,
    select_index,
)
from service.domain.error import InvalidInputError


def _q(rid: str, at: float, *, prompt: int = 100, est: int = 10, prio: int = 0, tenant: str = "a",
       weight: float = 1.0, true: int | None = None) -> QueuedRequest:
    return QueuedRequest(rid, tenant, "m", at, prompt, est, 0, prio, weight, true)


def _drain(policy: QueuePolicy, reqs: list[QueuedRequest]) -> list[str]:
    q: RequestQueue[str] = RequestQueue(policy)
    for r in reqs:
        q.push(r, r.request_id)
    return [q.pop({}) for _ in range(len(reqs))]


def test_fifo_is_arrival_order_and_ties_keep_push_order() -> None:
    reqs = [_q("a", 0.0), _q("b", 1.0, prio=5), _q("c", 1.0, est=1), _q("d", 0.5)]
    assert _drain(make_queue_policy("fifo"), reqs) == ["a", "d", "b", "c"]


def test_priority_orders_by_priority_then_arrival() -> None:
    reqs = [_q("lo", 0.0, prio=0), _q("hi2", 2.0, prio=2), _q("hi1", 1.0, prio=2), _q("mid", 0.5, prio=1)]
    assert _drain(make_queue_policy("priority"), reqs) == ["hi1", "hi2", "mid", "lo"]


def test_sjf_orders_by_estimate_within_its_bound_and_oracle_by_true_remaining_length() -> None:
    reqs = [_q("long", 0.0, est=500, true=10), _q("short", 1.0, est=5, true=900), _q("mid", 2.0, est=50, true=50),
            _q("short2", 0.5, est=5, true=1)]
    # all four arrive within 2 s, well inside every request's bound: shortest estimate first
    assert _drain(make_queue_policy("sjf", aging_tokens_per_s=20.0, max_delay_s=30.0), reqs) == [
        "short2", "short", "mid", "long"]
    assert _drain(make_queue_policy("oracle-remaining"), reqs) == ["short2", "long", "mid", "short"]


def test_sjf_counts_remaining_output_and_caps_any_estimate_at_max_delay() -> None:
    policy = make_queue_policy("sjf", aging_tokens_per_s=10.0, max_delay_s=30.0, prompt_weight=0.0)
    # 100 tokens left of 400: worth 10 s, so it goes before a 50-token request that arrived 6 s later
    part = QueuedRequest("part", "a", "m", 0.0, 100, 400, 300)
    assert _drain(policy, [part, _q("new", 6.0, est=50)]) == ["part", "new"]
    # an absurd estimate counts like a 300-token one (30 s): a request 31 s later does not pass it
    assert _drain(policy, [_q("huge", 0.0, est=10**9), _q("tiny", 31.0, est=1)]) == ["huge", "tiny"]
    assert _drain(policy, [_q("huge", 0.0, est=10**9), _q("tiny", 29.0, est=1)]) == ["tiny", "huge"]


def test_sjf_orders_by_output_by_default_and_counts_the_prompt_when_asked() -> None:
    # a 2,000-token prompt with a 10-token answer against a 100-token prompt with a 300-token answer
    reqs = [_q("long-prompt", 0.0, prompt=2000, est=10), _q("long-answer", 1.0, prompt=100, est=300)]
    # output only (the default): the short answer goes first
    assert _drain(make_queue_policy("sjf"), reqs) == ["long-prompt", "long-answer"]
    # remaining work: 2,010 against 400 tokens (13.4 s against 2.7 s at 150 tokens/s)
    work = make_queue_policy("sjf", prompt_weight=1.0, aging_tokens_per_s=150.0)
    assert _drain(work, reqs) == ["long-answer", "long-prompt"]
    # half weight: 1,010 against 350 tokens
    assert _drain(make_queue_policy("sjf", prompt_weight=0.5, aging_tokens_per_s=150.0), reqs) == \
        ["long-answer", "long-prompt"]
    with pytest.raises(InvalidInputError, match="prompt_weight"):
        make_queue_policy("sjf", prompt_weight=-1.0)


def _due(rid: str, at: float, deadline: float, *, est: int = 10, done: int = 0) -> QueuedRequest:
    return QueuedRequest(rid, "a", "m", at, 100, est, done, deadline_s=deadline)


def test_slack_orders_by_deadline_minus_predicted_remaining_work() -> None:
    policy = make_queue_policy("slack", token_s=0.1)
    # slack = deadline - 0.1 s per remaining token: 10 - 5 = 5, 8 - 1 = 7, 9 - 0 = 9 (its 100 tokens done), 6 - 2 = 4
    reqs = [_due("long", 0.0, 10.0, est=50), _due("soon", 1.0, 8.0, est=10), _due("done", 2.0, 9.0, est=100, done=100),
            _due("mid", 3.0, 6.0, est=20)]
    assert _drain(policy, reqs) == ["mid", "long", "soon", "done"]
    # with free work (token_s 0) it is earliest deadline first
    assert _drain(make_queue_policy("slack", token_s=0.0), reqs) == ["mid", "soon", "done", "long"]
    # equal slack goes by arrival, and a request with no deadline after every one with one, in arrival order
    reqs = [_due("none-late", 5.0, float("inf")), _due("b", 2.0, 7.0), _due("a", 1.0, 7.0), _due("none", 0.0, float("inf"))]
    assert _drain(policy, reqs) == ["a", "b", "none", "none-late"]
    assert policy.needs_estimate and not policy.needs_truth and not policy.fair_share


def test_a_deadline_is_the_sla_pace_for_the_length_or_the_end_to_end_target() -> None:
    from service.sim.sla import SlaClass

    sla = SlaClass("x", ttft_s=1.0, tbt_s=0.1, e2e_s=30.0, ttft_per_prompt_token_s=0.001)
    assert sla.deadline_s(500, 11) == pytest.approx(1.5 + 0.1 * 10)  # TTFT for 500 prompt tokens, then 10 gaps
    assert sla.deadline_s(0, 1000) == 30.0  # the end-to-end target comes first
    assert SlaClass("ttft-only", ttft_s=2.0).deadline_s(10, 1) == 2.0  # no TPOT target and one token: no nan
    assert SlaClass("none").deadline_s(10, 50) == float("inf")


def test_oracle_without_true_length_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="true_output_tokens"):
        make_queue_policy("oracle-remaining").key(_q("x", 0.0))


def test_aging_trades_priority_levels_for_waiting_time() -> None:
    policy = make_queue_policy("aging", aging_s=10.0)
    # the old low-priority request waited 15 s more: more than one level's worth
    assert _drain(policy, [_q("new-hi", 15.0, prio=1), _q("old-lo", 0.0, prio=0)]) == ["old-lo", "new-hi"]
    # only 5 s more: the level wins
    assert _drain(policy, [_q("new-hi", 5.0, prio=1), _q("old-lo", 0.0, prio=0)]) == ["new-hi", "old-lo"]


def test_aging_spf_prefers_short_prompts_until_the_long_one_has_waited_enough() -> None:
    policy = make_queue_policy("aging-spf", aging_tokens_per_s=1000.0)
    # 4000-token prompt at t=0: key 4 s; a 100-token prompt at t=3 has key 3.1 s, at t=4.5 key 4.6 s
    assert _drain(policy, [_q("long", 0.0, prompt=4000), _q("short", 3.0, prompt=100)]) == ["short", "long"]
    assert _drain(policy, [_q("long", 0.0, prompt=4000), _q("short", 4.5, prompt=100)]) == ["long", "short"]


def test_weighted_picks_the_tenant_with_least_served_tokens_per_weight() -> None:
    policy = make_queue_policy("weighted")
    q: RequestQueue[str] = RequestQueue(policy)
    for r in (_q("a1", 0.0, tenant="a"), _q("a2", 0.1, tenant="a"), _q("b1", 5.0, tenant="b", weight=2.0)):
        q.push(r, r.request_id)
    # a: 100/1 = 100, b: 150/2 = 75 -> b first although it arrived last
    assert q.peek({"a": 100.0, "b": 150.0}) == "b1"
    assert q.pop({"a": 100.0, "b": 150.0}) == "b1"
    assert q.pop({"a": 100.0, "b": 150.0}) == "a1"  # b has nothing queued any more


@pytest.mark.parametrize("weights", [(1.0, 1.0), (1.0, 3.0), (2.0, 5.0)])
def test_weighted_fair_share_converges_to_the_weights(weights: tuple[float, float]) -> None:
    policy = make_queue_policy("weighted")
    q: RequestQueue[str] = RequestQueue(policy)
    served: dict[str, float] = {"a": 0.0, "b": 0.0}
    cost = {"a": 70, "b": 130}  # different request sizes: fairness is in tokens, not requests
    w = dict(zip("ab", weights, strict=True))
    t = 0.0
    for tenant in "ab":  # both tenants stay backlogged: refill after each pop
        for _ in range(3):
            t += 1.0
            q.push(_q(f"{tenant}{t}", t, tenant=tenant, weight=w[tenant], prompt=cost[tenant]), tenant)
    for _ in range(3000):
        tenant = q.pop(served)
        served[tenant] += cost[tenant]
        t += 1.0
        q.push(_q(f"{tenant}{t}", t, tenant=tenant, weight=w[tenant], prompt=cost[tenant]), tenant)
    ratio = (served["b"] / served["a"]) / (w["b"] / w["a"])
    assert ratio == pytest.approx(1.0, rel=0.01)


def _starvation_steps(policy: QueuePolicy, *, victim: QueuedRequest, stream: str, steps: int = 100) -> int | None:
    """Push the victim at t=0, then every second push one stream request and pop one; the step
    at which the victim is served, or None."""
    q: RequestQueue[str] = RequestQueue(policy)
    q.push(victim, victim.request_id)
    for k in range(1, steps + 1):
        extra = (_q(f"s{k}", float(k), prio=1) if stream == "priority" else _q(f"s{k}", float(k), prompt=10))
        q.push(extra, extra.request_id)
        if q.pop({}) == victim.request_id:
            return k
    return None


def test_priority_starves_a_low_priority_request_and_aging_serves_it() -> None:
    victim = _q("victim", 0.0, prio=0)
    assert _starvation_steps(make_queue_policy("priority"), victim=victim, stream="priority") is None
    served_at = _starvation_steps(make_queue_policy("aging", aging_s=10.0), victim=victim, stream="priority")
    assert served_at is not None and served_at <= 11


def test_aging_spf_serves_a_long_prompt_under_a_stream_of_short_ones() -> None:
    victim = _q("victim", 0.0, prompt=8000)
    served_at = _starvation_steps(make_queue_policy("aging-spf", aging_tokens_per_s=1000.0), victim=victim,
                                  stream="short")
    assert served_at is not None and served_at <= 9
    # a huge prompt waits at most max_delay_s
    served_at = _starvation_steps(make_queue_policy("aging-spf", aging_tokens_per_s=10.0, max_delay_s=20.0),
                                  victim=_q("victim", 0.0, prompt=10**6), stream="short")
    assert served_at is not None and served_at <= 20


def test_sjf_serves_a_long_request_under_a_stream_of_short_ones_within_its_bound() -> None:
    victim = _q("victim", 0.0, est=50_000)
    # stream requests (prompt 10, estimate 10, arriving one per second) are worth 0.13 s: those arriving
    # within 30 s of the victim go first, the one arriving at 30 s does not
    assert _starvation_steps(make_queue_policy("sjf"), victim=victim, stream="short") == 30
    assert _starvation_steps(make_queue_policy("sjf", max_delay_s=5.0), victim=victim, stream="short") == 5
    # without the cap the same request would wait 50_100 / 150 = 334 s: starvation
    assert _starvation_steps(make_queue_policy("sjf", max_delay_s=1e6), victim=victim, stream="short") is None


_BOUNDED = {"sjf": lambda r: r.prompt_tokens + r.estimated_output_tokens - r.generated_tokens,
            "aging-spf": lambda r: r.prompt_tokens}


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 100_000), st.integers(0, 3)), min_size=2,
                     max_size=60),
       name=st.sampled_from(sorted(_BOUNDED)), rate=st.floats(0.5, 2000.0), max_delay=st.floats(0.0, 60.0),
       pops_per_arrival=st.integers(0, 2))
def test_no_request_is_passed_by_one_arriving_later_than_its_bound(
        rows: list[tuple[int, int, int]], name: str, rate: float, max_delay: float, pops_per_arrival: int) -> None:
    """Requests arrive in time order (0.25 s apart at most) and the server pops some after each
    arrival: whenever a request is popped while an older one still waits, it arrived no later than
    the older one's bound, ``min(size / rate, max_delay)`` after it."""
    policy = make_queue_policy(name, aging_tokens_per_s=rate, max_delay_s=max_delay)
    size = _BOUNDED[name]
    arrivals = sorted(at / 4 for at, _, _ in rows)
    reqs = [_q(f"r{i}", at, prompt=n, est=n) for i, (at, (_, n, _)) in enumerate(zip(arrivals, rows, strict=True))]
    q: RequestQueue[QueuedRequest] = RequestQueue(policy)
    waiting: dict[str, QueuedRequest] = {}

    def pop() -> None:
        got = q.pop({})
        del waiting[got.request_id]
        for older in waiting.values():
            assert got.arrival_s <= older.arrival_s + min(size(older) / rate, max_delay)

    for r, (_, _, pops) in zip(reqs, rows, strict=True):
        q.push(r, r)
        waiting[r.request_id] = r
        for _ in range(min(pops, pops_per_arrival, len(q))):
            pop()
    while len(q):
        pop()


def test_unknown_policy_names_the_known_ones_and_bad_parameters_are_refused() -> None:
    with pytest.raises(InvalidInputError) as err:
        make_queue_policy("lifo")
    assert all(name in str(err.value) for name in QUEUE_POLICIES)
    with pytest.raises(InvalidInputError, match="bad parameters"):
        make_queue_policy("fifo", aging_s=3.0)
    with pytest.raises(InvalidInputError, match="aging_s"):
        make_queue_policy("aging", aging_s=0.0)
    for name in ("sjf", "aging-spf"):
        for bad in ({"aging_tokens_per_s": 0.0}, {"aging_tokens_per_s": float("inf")}, {"max_delay_s": -1.0},
                    {"max_delay_s": float("inf")}, {"max_delay_s": float("nan")}):
            with pytest.raises(InvalidInputError, match=next(iter(bad))):
                make_queue_policy(name, **bad)
    for bad_token_s in (-0.1, float("inf"), float("nan")):
        with pytest.raises(InvalidInputError, match="token_s"):
            make_queue_policy("slack", token_s=bad_token_s)
    assert set(QUEUE_POLICIES) == {"fifo", "priority", "weighted", "sjf", "aging", "aging-spf", "oracle-remaining",
                                   "slack", "aging-sla", "deadline"}


def test_an_empty_queue_refuses_to_select() -> None:
    with pytest.raises(InvalidInputError):
        RequestQueue(make_queue_policy("fifo")).peek({})
    with pytest.raises(InvalidInputError):
        select_index(make_queue_policy("fifo"), [], {})


_requests = st.lists(
    st.tuples(st.integers(0, 20), st.integers(1, 5000), st.integers(1, 500), st.integers(0, 3),
              st.sampled_from("abc"), st.integers(1, 500)),
    min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(rows=_requests, name=st.sampled_from(sorted(QUEUE_POLICIES)), pops_between=st.integers(1, 3))
def test_the_heap_queue_pops_what_the_linear_reference_selects(
        rows: list[tuple[int, int, int, int, str, int]], name: str, pops_between: int) -> None:
    policy = make_queue_policy(name)
    weights = {"a": 1.0, "b": 2.0, "c": 0.5}
    reqs = [_q(f"r{i}", float(at) / 2, prompt=p, est=e, prio=prio, tenant=t, weight=weights[t], true=true)
            for i, (at, p, e, prio, t, true) in enumerate(rows)]
    queue: RequestQueue[QueuedRequest] = RequestQueue(policy)
    pending: list[QueuedRequest] = []  # push order, for the reference
    served: dict[str, float] = {}
    for i, r in enumerate(reqs):
        queue.push(r, r)
        pending.append(r)
        if i % pops_between == 0 or i == len(reqs) - 1:
            while pending and (i == len(reqs) - 1 or len(pending) > 2):
                expect = pending.pop(select_index(policy, pending, served))
                got = queue.pop(served)
                assert got is expect
                served[got.tenant_id] = served.get(got.tenant_id, 0.0) + got.prompt_tokens
    assert len(queue) == 0


def test_a_copied_queue_keeps_its_order_and_converts_items() -> None:
    policy = make_queue_policy("sjf", aging_tokens_per_s=1.0, prompt_weight=0.0)
    q: RequestQueue[str] = RequestQueue(policy)
    for r in (_q("x", 0.0, est=30), _q("y", 1.0, est=10), _q("z", 2.0, est=10)):
        q.push(r, r.request_id)
    c = q.copy(str.upper)
    c.push(_q("w", 3.0, est=10), "W")
    assert [c.pop({}) for _ in range(4)] == ["Y", "Z", "W", "X"]
    assert len(q) == 3 and sorted(q) == ["x", "y", "z"]  # the original is unchanged


def test_fifo_queue_orders_like_a_fifo_request_queue_and_hands_off_newest_first() -> None:
    from service.core.queue import FifoQueue, make_waiting_queue

    policy = make_queue_policy("fifo")
    fast: FifoQueue[str] = FifoQueue()
    heap: RequestQueue[str] = RequestQueue(policy)
    assert isinstance(make_waiting_queue(policy), FifoQueue)
    assert isinstance(make_waiting_queue(make_queue_policy("sjf")), RequestQueue)
    for i in range(6):
        q = QueuedRequest(f"r{i}", "t", "m", float(i), 10, 0)
        fast.push(q, q.request_id)
        heap.push(q, q.request_id)
    assert fast.peek({}) == heap.peek({}) == "r0"
    assert [fast.pop({}), fast.pop({})] == [heap.pop({}), heap.pop({})] == ["r0", "r1"]
    assert fast.take(2, {}) == ["r5", "r4"]  # from the back, leaving the head in place
    assert heap.take(2, {}) == ["r2", "r3"]  # in admission order
    assert list(fast.copy(str.upper)) == ["R2", "R3"] and len(fast) == 2
    with pytest.raises(InvalidInputError):
        FifoQueue[str]().peek({})

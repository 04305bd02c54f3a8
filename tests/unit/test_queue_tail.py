"""Queue policies that cut the tail: ``aging-sla`` (shortest predicted work first, deferred at
most by its SLA slack, with the starvation bound its docstring states held as a property under
random arrivals) and ``deadline`` (latest start from predicted remaining work)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.queue import (
    AgingSlaPolicy,
    DeadlinePolicy,
    QueuedRequest,
    QueuePolicy,
    RequestQueue,
    WorkModel,
    make_queue_policy,
)
from service.domain.error import InvalidInputError

WORK = WorkModel(prefill_s_per_token=1e-3, decode_s_per_token=0.1)  # round numbers: 1 ms/prompt token, 0.1 s/token


def _r(rid: str, at: float, *, prompt: int = 0, est: int = 10, deadline: float = math.inf, done: int = 0
       ) -> QueuedRequest:
    return QueuedRequest(rid, "a", "m", at, prompt, est, done, deadline_s=deadline)


def _drain(policy: QueuePolicy, reqs: list[QueuedRequest]) -> list[str]:
    q: RequestQueue[str] = RequestQueue(policy)
    for r in reqs:
        q.push(r, r.request_id)
    return [q.pop({}) for _ in reqs]


def test_aging_sla_serves_short_predicted_work_first_and_never_defers_the_tail() -> None:
    # p90 work 5 s, p99 10 s, cap 30 s; work: 1 ms per prompt token, 0.1 s per output token
    policy = AgingSlaPolicy(work_p90_s=5.0, work_p99_s=10.0, max_delay_s=30.0, prefill_s_per_token=1e-3,
                            decode_s_per_token=0.1)
    # allowance min(slack, 30): p90-work "mid" (5 s, slack 95) waits 30 s; 1 s of work a fifth of it;
    # 7.5 s (between p90 and p99) half; the p99 request and longer ones not at all
    assert policy.delay_s(_r("mid", 0.0, est=50, deadline=100.0)) == pytest.approx(30.0)
    assert policy.delay_s(_r("short", 0.0, est=10, deadline=100.0)) == pytest.approx(6.0)
    assert policy.delay_s(_r("longer", 0.0, est=75, deadline=100.0)) == pytest.approx(15.0)
    assert policy.delay_s(_r("p99", 0.0, est=100, deadline=100.0)) == 0.0
    assert policy.delay_s(_r("huge", 0.0, est=10**6)) == 0.0
    mid = _r("mid", 0.0, est=50, deadline=100.0)
    assert _drain(policy, [mid, _r("short", 20.0, est=10, deadline=60.0)]) == ["short", "mid"]  # 26 < 30
    assert _drain(policy, [mid, _r("short", 25.0, est=10, deadline=60.0)]) == ["mid", "short"]  # 31 > 30
    # the tail keeps its place: a long request goes before shorter work arriving just behind it
    assert _drain(policy, [_r("p99", 0.0, est=100, deadline=100.0), _r("short", 0.5, est=10, deadline=60.0)]) == [
        "p99", "short"]
    # the SLA: with 2 s of slack a p90-work request waits 2 s, not 30
    assert policy.delay_s(_r("tight", 0.0, est=50, deadline=7.0)) == pytest.approx(2.0)
    assert policy.delay_s(_r("late", 0.0, est=50, deadline=3.0)) == 0.0
    # the prompt counts: 4,000 prompt tokens are 4 s of work (24 s) against an answer of 2 s (12 s)
    assert _drain(policy, [_r("prompt", 0.0, prompt=4000, est=1), _r("answer", 10.0, est=20)]) == [
        "answer", "prompt"]


def test_aging_sla_derives_its_rate_per_model_from_the_predictors_quantiles_and_refuses_bad_parameters() -> None:
    p = AgingSlaPolicy.derive({"m": ({0.5: 2.0, 0.9: 6.0, 0.99: 12.0}, WORK),
                               "small": ({0.9: 0.5, 0.99: 1.0}, WorkModel(0.0, 0.01))}, max_delay_s=20.0)
    assert p.max_delay_s == 20.0 and p.by_model["m"] == (1e-3, 0.1, 6.0, 12.0)
    # each model's own scale: 60 tokens are 6 s of "m" work (its p90: the whole 20 s) but 0.6 s of
    # "small" work, between its p90 (0.5) and p99 (1.0): (1.0 - 0.6) / 0.5 = 0.8 of the 20 s
    assert p.delay_s(QueuedRequest("a", "t", "m", 0.0, 0, 60)) == pytest.approx(20.0)
    assert p.delay_s(QueuedRequest("b", "t", "small", 0.0, 0, 60)) == pytest.approx(16.0)
    assert p.delay_s(QueuedRequest("c", "t", "other", 0.0, 0, 60)) == pytest.approx(  # the defaults: 60 x 0.78 ms
        20.0 * 60 * (0.025 / 32) / 0.5)
    with pytest.raises(InvalidInputError, match=r"0\.9 and 0\.99"):
        AgingSlaPolicy.derive({"m": ({0.5: 2.0, 0.99: 3.0}, WORK)})
    for bad in ({"work_p90_s": 0.0}, {"work_p99_s": 0.1}, {"max_delay_s": math.inf}, {"decode_s_per_token": -1.0}):
        with pytest.raises(InvalidInputError, match=next(iter(bad))):
            make_queue_policy("aging-sla", **bad)
    with pytest.raises(InvalidInputError, match="of 'x'"):
        AgingSlaPolicy(by_model={"x": (0.0, 0.1, 2.0, 1.0)})


def _single_server(policy: QueuePolicy, reqs: list[QueuedRequest], service_s: list[float]) -> dict[str, float]:
    """Waits on one work-conserving server taking one request at a time in the policy's order."""
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i].arrival_s, i))
    q: RequestQueue[int] = RequestQueue(policy)
    waits: dict[str, float] = {}
    now, k = 0.0, 0
    while k < len(order) or len(q):
        if not len(q):
            now = max(now, reqs[order[k]].arrival_s)
        while k < len(order) and reqs[order[k]].arrival_s <= now:
            q.push(reqs[order[k]], order[k])
            k += 1
        i = q.pop({})
        waits[reqs[i].request_id] = now - reqs[i].arrival_s
        now += service_s[i]
    return waits


def _unfinished_work(reqs: list[QueuedRequest], service_s: list[float], t: float) -> float:
    """V(t): the work in the system at t (the same for every work-conserving order: FIFO's)."""
    done = 0.0
    for i in sorted(range(len(reqs)), key=lambda i: (reqs[i].arrival_s, i)):
        if reqs[i].arrival_s > t:
            break
        done = max(done, reqs[i].arrival_s) + service_s[i]
    return max(0.0, done - t)


_rows = st.lists(st.tuples(st.floats(0.0, 60.0), st.floats(0.05, 4.0), st.integers(0, 400), st.integers(0, 4000),
                           st.floats(0.0, 120.0)), min_size=1, max_size=40)


@settings(max_examples=120, deadline=None)
@given(rows=_rows, p90=st.floats(0.5, 20.0), spread=st.floats(0.0, 20.0), cap=st.floats(0.0, 30.0))
def test_aging_sla_never_lets_a_request_wait_past_its_stated_bound(
        rows: list[tuple[float, float, int, int, float]], p90: float, spread: float, cap: float) -> None:
    """Random arrivals, true service times unrelated to the estimates (estimates can be wildly
    wrong), random deadlines: every request waits at most ``delay + V(arrival + delay)``, and so
    at most ``max_delay_s`` more than FIFO would make a request arriving that much later wait."""
    policy = AgingSlaPolicy(work_p90_s=p90, work_p99_s=p90 + spread, max_delay_s=cap, prefill_s_per_token=1e-3,
                            decode_s_per_token=0.05)
    reqs = [_r(f"r{i}", at, prompt=prompt, est=est, deadline=at + slack)
            for i, (at, _, est, prompt, slack) in enumerate(rows)]
    service = [s for _, s, _, _, _ in rows]
    waits = _single_server(policy, reqs, service)
    for r in reqs:
        delay = policy.delay_s(r)
        assert 0.0 <= delay <= cap
        assert waits[r.request_id] <= delay + _unfinished_work(reqs, service, r.arrival_s + delay) + 1e-6
        assert waits[r.request_id] <= cap + _unfinished_work(reqs, service, r.arrival_s + cap) + 1e-6


def test_deadline_orders_by_latest_start_from_predicted_remaining_work() -> None:
    policy = DeadlinePolicy(margin=1.0, prefill_s_per_token=1e-3, decode_s_per_token=0.1)
    # latest starts: a 20 - (2 + 5) = 13; b 15 - 1 = 14; c 16 - 0 (its 50 tokens done, no prompt) = 16; d 12 - 3 = 9
    reqs = [_r("a", 0.0, prompt=2000, est=50, deadline=20.0), _r("b", 1.0, est=10, deadline=15.0),
            _r("c", 2.0, est=50, done=50, deadline=16.0), _r("d", 3.0, est=30, deadline=12.0),
            _r("none", 0.5, est=1), _r("none-later", 4.0, est=1)]
    assert _drain(policy, reqs) == ["d", "a", "b", "c", "none", "none-later"]
    # counting the prefill is what moves "a" ahead: decode alone gives a 15, after b (14)
    assert _drain(DeadlinePolicy(1.0, 0.0, 0.1), reqs[:3]) == ["b", "a", "c"]
    # a cautious margin (the predictor's p90 over its median) moves long work earlier still
    wide = DeadlinePolicy.derive({"m": ({0.5: 1.0, 0.9: 3.0}, WORK)})
    assert wide.by_model["m"] == (3.0, 1e-3, 0.1)
    assert _drain(wide, [_r("short", 0.0, est=5, deadline=10.0), _r("long", 1.0, est=30, deadline=14.0)]) == [
        "long", "short"]  # 14 - 9 = 5 before 10 - 1.5 = 8.5
    with pytest.raises(InvalidInputError, match=r"0\.5"):
        DeadlinePolicy.derive({"m": ({0.9: 3.0}, WORK)})
    with pytest.raises(InvalidInputError, match="margin"):
        make_queue_policy("deadline", margin=-1.0)

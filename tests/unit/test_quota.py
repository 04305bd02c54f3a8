"""The quota meters: a token bucket that passes a burst and refuses a sustained excess, and a
sliding-window meter of device-seconds, with the waits they promise."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from service.domain.error import QuotaExceededError
from service.domain.quota import Quota, TokenBucket, WindowMeter
from service.live.quota import QuotaBook


def test_a_bucket_passes_its_burst_then_refills_at_its_rate() -> None:
    b = TokenBucket(10.0, burst_s=2.0, now_s=0.0)  # holds 20 tokens
    assert b.wait_s(20, 0.0) == 0.0
    b.take(20, 0.0)
    assert b.wait_s(5, 0.0) == 0.5  # 5 tokens at 10/s
    assert b.wait_s(5, 0.5) == 0.0
    assert math.isinf(b.wait_s(21, 100.0))  # never: more than it holds
    b.refund(100, 0.5)
    assert b.level == 20.0  # a refund never overfills


@given(st.lists(st.tuples(st.floats(0, 5), st.integers(1, 30)), max_size=40))
def test_a_bucket_never_admits_more_than_its_rate_allows(steps: list[tuple[float, int]]) -> None:
    rate, burst = 10.0, 3.0
    b, now, admitted = TokenBucket(rate, burst, 0.0), 0.0, 0
    for dt, tokens in steps:
        now += dt
        if b.wait_s(tokens, now) == 0.0:
            b.take(tokens, now)
            admitted += tokens
    assert admitted <= rate * burst + rate * now + 1e-6


def test_the_window_meter_forgets_what_is_older_than_its_window() -> None:
    m = WindowMeter(window_s=10.0)
    m.add(4.0, 0.0)
    m.add(3.0, 5.0)
    assert m.used(9.0) == 7.0
    assert m.wait_s(5.0, 9.0) == 1.0  # at 10 s the first 4 go, leaving 3 < 5
    assert m.used(10.0) == 3.0 and m.total == 7.0
    assert m.wait_s(5.0, 10.0) == 0.0


def test_admission_is_all_or_nothing_across_tenant_and_project() -> None:
    book = QuotaBook()
    tenant, project = Quota(tokens_per_s=100.0), Quota(tokens_per_s=1.0)  # project bucket: 10 tokens
    scopes = [("t", None, tenant), ("t", "p", project)]
    book.admit(scopes, 10, 0.0)
    try:
        book.admit(scopes, 10, 0.0)
    except QuotaExceededError as exc:
        assert 9.0 < exc.retry_after_s <= 10.0 and "project 'p'" in str(exc)
    else:
        raise AssertionError("the project's quota did not bind")
    assert book.of("t", None).tokens_admitted == 10  # the refused request charged the tenant nothing
    assert book.of("t", None).refused == 1 and book.of("t", "p").refused == 1
    book.refund("t", "p", 10, 0.0)
    book.admit(scopes, 10, 0.0)  # the refund made room


def test_device_seconds_of_the_last_hour_bound_admission() -> None:
    book = QuotaBook()
    scopes = [("t", None, Quota(device_s_per_hour=60.0))]
    book.admit(scopes, 1, 0.0)
    book.charge_device_s("t", "default", 60.0, 100.0)
    try:
        book.admit(scopes, 1, 200.0)
    except QuotaExceededError as exc:
        assert exc.retry_after_s == 3600.0 - 100.0  # the charge ages out an hour after it was made
    else:
        raise AssertionError("spent device-seconds did not bind")
    book.admit(scopes, 1, 3700.0)

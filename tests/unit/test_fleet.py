"""benchmarks/fleet.py's own parts (the fleet itself runs against a real service in the benchmark)."""

from __future__ import annotations

from benchmarks import fleet
from service.api.app import FULL_COLLECTION_AFTER


def test_the_fleet_process_collects_as_rarely_as_serve() -> None:
    assert fleet.FULL_COLLECTION_AFTER == FULL_COLLECTION_AFTER


def test_the_trace_cursor_cycles_and_starts_where_the_seed_says() -> None:
    trace = [(0.0, 1), (1.0, 2), (2.0, 3), (3.0, 4)]
    a, b = fleet.TraceCursor(trace, seed=5), fleet.TraceCursor(trace, seed=5)
    assert a.due(10.0, 6) == b.due(10.0, 6)  # the same seed, the same feed
    c = fleet.TraceCursor(trace, seed=0)
    tokens = [n for _, n in trace]
    first = c.i
    assert c.due(0.0, 10)[0] == tokens[first]  # trace time 0 is the seeded request
    assert c.due(0.5, 10) == []  # nothing new before the next request's time
    assert len(c.due(100.0, 3)) == 3  # at most `limit` a call
    assert len(c.due(100.0, 1000)) > len(trace)  # past the end it goes round again

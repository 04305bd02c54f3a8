"""Renewals past a lease's expected end move its busy window (a slice_extend write); the GMG
writer folds them into the batch's other Slice writes. No server, no Neo4j."""

from __future__ import annotations

import asyncio
from typing import Any

from service.live.records import Write
from service.live.writer import GmgWriter
from tests.unit.test_live_state import make_state, submit


def test_a_renewal_past_the_expected_end_moves_it_and_one_inside_writes_nothing() -> None:
    state, clock = make_state()
    extended: list[Write] = []
    state.book.on_extend = extended.extend
    state.iteration_s["tiny"] = 1.0  # measured: 3 tokens expected to take 3 s
    submit(state, "a", 1, max_tokens=3)
    [(lease, _, _)] = state.grant("e1", 1)
    assert lease.expected_end_wall == lease.granted_wall + 3.0
    state.heartbeat("e1", 0.0, [lease.lease_id])  # at the grant: renewed to t + 5 s, past the 3 s estimate
    assert [w.row for w in extended] == [{"uid": lease.lease_id, "end_s": clock.t + 5.0}]
    assert lease.expected_end_wall == clock.t + 5.0 and extended[0].kind == "slice_extend"
    clock.t += 0.5
    state.renew(lease.lease_id)  # the renew route too
    assert extended[-1].row == {"uid": lease.lease_id, "end_s": clock.t + 5.0}


def test_a_renewal_within_the_estimate_writes_nothing() -> None:
    state, clock = make_state()
    extended: list[Write] = []
    state.book.on_extend = extended.extend
    state.iteration_s["tiny"] = 10.0  # 3 tokens: 30 s expected, renewals reach 5 s ahead
    submit(state, "a", 1, max_tokens=3)
    [(lease, _, _)] = state.grant("e1", 1)
    for _ in range(5):
        clock.t += 2.0
        state.heartbeat("e1", 0.0, [lease.lease_id])
    assert extended == [] and lease.expected_end_wall == lease.granted_wall + 30.0
    clock.t += 22.0  # now 2 s before its estimate: the renewal reaches past it
    state.heartbeat("e1", 0.0, [lease.lease_id])
    assert [w.row["end_s"] for w in extended] == [clock.t + 5.0]


class _Repo:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[dict[str, Any]]]] = []

    def __getattr__(self, name: str) -> Any:
        if name in ("live", "cluster", "slots"):  # the repository's parts: one log of calls
            return self
        return lambda rows: self.calls.append((name, list(rows)))


def test_the_writer_writes_extensions_after_creations_and_folds_or_drops_them() -> None:
    repo = _Repo()
    writer = GmgWriter(repo)  # type: ignore[arg-type]
    new = {"uid": "L1", "end_s": 10.0, "end_wall": None, "state": "running"}
    writer.submit([Write("slice_new", new), Write("slice_extend", {"uid": "L1", "end_s": 15.0}),
                   Write("slice_extend", {"uid": "L2", "end_s": 20.0}), Write("slice_extend", {"uid": "L2", "end_s": 21.0}),
                   Write("slice_extend", {"uid": "L3", "end_s": 30.0}),
                   Write("slice_end", {"uid": "L3", "state": "done", "end_s": 25.0, "end_wall": 25.0})])
    asyncio.run(writer.flush())
    calls = dict(repo.calls)
    assert calls["create_slices"] == [{**new, "end_s": 15.0}]  # created with its renewed end
    assert calls["extend_slices"] == [{"uid": "L2", "end_s": 21.0}]  # the newest renewal; L3 ended: moot
    assert [name for name, _ in repo.calls] == ["create_slices", "extend_slices", "end_slices"]
    assert writer.pending == 0

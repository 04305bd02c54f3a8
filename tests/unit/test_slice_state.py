"""One Slice state vocabulary: every state a Cypher file names is a SliceState, the busy-window
cache counts exactly the busy states, and a live lease is written running with its expected
window, then with its real end (no server, no Neo4j)."""

from __future__ import annotations

import re
from importlib import resources

from service.domain.slice_state import BUSY_SLICE_STATES, SliceState
from tests.unit.test_live_state import done, make_state, submit

_STATE_LITERAL = re.compile(r"\bs\.state\s*(?:=|<>)\s*'(\w+)'|Slice\s*\{state:\s*'(\w+)'\}")
_STATE_LIST = re.compile(r"\bs\.state\s+IN\s+\[([^\]]*)\]")


def cypher_files() -> dict[str, str]:
    out: dict[str, str] = {}

    def walk(folder: object) -> None:
        for entry in folder.iterdir():  # type: ignore[attr-defined]
            if entry.is_dir():
                walk(entry)
            elif entry.name.endswith(".cypher"):
                out[entry.name] = entry.read_text()

    walk(resources.files("cypher"))
    return out


def test_cypher_names_only_slice_states_and_the_cache_counts_the_busy_ones() -> None:
    named: set[str] = set()
    busy_lists = []
    for name, text in cypher_files().items():
        for m in _STATE_LITERAL.finditer(text):
            named.add(m.group(1) or m.group(2))
        for m in _STATE_LIST.finditer(text):
            states = tuple(re.findall(r"'(\w+)'", m.group(1)))
            named.update(states)
            busy_lists.append((name, states))
    assert named <= {s.value for s in SliceState}, named - {s.value for s in SliceState}
    assert {name for name, _ in busy_lists} == {"refresh_busy_windows.cypher", "refresh_device_state.cypher"}
    assert all(states == tuple(s.value for s in BUSY_SLICE_STATES) for _, states in busy_lists)


def test_a_lease_is_running_over_its_expected_window_then_ends_at_its_real_end() -> None:
    state, clock = make_state()
    submit(state, "a", 2, max_tokens=3)
    [(lease, _, _)] = state.grant("e1", 1)
    new = state.slice_row(lease, SliceState.RUNNING)
    assert new.kind == "slice_new" and new.row["state"] == "running"
    # nothing measured yet for the family: the lease's time to live (5 s here)
    assert (new.row["start_s"], new.row["end_s"]) == (clock.t, clock.t + 5.0)
    clock.t += 0.5
    row = state.completion_row("e1", done(lease.lease_id))
    assert (row["slice"]["start_s"], row["slice"]["end_s"]) == (clock.t - 0.5, clock.t)
    state.complete(done(lease.lease_id), row)
    # measured now (0.05 s over 3 iterations): the next lease is expected to take 3 of them
    [(second, _, _)] = state.grant("e1", 1)
    window = state.slice_row(second, SliceState.RUNNING).row
    assert abs(window["end_s"] - window["start_s"] - 3 * 0.05 / 3) < 1e-9
    clock.t += 0.1
    end = state.slice_row(second, SliceState.EXPIRED).row
    assert end["state"] == "expired" and end["end_s"] == end["end_wall"] == clock.t

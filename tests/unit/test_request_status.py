"""Request statuses: one enum whose values are the strings the API answers and the GMG stores."""

from __future__ import annotations

from service.domain.request import TERMINAL_STATUSES, RequestStatus
from service.live.records import STATUSES, LiveRequest


def test_the_api_lists_the_same_strings_as_before() -> None:
    assert STATUSES == ("queued", "leased", "cancelled", "done", "failed")
    assert all(type(s) is str for s in STATUSES)
    assert {s for s in RequestStatus if s.is_terminal} == TERMINAL_STATUSES == {"done", "cancelled", "failed"}


def test_rows_for_neo4j_and_answers_hold_plain_strings() -> None:
    req = LiveRequest("r1", "t1", "m1", [1, 2], 4, "standard", 4, 0.0, status=RequestStatus.LEASED)
    for row in (req.row(), req.update_row(), req.public()):
        assert type(row["status"]) is str and row["status"] == "leased"

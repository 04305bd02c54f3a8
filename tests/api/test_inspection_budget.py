"""Inspection cannot starve the lease path (issue 41's hand probes: ten long admin queries made
every submission 503 for about 100 s): a query is stopped in Neo4j at the inspection timeout, an
answer holds at most SLICESCHED_INSPECT_MAX_ROWS rows and says it was cut, and past
SLICESCHED_MAX_INSPECTIONS running at once one more is refused at once; none of these answers
tells the caller to retry with an Idempotency-Key (nothing was written)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.domain.error import DatabaseUnavailableError
from tests.api.conftest import ADMIN, auth, new_tenant

SLOW = "UNWIND range(1, 2000000000) AS x WITH x WHERE x = -1 RETURN count(x) AS n"


def _inspect(client: TestClient, key: str, **body: Any) -> httpx.Response:
    return client.post("/v1/inspect", json=body, headers=auth(key))


def _until(condition: Callable[[], bool], what: str, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"never: {what}"
        time.sleep(0.02)


def test_answers_hold_at_most_the_row_cap_and_say_so(make_client: Callable[..., TestClient], uid: str) -> None:
    client = make_client(inspect_max_rows=5)
    r = _inspect(client, ADMIN, query="UNWIND range(1, 20) AS x RETURN x")
    assert r.status_code == 200 and r.json() == {"columns": ["x"], "rows": [[x] for x in range(1, 6)], "truncated": True}
    r = _inspect(client, ADMIN, query="UNWIND range(1, 5) AS x RETURN x")
    assert r.json()["truncated"] is False and len(r.json()["rows"]) == 5
    key = new_tenant(client, f"rc{uid}")
    assert _inspect(client, key, name="my_requests").json() == {
        "columns": ["request", "model", "status", "prompt_tokens", "max_tokens", "attempts", "ttft_s", "e2e_s"],
        "rows": [], "truncated": False}


def test_a_spent_budget_refuses_at_once_and_the_lease_path_goes_on(make_client: Callable[..., TestClient],
                                                                    uid: str) -> None:
    client = make_client(max_inspections=2)
    reads = client.app.state.service.reads  # type: ignore[attr-defined]
    key = new_tenant(client, f"ib{uid}")
    # inspections hold both slots (through the real gate and worker threads) until the test lets them go
    release = threading.Event()
    portal = client.portal  # type: ignore[attr-defined]
    held = portal.start_task_soon(partial(reads._inspection, release.wait, bound_s=None))
    try:
        _until(lambda: reads.inspections == 1, "the held inspection takes the budget")
        # a caller that stops waiting at its bound gets a read's 503; its slot stays taken while its thread runs
        with pytest.raises(DatabaseUnavailableError) as late:
            portal.call(partial(reads._inspection, release.wait, bound_s=0.2))
        assert "did not answer this read within 0.2 s (it changes nothing)" in str(late.value)
        assert "Idempotency" not in str(late.value) and reads.inspections == 2
        for who, body in ((ADMIN, {"query": "RETURN 1 AS one"}), (key, {"name": "my_requests"})):
            r = _inspect(client, who, **body)
            assert r.status_code == 429, r.text
            error = r.json()["error"]
            assert error["kind"] == "overloaded" and "SLICESCHED_MAX_INSPECTIONS" in error["message"]
            assert "Idempotency" not in error["message"] and r.headers["Retry-After"] == "1"
        # the lease path is not behind it: registration and a submission still land
        assert client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"},
                           headers=auth(key)).status_code == 201
        assert client.post("/v1/requests", json={"model_id": "m", "prompt": "hi", "max_tokens": 2},
                           headers=auth(key)).status_code == 202
    finally:
        release.set()
    assert held.result(timeout=60) is True
    # the budget is back once the inspection's thread has ended
    _until(lambda: reads.inspections == 0, "the budget is released")
    assert _inspect(client, ADMIN, query="RETURN 1 AS one").json()["rows"] == [[1]]


def test_a_long_query_is_stopped_in_neo4j_at_the_timeout(make_client: Callable[..., TestClient]) -> None:
    client = make_client(inspect_timeout_s=1.0)
    r = _inspect(client, ADMIN, query=SLOW)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "ran past the inspection bound (1 s) and was stopped in Neo4j" in message and "Idempotency" not in message
    reads = client.app.state.service.reads  # type: ignore[attr-defined]
    _until(lambda: reads.inspections == 0, "the budget is released")

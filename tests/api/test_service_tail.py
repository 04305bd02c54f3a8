"""Two things that kept the live service's tail long under load (benchmarks/fleet.py):
``slicesched serve`` moves what is alive after start-up out of the collector's reach (full
collections had paused the event loop 0.2-0.3 s), and its driver retries a deadlock after
milliseconds, not a second. An app built for a test leaves the collector alone."""

from __future__ import annotations

import gc

from fastapi.testclient import TestClient

from service.api.app import FULL_COLLECTION_AFTER, create_app
from service.graph.connection import Neo4jSettings
from tests.api.conftest import ADMIN, auth, settings


def test_the_served_app_freezes_what_start_up_left_alive(neo4j: Neo4jSettings) -> None:
    gc.unfreeze()
    threshold = gc.get_threshold()
    try:
        with TestClient(create_app(settings(neo4j), freeze_gc=True)) as client:
            frozen = gc.get_freeze_count()
            assert frozen > 0  # the imports and the started service at least
            # full collections are rare; the young generations are collected as before
            assert gc.get_threshold() == (*threshold[:2], FULL_COLLECTION_AFTER)
            assert client.get("/v1/stats", headers=auth(ADMIN)).status_code == 200  # and it serves
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_an_app_built_for_a_test_leaves_the_collector_alone(neo4j: Neo4jSettings) -> None:
    gc.unfreeze()
    threshold = gc.get_threshold()
    with TestClient(create_app(settings(neo4j))) as client:
        assert client.get("/healthz").status_code == 200
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold() == threshold


def test_the_services_driver_retries_a_deadlock_after_milliseconds(client: TestClient) -> None:
    """A deadlock between the service's own writes is over when the other transaction commits:
    the driver's default first retry (1 s) had put a second on a group commit's completions."""
    from service.live.neo4j_gate import RETRY_DELAY_S

    config = client.app.state.service.gate.driver._default_workspace_config  # type: ignore[attr-defined]
    assert config.initial_retry_delay == RETRY_DELAY_S <= 0.05

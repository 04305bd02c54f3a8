"""Schemathesis against the published OpenAPI: generated requests (valid and invalid) never
get a server error, with an admin key and with a tenant key, on the real Neo4j."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from service.api.app import create_app
from service.graph.connection import Neo4jSettings
from tests.api.conftest import ADMIN, auth, new_tenant
from tests.api.conftest import settings as service_settings


@pytest.fixture(scope="module")
def live_app(neo4j: Neo4jSettings) -> Iterator[tuple[Any, str]]:
    app = create_app(service_settings(neo4j))
    with TestClient(app) as client:  # runs the lifespan: the service and its Neo4j driver
        key = new_tenant(client, "fuzz")
        client.post("/v1/models", json={"model_id": "m", "family": "tiny"}, headers=auth(key))
        yield app, key


@pytest.fixture(autouse=True)
def fresh_live_state() -> None:
    """Override the package's per-test reset: the fuzzed service keeps its state for the module."""


def test_no_server_error(live_app: tuple[Any, str]) -> None:
    app, tenant_key = live_app
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    failures: list[str] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=10, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            for key in (ADMIN, tenant_key):
                response = case.call(headers=auth(key))
                if response.status_code >= 500:
                    failures.append(f"{case.method} {case.formatted_path} {case.body!r:.200}: {response.text[:200]}")

        check()
    assert not failures, "\n".join(failures[:10])

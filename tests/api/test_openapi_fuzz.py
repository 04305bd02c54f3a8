"""Schemathesis against the published OpenAPI with every check it has (``st run --checks all``:
no server error, status codes, content types, headers and bodies as documented, schema-invalid
data refused, valid data accepted, 405 with an ``Allow`` header...), in its default phases
(examples, coverage, fuzzing) and modes (positive and negative), each case sent with an admin
key and with a tenant key, on the real Neo4j."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import FailureGroup
from schemathesis.pytest.lazy import get_all_tests

from service.api.app import create_app
from service.graph.connection import Neo4jSettings
from tests.api.conftest import ADMIN, auth, new_tenant
from tests.api.conftest import settings as service_settings

#: Schema-valid data may still break a rule the schema cannot express (the model's context, "exactly
#: one of prompt and prompt_tokens", an admin key naming the tenant): the API documents those as 400.
#: A 422 for schema-valid data stays a failure: it is the schema and the validation disagreeing.
POSITIVE_STATUSES = ["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"]


@pytest.fixture(scope="module")
def live_app(neo4j: Neo4jSettings) -> Iterator[tuple[Any, str]]:
    app = create_app(service_settings(neo4j))
    with TestClient(app) as client:  # runs the lifespan: the service and its Neo4j driver
        key = new_tenant(client, "fuzz")
        client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=auth(key))
        yield app, key


@pytest.fixture(autouse=True)
def fresh_live_state() -> None:
    """Override the package's per-test reset: the fuzzed service keeps its state for the module."""


def all_checks() -> list[Any]:
    """Every registered response check: the Python API's ``--checks all``."""
    load_all_checks()
    return [c for c in CHECKS.get_all() if not isinstance(c, type)]


def test_every_check_passes(live_app: tuple[Any, str]) -> None:
    app, tenant_key = live_app
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=SchemathesisConfig.from_dict(
        {"checks": {"positive_data_acceptance": {"expected-statuses": POSITIVE_STATUSES}}}))
    checks = all_checks()
    assert len(checks) >= 10
    failures: list[str] = []
    calls = 0

    def run(case: Any) -> None:
        nonlocal calls
        for key in (ADMIN, tenant_key):
            calls += 1
            try:
                case.call_and_validate(headers=auth(key), checks=checks)
            except (AssertionError, FailureGroup) as exc:  # collected, so that every operation runs
                failures.append(f"{case.method} {case.formatted_path} {case.query!r:.100} {case.body!r:.200}: "
                                f"{str(exc)[:800]}")

    # what the pytest plugin does for each operation: examples, coverage and fuzzing phases, both modes
    tests = [result.ok() for result in get_all_tests(schema=schema, test_func=run, given_kwargs={}, settings=settings(
        max_examples=10, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)))]
    assert len(tests) >= 20
    for _, test in tests:
        test()
    print(f"\nschemathesis: {len(tests)} operations, {calls} requests, {len(checks)} checks")
    assert not failures, f"{len(failures)} of {calls} requests failed a check:\n" + "\n".join(failures[:15])

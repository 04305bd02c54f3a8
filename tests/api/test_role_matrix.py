"""Every route x every role, against the matrix written down in docs/API.md ("Who may call
what"): an allowed role is never refused (no 401 or 403, whatever else its empty or minimal body
earns), a refused role gets 403 (401 without a key), and another tenant's admin calling for this
tenant's objects gets 403 or 404 with nothing but an error in the answer. The table must cover
every route the OpenAPI document lists, so a new route cannot go unlisted."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from service.domain.experiment import CodeVersion, Experiment
from tests.api.conftest import ADMIN, EXECUTOR, auth, new_tenant

DOC = Path(__file__).resolve().parents[2] / "docs" / "API.md"
ROLES = ("admin", "tenant_admin", "member", "viewer", "auditor", "executor", "no key")
ROW = re.compile(r"^\| (GET|POST|PUT|DELETE) \| `([^`]+)` \|(.+)\|$")


def documented_matrix() -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for line in DOC.read_text().splitlines():
        m = ROW.match(line)
        if m:
            cells = [c.strip() for c in m.group(3).split("|")]
            assert len(cells) == len(ROLES), line
            out[(m.group(1), m.group(2))] = {r for r, c in zip(ROLES, cells, strict=True) if c == "yes"}
    return out


class World:
    """One tenant with a key of each tenant role, a model, a project, a request, an access
    request, a workflow and an experiment; an auditor key; the bootstrap executor key; another tenant."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        t = self.tenant = f"m{uuid.uuid4().hex[:8]}"
        self.keys: dict[str, str | None] = {"admin": ADMIN, "executor": EXECUTOR, "no key": None}
        self.keys["tenant_admin"] = new_tenant(client, t)
        admin = auth(self.keys["tenant_admin"] or "")
        assert client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"}, headers=admin).status_code == 201
        assert client.post(f"/v1/tenants/{t}/projects", json={"project_id": "p1"}, headers=admin).status_code == 201
        for role in ("member", "viewer"):
            r = client.post(f"/v1/tenants/{t}/api-keys", json={"key_id": role, "name": role, "role": role},
                            headers=admin)
            assert r.status_code == 201, r.text
            self.keys[role] = r.json()["api_key"]
        r = client.post(f"/v1/tenants/{t}/api-keys", json={"key_id": "victim", "name": "v", "role": "viewer"},
                        headers=admin)
        assert r.status_code == 201
        r = client.post("/v1/auditor-keys", json={"key_id": f"aud-{t}", "name": "aud"}, headers=auth(ADMIN))
        self.keys["auditor"] = r.json()["api_key"]
        self.request_id = client.post("/v1/requests", json={"model_id": "m", "prompt": "hi", "max_tokens": 2},
                                      headers=admin).json()["request_id"]
        self.access_request = client.post("/v1/access-requests", json={"kind": "sla_class", "sla_class": "batch"},
                                          headers=admin).json()["request_id"]
        self.other = new_tenant(client, f"o{t}")
        r = client.post("/v1/workflows", headers=admin, json={"workflow_id": "wf", "slo_s": 60, "steps": [
            {"step_id": "t", "kind": "tool", "role": "code-exec", "tool": "python", "duration_s": 0.0}]})
        assert r.status_code == 202, r.text
        self.workflow = "wf"
        self.experiment = f"x{t}"
        client.app.state.service.repo.experiments.create_experiment(Experiment(  # type: ignore[attr-defined]
            uid=self.experiment, kind="replay", config={}, code=CodeVersion(None, None, "test"), results=[],
            created_at="2026-01-01T00:00:00+00:00", project="p1", tenant_id=t))

    def path(self, template: str, *, ghost: bool = False) -> str:
        """The template with this world's ids (``ghost``: with ids that exist nowhere)."""
        request_id = self.access_request if "access-requests" in template else self.request_id
        values = {"tenant_id": "ghost-tenant" if ghost else self.tenant, "key_id": "victim", "project_id": "p1",
                  "model_id": "m", "request_id": "ghost-request" if ghost else request_id,
                  "executor_id": "nobody", "lease_id": "nolease", "pool_id": "nopool",
                  "uid": "ghost-experiment" if ghost else self.experiment,
                  "workflow_id": "ghost-workflow" if ghost else self.workflow}
        return re.sub(r"\{(\w+)(:path)?\}", lambda m: values[m.group(1)], template)

    def intact(self) -> bool:
        return all(self.client.get("/v1/whoami", headers=auth(k)).status_code == 200
                   for r, k in self.keys.items() if k is not None)


def _call(client: TestClient, method: str, path: str, key: str | None) -> Any:
    headers = auth(key) if key is not None else {}
    if method in ("POST", "PUT"):
        return client.request(method, path, json={}, headers=headers)
    return client.request(method, path, headers=headers)


def test_the_matrix_lists_every_route(client: TestClient) -> None:
    routes = {(m.upper(), p) for p, ops in client.app.openapi()["paths"].items() for m in ops}  # type: ignore[attr-defined]
    assert routes == set(documented_matrix())


def test_every_route_with_every_role(client: TestClient) -> None:
    matrix = documented_matrix()
    world = World(client)
    checked = 0
    for (method, template), allowed in sorted(matrix.items()):
        for role in ROLES:
            path = world.path(template)
            r = _call(client, method, path, world.keys[role])
            where = f"{method} {template} as {role}: {r.status_code} {r.text[:200]}"
            if role in allowed:
                assert r.status_code not in (401, 403), where
                assert r.status_code < 500, where
            elif role == "no key":
                assert r.status_code == 401, where
            else:
                assert r.status_code == 403, where
                assert set(r.json()) == {"error"}, where
            checked += 1
            if not world.intact():  # the call rotated or revoked one of the world's keys
                world = World(client)
        # another tenant's admin never reaches this tenant's objects: it is answered exactly as
        # for objects that do not exist (an empty body's 422 included: that says nothing either)
        if any(f"{{{name}}}" in template for name in ("tenant_id", "request_id", "uid", "workflow_id")) and "no key" not in allowed:
            r = _call(client, method, world.path(template), world.other)
            ghost = _call(client, method, world.path(template, ghost=True), world.other)
            where = f"{method} {template} as another tenant: {r.status_code} {r.text[:200]}"
            assert r.status_code in (403, 404, 422) and r.status_code == ghost.status_code, where
            assert set(r.json()) == {"error"}, where
    assert checked == len(matrix) * len(ROLES)

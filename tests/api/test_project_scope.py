"""A key limited to projects sees only its projects' work, on every route that shows work: the named
inspections (``my_requests``, ``my_placements``, ``device_timeline``) and the usage report; the
tenant's unlimited keys still see all of it (hand probes of issue 41 read other projects here)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.api.conftest import ADMIN, auth, new_tenant


def _tenant_with_two_projects(client: TestClient, t: str) -> tuple[str, str, str]:
    """The tenant's own key, a viewer limited to ``lab`` and a member limited to ``lab``."""
    owner = new_tenant(client, t)
    assert client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"},
                       headers=auth(owner)).status_code == 201
    assert client.post(f"/v1/tenants/{t}/projects", json={"project_id": "lab"}, headers=auth(owner)).status_code == 201

    def key(key_id: str, role: str) -> str:
        r = client.post(f"/v1/tenants/{t}/api-keys", json={"key_id": key_id, "name": key_id, "role": role,
                                                           "projects": ["lab"]}, headers=auth(owner))
        assert r.status_code == 201, r.text
        return str(r.json()["api_key"])

    return owner, key("viewer", "viewer"), key("member", "member")


def _submit(client: TestClient, key: str, project: str | None = None, max_tokens: int = 2) -> str:
    body: dict[str, Any] = {"model_id": "m", "prompt": "hi", "max_tokens": max_tokens}
    if project is not None:
        body["project_id"] = project
    r = client.post("/v1/requests", json=body, headers=auth(key))
    assert r.status_code == 202, r.text
    return str(r.json()["request_id"])


def _inspect(client: TestClient, key: str, name: str, **params: Any) -> Any:
    return client.post("/v1/inspect", json={"name": name, "params": params}, headers=auth(key))


def _slices(repo: Any, device: str, t: str, served: dict[str, str]) -> None:
    """One live Slice per request (``slice uid -> request uid``) ON ``device``, as the GMG writer
    writes a granted lease."""
    with repo.driver.session() as s:
        s.run("MERGE (d:Device {device_id: $device}) SET d.mem_bytes = 1 "
              "WITH d UNWIND keys($served) AS uid "
              "MATCH (r:Request {uid: $served[uid]}) "
              "CREATE (sl:Slice {uid: uid, tenant_id: $t, model_uid: $t + '/m', state: 'running', live: true, "
              "                  start_s: 0.0, end_s: null})-[:ON]->(d), (sl)-[:SERVES]->(r)",
              device=device, served=served, t=t).consume()


def test_a_key_limited_to_projects_sees_only_their_work(client: TestClient, repo: Any, uid: str) -> None:
    t = f"ps{uid}"
    owner, viewer, member = _tenant_with_two_projects(client, t)
    mine = _submit(client, member)  # the member's one project: lab
    others = _submit(client, owner)  # default
    # my_requests
    rows = _inspect(client, viewer, "my_requests").json()["rows"]
    assert [r[0] for r in rows] == [mine]
    assert [r[0] for r in _inspect(client, member, "my_requests").json()["rows"]] == [mine]
    assert {r[0] for r in _inspect(client, owner, "my_requests").json()["rows"]} == {mine, others}
    assert {r[0] for r in _inspect(client, ADMIN, "my_requests", tenant_id=t).json()["rows"]} == {mine, others}
    # naming a project outside the key's is refused, as submitting in it is; narrowing is fine
    r = _inspect(client, viewer, "my_requests", projects=["default"])
    assert r.status_code == 403 and "limited to projects" in r.json()["error"]["message"]
    assert [r[0] for r in _inspect(client, viewer, "my_requests", projects=["lab"]).json()["rows"]] == [mine]
    assert [r[0] for r in _inspect(client, owner, "my_requests", projects=["default"]).json()["rows"]] == [others]
    assert _inspect(client, viewer, "my_requests", projects="lab").status_code == 400

    # my_placements and device_timeline: slices serving the other project's request are not the key's
    device = f"dev-{uid}"
    try:
        _slices(repo, device, t, {f"s-mine-{uid}": mine, f"s-other-{uid}": others})
        assert _inspect(client, viewer, "my_placements").json()["rows"] == [[device, f"{t}/m", "running", 1]]
        assert _inspect(client, owner, "my_placements").json()["rows"] == [[device, f"{t}/m", "running", 2]]
        named = [r[0] for r in _inspect(client, viewer, "device_timeline", device_id=device, since_s=0.0).json()["rows"]]
        assert sorted(named, key=str) == sorted([f"s-mine-{uid}", None], key=str)  # the other: an anonymous window
        named = [r[0] for r in _inspect(client, owner, "device_timeline", device_id=device, since_s=0.0).json()["rows"]]
        assert sorted(named) == sorted([f"s-mine-{uid}", f"s-other-{uid}"])
    finally:
        with repo.driver.session() as s:
            s.run("MATCH (d:Device {device_id: $d}) DETACH DELETE d", d=device).consume()

    # a tenant-scoped query that cannot tell projects apart is refused to such a key; model queries are not
    r = _inspect(client, viewer, "audit_log", filters={}, limit=5)
    assert r.status_code == 403
    assert _inspect(client, viewer, "heaviest_operators", model_id="m", limit=1).status_code == 200


def test_usage_of_a_key_limited_to_projects_has_no_tenant_wide_meter(client: TestClient, uid: str) -> None:
    t = f"pu{uid}"
    owner, viewer, member = _tenant_with_two_projects(client, t)
    _submit(client, member, max_tokens=3)  # lab: 2 prompt bytes + 3
    _submit(client, owner, max_tokens=7)  # default: 2 + 7
    limited = client.get(f"/v1/tenants/{t}/usage", headers=auth(viewer)).json()
    assert limited["tenant"] is None and set(limited["projects"]) == {"lab"}
    assert limited["projects"]["lab"]["tokens_admitted"] == 5
    whole = client.get(f"/v1/tenants/{t}/usage", headers=auth(owner)).json()
    assert whole["tenant"]["tokens_admitted"] == 5 + 9 and set(whole["projects"]) == {"default", "lab"}
    assert whole["projects"]["default"]["tokens_admitted"] == 9


def test_audit_log_through_inspection_needs_the_audit_role(client: TestClient, uid: str) -> None:
    """``GET /v1/audit`` is for tenant admins among a tenant's keys; its named query is too."""
    t = f"pa{uid}"
    owner = new_tenant(client, t)
    r = client.post(f"/v1/tenants/{t}/api-keys", json={"key_id": "v", "name": "v", "role": "viewer"},
                    headers=auth(owner))
    viewer = r.json()["api_key"]
    assert client.get("/v1/audit", headers=auth(viewer)).status_code == 403
    assert _inspect(client, viewer, "audit_log", filters={}, limit=5).status_code == 403
    assert _inspect(client, owner, "audit_log", filters={}, limit=5).status_code == 200

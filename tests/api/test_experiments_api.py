"""Experiment records over HTTP: a tenant's keys read their tenant's experiments (a key limited to
projects: those projects'), never another tenant's; compare answers what the CLI prints."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from service.domain.experiment import CodeVersion, Experiment
from tests.api.conftest import ADMIN, auth, new_tenant


def _record(client: TestClient, tenant: str | None, project: str, tps: float) -> str:
    uid = f"e{uuid.uuid4().hex[:10]}"
    client.app.state.service.repo.experiments.create_experiment(Experiment(  # type: ignore[attr-defined]
        uid=uid, kind="replay", config={"cluster": "a100", "duration_s": tps}, code=CodeVersion("abc", False, "0.1"),
        results=[{"policy": "fifo/container", "load_scale": 1.0, "token_throughput_tps": tps,
                  "sla_violation_rate": 0.1}],
        created_at="2026-01-01T00:00:00+00:00", project=project, tenant_id=tenant))
    return uid


def test_tenants_read_their_own_experiments_only(client: TestClient) -> None:
    t, o = f"t{uuid.uuid4().hex[:6]}", f"o{uuid.uuid4().hex[:6]}"
    key, other = new_tenant(client, t), new_tenant(client, o)
    assert client.post(f"/v1/tenants/{t}/projects", json={"project_id": "p1"}, headers=auth(key)).status_code == 201
    a, b = _record(client, t, "default", 100.0), _record(client, t, "p1", 150.0)
    theirs, platform = _record(client, o, "default", 1.0), _record(client, None, "default", 2.0)
    r = client.post(f"/v1/tenants/{t}/api-keys", json={"key_id": "v", "name": "v", "role": "viewer",
                                                       "projects": ["p1"]}, headers=auth(key))
    viewer = r.json()["api_key"]

    assert {e["uid"] for e in client.get("/v1/experiments", headers=auth(key)).json()} == {a, b}
    assert {e["uid"] for e in client.get("/v1/experiments", headers=auth(viewer)).json()} == {b}
    everything = {e["uid"] for e in client.get("/v1/experiments", headers=auth(ADMIN)).json()}
    assert {a, b, theirs, platform} <= everything
    assert {e["uid"] for e in client.get("/v1/experiments", params={"project": "p1"},
                                         headers=auth(key)).json()} == {b}
    # another tenant's record, a platform one, or one outside the key's projects: as if absent
    for who, uid in ((key, theirs), (key, platform), (viewer, a), (other, a)):
        r = client.get(f"/v1/experiments/{uid}", headers=auth(who))
        assert r.status_code == 404 and set(r.json()) == {"error"}, r.text
    doc = client.get(f"/v1/experiments/{b}", headers=auth(viewer)).json()
    assert doc["results"][0]["token_throughput_tps"] == 150.0 and doc["code"]["commit"] == "abc"

    cmp = client.get(f"/v1/experiments/{a}/compare", params={"other": b}, headers=auth(key)).json()
    assert cmp["a"] == a and cmp["b"] == b
    assert ["duration_s", 100.0, 150.0] in cmp["config_differences"]
    assert ["fifo/container x1", "tokens/s", 100.0, 150.0] in cmp["rows"]
    assert cmp["result_differences"] == 1
    assert client.get(f"/v1/experiments/{a}/compare", params={"other": theirs},
                      headers=auth(key)).status_code == 404
    assert client.get("/v1/experiments", params={"kind": "nope"}, headers=auth(key)).status_code == 400

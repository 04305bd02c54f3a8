"""Models registered by path: the service reads the directory's config and tokenizer, refuses a
directory it cannot serve (writing nothing), hands executors the path in the lease, restores the
model after a restart; end to end, a real ``serve`` and executor answer with the tokens of
``transformers``' own greedy generation."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.graph.connection import Neo4jSettings
from service.harness.stack import LiveStack
from service.models.hf_tokenizer import HFTokenizer
from tests.api.conftest import ADMIN, EXECUTOR, auth, new_tenant
from tests.api.test_api import completion, poll, register
from tests.api.test_e2e_processes import wait_done
from tests.hf_dirs import EOS, PROMPT, greedy
from tests.unit.test_hf_models import hf_model, until_stop


def test_a_model_directory_is_registered_leased_decoded_and_restored(make_client: Callable[..., TestClient],
                                                                       hf_dirs: dict[str, Path], repo: Any,
                                                                       uid: str, tmp_path: Path) -> None:
    client = make_client()
    tenant = f"hf{uid}"
    key = new_tenant(client, tenant)
    path = str(hf_dirs["llama"])
    unsupported = tmp_path / "mistral"
    shutil.copytree(path, unsupported)
    raw = json.loads((unsupported / "config.json").read_text())
    (unsupported / "config.json").write_text(json.dumps({**raw, "model_type": "mistral"}))
    h = auth(ADMIN)
    refused = {
        "a tenant key": (client.post("/v1/catalog/models", json={"model_id": "m", "path": path}, headers=auth(key)), 403,
                         "admin key"),
        "missing": ({"model_id": "m", "path": str(tmp_path / "nope"), "tenant_id": tenant}, 400, "no model directory"),
        "relative": ({"model_id": "m", "path": "models/llama", "tenant_id": tenant}, 400, "absolute"),
        "no config": ({"model_id": "m", "path": str(tmp_path), "tenant_id": tenant}, 400, "no config.json"),
        "unsupported": ({"model_id": "m", "path": str(unsupported), "tenant_id": tenant}, 400, "supported: gpt2, llama"),
        "both": ({"model_id": "m", "path": path, "family": "tiny", "tenant_id": tenant}, 400, "exactly one"),
        "neither": ({"model_id": "m", "tenant_id": tenant}, 400, "exactly one"),
        "a seed": ({"model_id": "m", "path": path, "seed": 3, "tenant_id": tenant}, 400, "seed applies"),
    }
    for what, (body, status, text) in refused.items():
        r = body if not isinstance(body, dict) else client.post("/v1/catalog/models", json=body, headers=h)
        assert r.status_code == status and text in r.json()["error"]["message"], (what, r.text)
    assert client.get("/v1/catalog/models/m", params={"tenant_id": tenant}, headers=h).status_code == 404
    assert repo.models.model_summary(tenant, "m", "decode")["operators"] == 0  # nothing written

    r = client.post("/v1/catalog/models", json={"model_id": "m", "path": path, "tenant_id": tenant}, headers=h)
    assert r.status_code == 201, r.text
    model = r.json()
    assert (model["path"], model["family"], model["max_context"], model["vocab_size"]) == (path, f"hf:{path}", 128, 64)
    assert repo.models.model_summary(tenant, "m", "decode")["operators"] > 0  # traced into the GMG
    register(client, f"hf{uid}e")
    rid = client.post("/v1/requests", json={"model_id": "m", "prompt": PROMPT, "max_tokens": 4},
                      headers=auth(key)).json()["request_id"]
    tok = HFTokenizer.load(path)
    lease = next(x for x in poll(client, f"hf{uid}e") if x["request_id"] == rid)
    assert lease["model_path"] == path and lease["prompt_tokens"] == tok.encode(PROMPT)
    words = tok.encode("hello world")[1:]  # without the BOS
    r = client.post("/v1/leases/complete", json={"executor_id": f"hf{uid}e",
                                                 "results": [completion(lease, [*words, EOS, 5])]},
                    headers=auth(EXECUTOR))
    assert r.json()["accepted"] == [lease["lease_id"]]
    assert client.get(f"/v1/requests/{rid}", headers=auth(key)).json()["text"] == "hello world the"

    client.__exit__(None, None, None)
    again = make_client()  # a restart restores the model from its directory, tokenizer included
    assert again.get("/v1/catalog/models/m", headers=auth(key)).json()["path"] == path
    assert again.get(f"/v1/requests/{rid}", headers=auth(key)).json()["text"] == "hello world the"


@pytest.fixture
def stack(neo4j: Neo4jSettings) -> Iterator[LiveStack]:
    with LiveStack(neo4j=neo4j, lease_ttl_s=5.0, heartbeat_s=0.4) as s:
        yield s


def test_served_from_disk_the_tokens_are_transformers_greedy_ones(stack: LiveStack, hf_dirs: dict[str, Path]) -> None:
    prompts = [PROMPT, "hello world", "a model on disk answers every"]
    with stack.client(timeout_s=300.0) as c:
        for kind, path in hf_dirs.items():
            assert c.post("/v1/tenants", json={"tenant_id": kind}).status_code == 201
            r = c.post("/v1/catalog/models", json={"model_id": "m", "path": str(path), "tenant_id": kind})
            assert r.status_code == 201, r.text
        stack.start_executor("ea", ["cpu:0", "cpu:1"])
        stack.wait_devices(2)
        ids = {}
        for kind in hf_dirs:
            for prompt in prompts:
                r = c.post("/v1/requests", json={"model_id": "m", "prompt": prompt, "max_tokens": 10,
                                                 "tenant_id": kind})
                assert r.status_code == 202, r.text
                ids[r.json()["request_id"]] = (kind, prompt)
        got = wait_done(c, ids, timeout_s=300.0)
    for g in got:
        kind, prompt = ids[g["request_id"]]
        tok = HFTokenizer.load(hf_dirs[kind])
        want = greedy(hf_model(hf_dirs[kind]), tok.encode(prompt), 10)
        assert until_stop(g["output_tokens"], tok.stop_ids) == want, (kind, prompt)
        if prompt == PROMPT:
            assert want[-1] == EOS
        assert g["text"] == tok.decode(g["output_tokens"])

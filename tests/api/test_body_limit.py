"""Request bodies over their route's limit are a 413 with a message, in the app's error shape (and
OpenAI's on its routes), before they are parsed or authenticated; a body over 64 KiB is read only
for a known key (tests/unit/test_body_limit.py shows what is read before each refusal)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from fastapi.testclient import TestClient

from tests.api.conftest import auth, new_tenant

LIMIT = 128 * 1024


def _padded(body: dict[str, object], size: int) -> bytes:
    """``body`` as JSON with trailing spaces up to ``size`` bytes (still valid JSON)."""
    text = json.dumps(body).encode()
    return text + b" " * (size - len(text))


def test_bodies_over_the_limit_are_413_before_parsing_and_authentication(make_client: Callable[..., TestClient],
                                                                         uid: str) -> None:
    client = make_client(max_body_bytes=LIMIT, max_bulk_body_bytes=4 * LIMIT)
    key = new_tenant(client, f"bl{uid}")
    assert client.post("/v1/catalog/models", json={"model_id": "m", "family": "tiny"},
                       headers=auth(key)).status_code == 201
    body = {"model_id": "m", "prompt": "hi", "max_tokens": 2}
    json_headers = {"content-type": "application/json"}
    # a normal body, and one padded up to the limit, pass
    assert client.post("/v1/requests", json=body, headers=auth(key)).status_code == 202
    r = client.post("/v1/requests", content=_padded(body, LIMIT), headers={**auth(key), **json_headers})
    assert r.status_code == 202, r.text
    # one byte more: 413 with a message naming the limit and its setting
    r = client.post("/v1/requests", content=_padded(body, LIMIT + 1), headers={**auth(key), **json_headers})
    assert r.status_code == 413
    error = r.json()["error"]
    assert error["kind"] == "too_large" and "131,073 bytes" in error["message"]
    assert "SLICESCHED_MAX_BODY_BYTES" in error["message"]
    # without a key, or with a wrong one: 413 over the limit, 401 (unread) over 64 KiB
    big = _padded(body, 200 * 1024)
    assert client.post("/v1/requests", content=big, headers=json_headers).status_code == 413
    assert client.post("/v1/requests", content=big, headers={**auth("nope"), **json_headers}).status_code == 413
    r = client.post("/v1/requests", content=_padded(body, 100 * 1024), headers=json_headers)
    assert r.status_code == 401 and r.json()["error"]["kind"] == "unauthorized"
    # a chunked body is counted as it comes
    def chunks() -> Iterator[bytes]:
        yield json.dumps(body).encode()
        for _ in range(20):
            yield b" " * 16 * 1024

    r = client.post("/v1/requests", content=chunks(), headers={**auth(key), **json_headers})
    assert r.status_code == 413 and "more than 131,072 bytes" in r.json()["error"]["message"]
    # the bulk routes take the larger limit
    batch = {"requests": [body]}
    r = client.post("/v1/requests/batch", content=_padded(batch, 2 * LIMIT), headers={**auth(key), **json_headers})
    assert r.status_code == 202, r.text
    r = client.post("/v1/requests/batch", content=_padded(batch, 4 * LIMIT + 1), headers={**auth(key), **json_headers})
    assert r.status_code == 413 and "SLICESCHED_MAX_BULK_BODY_BYTES" in r.json()["error"]["message"]
    # the OpenAI routes answer in OpenAI's shape
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    r = client.post("/v1/chat/completions", content=_padded(chat, LIMIT + 1), headers={**auth(key), **json_headers})
    assert r.status_code == 413 and r.json()["error"]["type"] and "too large" in r.json()["error"]["message"]
    # the service still answers on the same client
    assert client.get("/v1/whoami", headers=auth(key)).status_code == 200

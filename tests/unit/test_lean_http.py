"""benchmarks/_lean_http.py against a scripted HTTP/1.1 server on loopback: what it sends, how it
reads an answer (by length, chunked, to the end), when it reuses a connection and when not."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from benchmarks._lean_http import HttpError, LeanClient


class Scripted:
    """Answers each request with the next scripted raw response; records requests and connections."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[bytes, dict[bytes, bytes], Any]] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                line = await reader.readline()
                if not line:
                    return
                headers: dict[bytes, bytes] = {}
                while (h := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = h.partition(b":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
                self.requests.append((line.strip(), headers, json.loads(body) if body else None))
                answer = self.answers.pop(0)
                if answer == b"DROP":
                    return  # close without answering
                close_after = answer.endswith(b"|CLOSE")  # answer, then close as an idle keep-alive times out
                writer.write(answer.removesuffix(b"|CLOSE"))
                await writer.drain()
                if b"Connection: close" in answer or close_after:
                    return
        finally:
            writer.close()


def ok(body: Any, extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(data), extra.encode(), data)


def run(answers: list[bytes], script: Any, **options: Any) -> Scripted:
    server = Scripted(answers)

    async def main() -> None:
        srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        client = LeanClient(f"http://127.0.0.1:{port}", key="k1", timeout_s=5.0, **options)
        try:
            await script(client)
        finally:
            await client.aclose()
            srv.close()
            await srv.wait_closed()

    asyncio.run(main())
    return server


def test_it_sends_json_with_the_key_and_reuses_the_connection() -> None:
    async def script(client: LeanClient) -> None:
        r = await client.post("/v1/leases/poll", json={"executor_id": "e1", "max_leases": 3})
        assert r.status_code == 200 and r.json() == {"leases": []}
        r = await client.post("/v1/x", json={"a": [1, 2]})
        assert r.json() == {"n": 2}

    server = run([ok({"leases": []}), ok({"n": 2})], script)
    assert server.connections == 1  # keep-alive
    line, headers, body = server.requests[0]
    assert line == b"POST /v1/leases/poll HTTP/1.1"
    assert headers[b"authorization"] == b"Bearer k1" and headers[b"content-type"] == b"application/json"
    assert body == {"executor_id": "e1", "max_leases": 3}


def test_a_chunked_answer_is_read_whole() -> None:
    data = json.dumps({"chunked": True, "pad": "x" * 40}).encode()
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (
        10, data[:10], len(data) - 10, data[10:])

    async def script(client: LeanClient) -> None:
        assert (await client.post("/a", json={})).json()["chunked"] is True
        assert (await client.post("/b", json={})).json() == {"after": 1}  # the connection was left clean

    server = run([chunked, ok({"after": 1})], script)
    assert server.connections == 1


def test_connection_close_and_a_dropped_connection_open_a_new_one() -> None:
    async def script(client: LeanClient) -> None:
        assert (await client.post("/a", json={})).json() == {"i": 1}
        with pytest.raises(ConnectionError):
            await client.post("/b", json={})  # the server drops it: an error, never a retry here
        assert (await client.post("/c", json={})).json() == {"i": 3}

    server = run([ok({"i": 1}, "Connection: close\r\n"), b"DROP", ok({"i": 3})], script)
    assert server.connections == 3
    assert [r[0] for r in server.requests] == [b"POST /a HTTP/1.1", b"POST /b HTTP/1.1", b"POST /c HTTP/1.1"]


def test_a_keep_alive_connection_the_server_closed_is_not_reused() -> None:
    async def script(client: LeanClient) -> None:
        assert (await client.post("/a", json={})).json() == {"i": 1}
        await asyncio.sleep(0.05)  # the server's close arrives while the connection idles
        assert (await client.post("/b", json={})).json() == {"i": 2}

    server = run([ok({"i": 1}) + b"|CLOSE", ok({"i": 2})], script)
    assert server.connections == 2 and len(server.requests) == 2  # /b went once, on a new connection


def test_a_request_the_server_closed_on_unanswered_goes_once_more_on_a_new_connection() -> None:
    """A reused connection closed as the request went (the keep-alive timeout's race): the server
    read nothing of it, so it is sent again; on a new connection such a close is the caller's."""
    async def script(client: LeanClient) -> None:
        assert (await client.post("/a", json={})).json() == {"i": 1}
        assert (await client.post("/b", json={"n": 2})).json() == {"i": 3}

    server = run([ok({"i": 1}), b"DROP", ok({"i": 3})], script)
    assert server.connections == 2
    assert [r[0] for r in server.requests] == [b"POST /a HTTP/1.1", b"POST /b HTTP/1.1", b"POST /b HTTP/1.1"]


def test_a_connection_idle_too_long_is_not_reused() -> None:
    async def script(client: LeanClient) -> None:
        await client.post("/a", json={})
        await asyncio.sleep(0.06)
        await client.post("/b", json={})

    server = run([ok({}), ok({})], script, max_idle_s=0.05)
    assert server.connections == 2


def test_an_error_answer_raises_on_request_and_keeps_its_body() -> None:
    body = json.dumps({"error": {"kind": "not_found", "message": "unknown executor"}}).encode()
    answer = b"HTTP/1.1 404 Not Found\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)

    async def script(client: LeanClient) -> None:
        r = await client.post("/v1/executors/x/heartbeat", json={"running": []})
        assert r.status_code == 404
        with pytest.raises(HttpError, match="unknown executor"):
            r.raise_for_status()

    run([answer], script)


def test_only_plain_http_is_spoken() -> None:
    with pytest.raises(ValueError, match="plain http"):
        LeanClient("https://example.test", key="k")

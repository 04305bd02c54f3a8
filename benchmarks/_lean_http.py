"""A lean HTTP/1.1 JSON client for simulated executors: keep-alive connections over asyncio
streams, a few lines of parsing, no more.

``benchmarks/fleet.py`` runs hundreds of simulated executors in one process that shares the
machine's two cores with the service and Neo4j. With httpx (a connection pool each) that process
took 0.9 cores at 400 simulated GPUs and its event loop woke tasks 0.76 s late at p99, so the
fleet's tail was the simulation's, not the service's. Real executors run on their own nodes:
the simulation should cost the machine as little as it can while speaking the same protocol
(the same requests, bodies and answers; only the client library differs).

What it does not do: TLS, redirects, proxies, HTTP/2, compression, pipelining. A response is
read by ``Content-Length`` or chunked encoding; ``Connection: close`` closes the connection after
it, and any failure closes the connection it happened on. A server closes a keep-alive
connection that idles (uvicorn after 5 s): an idle connection the server has closed, or one idle
for ``max_idle_s`` or more, is not reused, and an exchange on a reused connection that the server
closed before answering a byte is sent once more on a new one (the server never read it: a
keep-alive close happens between requests). Any other failure is the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import urlsplit


class HttpError(RuntimeError):
    """A 4xx or 5xx answer (``raise_for_status``)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
        self.status = status


class Response:
    __slots__ = ("content", "status_code")

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code, self.content = status_code, content

    def json(self) -> Any:
        return json.loads(self.content)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise HttpError(self.status_code, self.content)


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _ClosedBeforeAnswer(ConnectionError):
    """The server closed the connection before a byte of the answer."""


class LeanClient:
    """``await client.post(path, json=body)`` over a small pool of keep-alive connections to one
    ``http://host:port`` (a connection per exchange in flight, kept for the next one)."""

    def __init__(self, base_url: str, *, key: str, timeout_s: float = 60.0, max_idle_s: float = 4.0) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"LeanClient speaks plain http://host:port only, not {base_url!r}")
        self.host, self.port = url.hostname, url.port or 80
        self.timeout_s, self.max_idle_s = timeout_s, max_idle_s
        self._head = (f"Host: {self.host}:{self.port}\r\nAuthorization: Bearer {key}\r\n"
                      "Content-Type: application/json\r\n").encode()
        self._idle: list[tuple[Connection, float]] = []  # with when each went idle (loop time)
        self._closed = False

    async def post(self, path: str, json: Any = None) -> Response:
        return await self.request("POST", path, json)

    async def get(self, path: str) -> Response:
        return await self.request("GET", path, None)

    async def request(self, method: str, path: str, body: Any) -> Response:
        if self._closed:
            raise RuntimeError("the client is closed")
        data = b"" if body is None else _dumps(body)
        message = b"%s %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (
            method.encode(), path.encode(), self._head, len(data), data)
        conn = self._reusable()
        if conn is not None:
            try:
                return await self._exchange(conn, message)
            except _ClosedBeforeAnswer:
                pass  # closed by the server while idle, as the request went: send it on a new one
        conn = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.timeout_s)
        return await self._exchange(conn, message)

    def _reusable(self) -> Connection | None:
        """The most recently used idle connection that the server has not closed and that has not
        idled past ``max_idle_s``; the others are closed."""
        now = asyncio.get_running_loop().time()
        while self._idle:
            conn, since = self._idle.pop()
            reader, writer = conn
            if reader.at_eof() or writer.is_closing() or now - since >= self.max_idle_s:
                writer.close()
                continue
            return conn
        return None

    async def _exchange(self, conn: Connection, message: bytes) -> Response:
        reader, writer = conn
        try:
            writer.write(message)
            response, keep = await asyncio.wait_for(_read_response(reader), self.timeout_s)
        except BaseException:
            writer.close()
            raise
        if keep and not self._closed:
            self._idle.append((conn, asyncio.get_running_loop().time()))
        else:
            writer.close()
        return response

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for (_, writer), _ in idle:
            writer.close()
        for (_, writer), _ in idle:
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


async def _read_response(reader: asyncio.StreamReader) -> tuple[Response, bool]:
    """One response: (it, whether the connection may be reused)."""
    status_line = await reader.readline()
    if not status_line:
        raise _ClosedBeforeAnswer("the server closed the connection before answering")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ConnectionError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    status = int(parts[1])
    length: int | None = None
    chunked, keep = False, parts[0] == b"HTTP/1.1"
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value:
            chunked = True
        elif name == b"connection":
            keep = value == b"keep-alive" or (keep and value != b"close")
    if chunked:
        body = bytearray()
        while True:
            size = int((await reader.readline()).split(b";")[0].strip(), 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                break
            body += await reader.readexactly(size)
            await reader.readline()
        return Response(status, bytes(body)), keep
    if length is None:  # read to the end: the connection cannot be reused
        return Response(status, await reader.read()), False
    return Response(status, await reader.readexactly(length)), keep

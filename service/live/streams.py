"""Tokens on their way to a waiting client: an in-memory buffer per request, with a wake-up.

A client that waits for its request (the OpenAI endpoints) opens a :class:`TokenStream` before
the request is accepted and reads it until the request ends. A streaming one asks for
``progress``: its leases then carry ``stream: true``, and the executor posts the tokens as it
produces them (``POST /v1/leases/progress``, :meth:`StreamBook.offer`). Positions are absolute,
so a re-leased run (its executor died; the lease expired) continues the same stream: tokens
already buffered are skipped, new ones appended. A seeded request gives the same tokens on the
second run, up to float rounding; :meth:`TokenStream.end` checks the buffered prefix against
the completion and marks the stream ``diverged`` when they differ.

Nothing here is durable: the completion in Neo4j is the record (``GET /v1/requests/{id}``). A
restart of the service ends every stream with its connection. Only the connection that opened a
stream reads it (the owner's, authenticated when it was opened): no route reads another's.
Owned by the event loop (no locks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any

from service.domain.request import RequestStatus
from service.live.records import TERMINAL, LiveRequest


class TokenStream:
    """One request's tokens so far (``tokens``) and its end (``status``, None while it runs)."""

    def __init__(self, request_id: str, progress: bool) -> None:
        self.request_id = request_id
        self.progress = progress  # its leases report tokens as they come
        self.tokens: list[int] = []
        self.status: RequestStatus | None = None
        self.error: str | None = None
        self.diverged = False  # a re-leased run's tokens differ from those already streamed
        self._changed = asyncio.Event()

    @property
    def ended(self) -> bool:
        return self.status is not None

    def offer(self, offset: int, tokens: Sequence[int]) -> None:
        """Tokens from position ``offset`` on; those already held are skipped, a gap is refused
        (the completion fills it)."""
        if self.ended or offset > len(self.tokens):
            return
        fresh = tokens[len(self.tokens) - offset:]
        if fresh:
            self.tokens.extend(fresh)
            self._changed.set()

    def end(self, req: LiveRequest) -> None:
        """The request ended: its output (when done) completes the buffer."""
        if self.ended:
            return
        if req.status == RequestStatus.DONE:
            out = req.output_tokens
            if out[: len(self.tokens)] != self.tokens:
                self.diverged = True
            self.tokens.extend(out[len(self.tokens):])
        self.status, self.error = req.status, req.error
        self._changed.set()

    async def wait(self, seen: int) -> None:
        """Until there are more than ``seen`` tokens or the request ended."""
        while len(self.tokens) <= seen and not self.ended:
            self._changed.clear()
            await self._changed.wait()

    async def wait_end(self) -> None:
        while not self.ended:
            self._changed.clear()
            await self._changed.wait()


class StreamBook:
    """The open streams by request id (see the module docstring)."""

    def __init__(self) -> None:
        self._streams: dict[str, TokenStream] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # cancels of abandoned streams, in flight

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background (a stream's reader left: its request's cancel)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def open(self, request_id: str, *, progress: bool) -> TokenStream:
        stream = TokenStream(request_id, progress)
        self._streams[request_id] = stream
        return stream

    def close(self, request_id: str) -> None:
        """Its reader is gone."""
        self._streams.pop(request_id, None)

    def wants_progress(self, request_id: str) -> bool:
        """Whether a lease of this request should report its tokens as they come."""
        stream = self._streams.get(request_id)
        return stream is not None and stream.progress

    def offer(self, request_id: str, offset: int, tokens: Sequence[int]) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.offer(offset, tokens)

    def end(self, req: LiveRequest) -> None:
        """The lease book's ``on_end`` observer: a request ended."""
        stream = self._streams.get(req.request_id)
        if stream is not None and req.status in TERMINAL:
            stream.end(req)

    def __len__(self) -> int:
        """Open streams."""
        return len(self._streams)

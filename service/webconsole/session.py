"""Server-side sessions of the web console.

The browser holds only a random session id, in an HttpOnly, SameSite=Strict cookie; the signed-in
user's API key stays here, in memory, and never reaches the page. Each session has its own CSRF
token, which every form carries in a hidden field and every POST must return. Signing in starts
a new session (a session id an attacker planted before sign-in is worth nothing after it); a
session idle for ``idle_s`` is gone, and so is every session when the console restarts (sign in
again). Anonymous visitors get a session too, so the sign-in and onboarding forms are protected
by the same token.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

COOKIE = "slicesched_console"


@dataclass
class Session:
    sid: str
    csrf: str
    seen: float
    key: str | None = field(default=None, repr=False)
    role: str | None = None
    tenant_id: str | None = None
    key_id: str | None = None
    projects: tuple[str, ...] = ()
    flashes: list[tuple[str, str]] = field(default_factory=list)  # (level, text), shown once

    @property
    def signed_in(self) -> bool:
        return self.key is not None

    def csrf_ok(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.csrf.encode())

    def flash(self, level: str, text: str) -> None:
        self.flashes.append((level, text))

    def take_flashes(self) -> list[tuple[str, str]]:
        out, self.flashes = self.flashes, []
        return out


class SessionStore:
    """At most ``max_sessions`` sessions (the least recently seen go first), each gone after
    ``idle_s`` without a request."""

    def __init__(self, *, idle_s: float = 1800.0, max_sessions: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s = idle_s
        self.max_sessions = max_sessions
        self.clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, sid: str | None) -> Session | None:
        if sid is None:
            return None
        s = self._sessions.get(sid)
        now = self.clock()
        if s is None or now - s.seen > self.idle_s:
            self._sessions.pop(sid, None)
            return None
        s.seen = now
        self._sessions.move_to_end(sid)
        return s

    def new(self) -> Session:
        s = Session(sid=secrets.token_urlsafe(32), csrf=secrets.token_urlsafe(32), seen=self.clock())
        self._sessions[s.sid] = s
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return s

    def sign_in(self, old: Session, key: str, *, role: str, tenant_id: str | None, key_id: str | None,
                projects: tuple[str, ...]) -> Session:
        """A new session (new id, new CSRF token) for ``key``; the old one is dropped."""
        self.drop(old.sid)
        s = self.new()
        s.key, s.role, s.tenant_id, s.key_id, s.projects = key, role, tenant_id, key_id, projects
        return s

    def drop(self, sid: str) -> None:
        self._sessions.pop(sid, None)

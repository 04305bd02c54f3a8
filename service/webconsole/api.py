"""The control plane's HTTP API as the console calls it: every call carries the signed-in user's
key, so the API decides what each person may see and do (the console only hides what would be
refused anyway). An error answer becomes :class:`ApiError` with the API's own message."""

from __future__ import annotations

from typing import Any

import httpx


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


class Api:
    def __init__(self, base_url: str, *, timeout_s: float = 30.0, transport: httpx.AsyncBaseTransport | None = None
                 ) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s, transport=transport)

    async def close(self) -> None:
        await self._client.aclose()

    async def call(self, method: str, path: str, key: str | None, *, json: Any = None,
                   params: dict[str, Any] | None = None) -> Any:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        clean = {k: v for k, v in (params or {}).items() if v not in (None, "")}
        try:
            r = await self._client.request(method, path, json=json, params=clean, headers=headers)
        except httpx.HTTPError as exc:
            raise ApiError(503, f"the slicesched API at {self.base_url} cannot be reached ({exc.__class__.__name__})",
                           "unavailable") from None
        if r.status_code >= 400:
            raise ApiError(r.status_code, *_message(r))
        return r.json() if r.content else None

    async def get(self, path: str, key: str | None, **params: Any) -> Any:
        return await self.call("GET", path, key, params=params)

    async def post(self, path: str, key: str | None, body: Any = None) -> Any:
        return await self.call("POST", path, key, json=body if body is not None else {})


def _message(r: httpx.Response) -> tuple[str, str]:
    try:
        err = r.json()["error"]
        if isinstance(err, dict):
            return str(err.get("message") or err), str(err.get("kind") or err.get("type") or "")
        return str(err), ""
    except (ValueError, KeyError, TypeError):
        return f"HTTP {r.status_code}", ""

"""The web console's cluster page against the real API (in process, real Neo4j): signed in as the
admin, it shows each device's last minute from the GMG's live Slices (the owner's running lease)
and the sliced guests (none here); a tenant's key is refused the page."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

import httpx
from fastapi.testclient import TestClient

from service.webconsole.api import Api
from service.webconsole.app import create_console
from tests.api.conftest import ADMIN
from tests.api.test_api import leased_requests


class ThroughTestClient(httpx.AsyncBaseTransport):
    """The console's API calls, answered by the API's TestClient (its app runs on the TestClient's
    own event loop; a worker thread waits for each answer)."""

    def __init__(self, api: TestClient) -> None:
        self.api = api

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        target = request.url.raw_path.decode()
        r = await asyncio.to_thread(self.api.request, request.method, target, content=body,
                                    headers={k: v for k, v in request.headers.items() if k.lower() != "host"})
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)


def sign_in(console: TestClient, key: str) -> None:
    csrf = re.search(r'name="csrf" value="([^"]+)"', console.get("/login").text)
    assert csrf is not None
    r = console.post("/login", data={"key": key, "csrf": csrf.group(1), "next": "/cluster"}, follow_redirects=False)
    assert r.status_code == 303, r.text


def test_the_cluster_page_shows_a_device_s_running_lease_under_its_owner(
        make_client: Callable[..., TestClient], uid: str) -> None:
    api = make_client(lease_ttl_s=30.0)
    tenant, executor = f"cc{uid}", f"cc{uid}e"
    key, _ = leased_requests(api, tenant, executor)
    with TestClient(create_console("http://api", api=Api("http://api", transport=ThroughTestClient(api)))) as console:
        sign_in(console, ADMIN)
        html = ""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the running lease reaches the GMG with the writer's next batch
            html = console.get("/cluster").text
            if f"<td>{tenant}</td><td>owner</td>" in html:
                break
            time.sleep(0.1)
        row = re.search(rf'<td class="mono">{re.escape(executor)}/cpu:0</td><td>{tenant}</td>\s*'
                        rf'<td>{tenant}</td><td>owner</td><td class="num">(\d+)</td><td class="num">(\d+)</td>', html)
        assert row is not None, html[html.find('id="recent"'):][:1500]
        assert row.groups() == ("1", "1")  # one lease, running
        assert "No sliced guest placed." in html
        # a tenant's key signs in but is refused the admin's page
        console.cookies.clear()
        sign_in(console, key)
        assert console.get("/cluster").status_code == 403

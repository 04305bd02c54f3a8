"""The web console in a real browser: headless Chromium (Debian's, installed by ``make browser``)
driven by Selenium, against a real ``slicesched serve``, an executor daemon running the model
with PyTorch, and ``slicesched console``, all separate processes on loopback.

One newcomer's path: request access -> a platform admin approves it -> claim the first key ->
sign in -> submit a first request and watch it finish -> compare two recorded experiments, with
the plot. And a viewer, who cannot reach the admin's pages."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.graph.connection import Neo4jSettings
from service.harness.stack import LiveStack

pytestmark = [pytest.mark.neo4j, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("the browser tests need Debian's chromium and chromium-driver: run `make browser` (apt-get)",
                allow_module_level=True)

from selenium import webdriver  # noqa: E402 - after the skip: only with a browser to drive
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, neo4j: Neo4jSettings) -> Iterator[LiveStack]:
    with LiveStack(neo4j=neo4j, lease_ttl_s=3.0, heartbeat_s=0.5,
                   log_dir=tmp_path_factory.mktemp("console-stack")) as s:
        s.start_executor("ea", ["cpu:0"])
        s.wait_devices(1)
        yield s


@pytest.fixture(scope="module")
def console(stack: LiveStack) -> str:
    return stack.start_console()


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-extensions", "--disable-sync", "--no-first-run",
                 "--disable-default-apps", "--metrics-recording-only", "--window-size=1280,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


# ---- page helpers ------------------------------------------------------------------------------------
def fill(driver: WebDriver, values: dict[str, str]) -> None:
    for element_id, value in values.items():
        field = driver.find_element(By.ID, element_id)
        if field.tag_name == "select":
            field.find_element(By.CSS_SELECTOR, f"option[value='{value}']").click()
        else:
            field.clear()
            field.send_keys(value)


def text(driver: WebDriver, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def wait_for(driver: WebDriver, predicate: Any, timeout_s: float = 60.0) -> Any:
    """``predicate``'s first true answer; an element htmx swapped out meanwhile is looked up again."""
    return WebDriverWait(driver, timeout_s, poll_frequency=0.25,
                         ignored_exceptions=(StaleElementReferenceException, NoSuchElementException)
                         ).until(lambda d: predicate(d))


def sign_in(driver: WebDriver, console: str, key: str) -> None:
    driver.get(f"{console}/login")
    fill(driver, {"key": key})
    driver.find_element(By.ID, "sign-in").click()
    wait_for(driver, lambda d: d.find_elements(By.ID, "logout"))


def sign_out(driver: WebDriver) -> None:
    driver.find_element(By.ID, "logout").click()
    wait_for(driver, lambda d: d.find_elements(By.ID, "sign-in"))


def record_replay(stack: LiveStack, tenant: str, policy: str, out: Path) -> None:
    """A real (small) replay, recorded as an experiment of the tenant's default project."""
    assert stack.neo4j is not None
    res = subprocess.run([sys.executable, "-m", "service.cli.main", "replay", "--cluster", "local-cpu-4",
                          "--tenants", "synthetic-3", "--duration", "8", "--policy", policy, "--seed", "3",
                          "--out", str(out), "--record", "--for-tenant", tenant],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, **stack.neo4j.env()}, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


# ---- the flows -------------------------------------------------------------------------------------------
def test_onboarding_approval_first_request_and_experiment_comparison(
        stack: LiveStack, console: str, browser: WebDriver, tmp_path: Path) -> None:
    d = browser
    tenant = f"web{uuid.uuid4().hex[:6]}"

    # a newcomer asks for access: no key anywhere yet
    d.get(f"{console}/onboarding")
    fill(d, {"tenant_id": tenant, "organisation": "Web Co", "contact": "ops@web.example", "sla_class": "standard",
             "models": "chat:tiny", "tokens_per_s": "100000", "note": "first try"})
    d.find_element(By.ID, "submit-onboarding").click()
    wait_for(d, lambda d: d.find_elements(By.ID, "claim-token"))
    request_id, token = text(d, "request-id"), text(d, "claim-token")
    d.find_element(By.ID, "to-claim").click()
    fill(d, {"claim_token": token})
    d.find_element(By.ID, "claim").click()
    wait_for(d, lambda d: d.find_elements(By.ID, "claim-status"))
    assert text(d, "claim-status") == "pending" and not d.find_elements(By.ID, "claimed-key")
    with httpx.Client(base_url=stack.url) as c:
        assert c.get("/v1/tenants", headers={"Authorization": f"Bearer {stack.admin_key}"}).json() is not None
        assert tenant not in [t["tenant_id"] for t in c.get(
            "/v1/tenants", headers={"Authorization": f"Bearer {stack.admin_key}"}).json()]

    # the platform admin approves it from the queue, with a reason
    sign_in(d, console, stack.admin_key)
    d.get(f"{console}/approvals")
    card = d.find_element(By.ID, f"ar-{request_id}")
    assert tenant in card.text and "chat" in card.text
    card.find_element(By.NAME, "reason").send_keys("known customer")
    card.find_element(By.CSS_SELECTOR, "button.approve").click()
    wait_for(d, lambda d: "approved" in d.find_element(By.CSS_SELECTOR, ".flash.ok").text)
    assert not d.find_elements(By.ID, f"ar-{request_id}")  # no longer pending
    sign_out(d)

    # the newcomer claims the first key (once) and signs in with it
    d.get(f"{console}/onboarding/claim?request_id={request_id}")
    fill(d, {"claim_token": token})
    d.find_element(By.ID, "claim").click()
    wait_for(d, lambda d: d.find_elements(By.ID, "claimed-key"))
    assert text(d, "claim-status") == "approved"
    key = text(d, "claimed-key")
    assert "known customer" in d.page_source
    sign_in(d, console, key)
    assert text(d, "role") == "tenant_admin"

    # the first request, submitted in the console and followed there until it is done
    d.get(f"{console}/requests")
    fill(d, {"model_id": "chat", "prompt": "hello from the console", "max_tokens": "6"})
    d.find_element(By.ID, "submit-request").click()
    flash = wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, ".flash.ok"))[0].text
    rid = re.search(r"Request (\S+) accepted", flash)
    assert rid is not None, flash
    row = f"//table[@id='requests']//tr[td[1][normalize-space()='{rid.group(1)}']]"
    # htmx refreshes the table until the executor has run it
    wait_for(d, lambda d: "done" in d.find_element(By.XPATH, row).text and "6/6" in d.find_element(By.XPATH, row).text,
             timeout_s=120)

    # two experiments run for the tenant, compared side by side with their plot
    record_replay(stack, tenant, "fifo/container", tmp_path / "a")
    record_replay(stack, tenant, "sjf/container", tmp_path / "b")
    d.get(f"{console}/experiments")
    rows = d.find_elements(By.CSS_SELECTOR, "#experiments tr td a.mono")
    assert len(rows) == 2, d.page_source[:2000]
    d.find_element(By.ID, "compare").click()
    wait_for(d, lambda d: d.find_elements(By.ID, "results-side-by-side"))
    table = text(d, "results-side-by-side")
    assert "fifo/container x1" in table and "sjf/container x1" in table and "tokens/s" in table
    assert "policies" in text(d, "config-differences")
    plot = d.find_element(By.ID, "compare-plot")
    wait_for(d, lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", plot) > 100)

    # usage shows what the first request spent, and the audit log names the approval
    d.get(f"{console}/usage")
    assert "tenant " + tenant in text(d, "usage")
    d.get(f"{console}/audit")
    assert "onboarding" in text(d, "audit") or "access" in text(d, "audit")
    assert "auditor" in text(d, "verification")  # a tenant admin reads, but does not verify, the chain


def test_a_viewer_cannot_reach_admin_pages(stack: LiveStack, console: str, browser: WebDriver) -> None:
    d = browser
    tenant = f"view{uuid.uuid4().hex[:6]}"
    admin = {"Authorization": f"Bearer {stack.admin_key}"}
    with httpx.Client(base_url=stack.url, headers=admin) as c:
        tenant_key = c.post("/v1/tenants", json={"tenant_id": tenant}).json()["api_key"]

    # the tenant admin gives a colleague a viewer key, in the console
    sign_in(d, console, tenant_key)
    d.get(f"{console}/tenants")
    wait_for(d, lambda d: d.find_elements(By.ID, "key-form"))
    own = d.find_element(By.ID, "tenant-key").text  # the tenant's own key is listed beside its members'
    assert "(tenant key)" in own and "active" in own
    fill(d, {"key_id": "vera", "name": "Vera", "role-select": "viewer"})
    d.find_element(By.ID, "create-key").click()
    viewer_key = wait_for(d, lambda d: d.find_elements(By.ID, "new-secret"))[0].text
    sign_out(d)

    sign_in(d, console, viewer_key)
    assert text(d, "role") == "viewer"
    nav = d.find_element(By.TAG_NAME, "header").text
    assert "Approvals" not in nav and "Cluster" not in nav and "Tenants" not in nav
    for path in ("/approvals", "/cluster", "/tenants", "/audit"):
        d.get(f"{console}{path}")
        assert text(d, "error-title") == "Not for your role", path
        assert "viewer" in text(d, "error-message")
    d.get(f"{console}/requests")
    assert not d.find_elements(By.ID, "request-form")  # a viewer reads, never submits
    d.get(f"{console}/usage")
    assert "tenant " + tenant in text(d, "usage")
    # and the API behind the console refuses the same, whatever a page would send
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {viewer_key}"}) as c:
        assert c.get("/v1/access-requests").status_code == 403
        assert c.get("/v1/devices").status_code == 403


def test_the_session_cookie_and_csrf(console: str) -> None:
    with httpx.Client(base_url=console, follow_redirects=False) as c:
        r = c.get("/login")
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert "script-src 'self'" in r.headers["content-security-policy"]
        # a form posted without the session's token (another site's form) changes nothing
        r = c.post("/login", data={"key": "anything"})
        assert r.status_code == 403 and "Form expired" in r.text
        r = c.post("/onboarding", data={"tenant_id": "nope", "organisation": "x", "contact": "x@y"})
        assert r.status_code == 403
        token = re.search(r'name="csrf" value="([^"]+)"', c.get("/login").text)
        assert token is not None
        r = c.post("/login", data={"key": "not-a-key", "csrf": token.group(1)})
        assert r.status_code == 401 and "Sign-in refused" in r.text
        # pages behind sign-in send a visitor to sign in; a redirect never leaves the console
        assert c.get("/requests").headers["location"].startswith("/login")
        r = c.post("/login", data={"key": "x", "csrf": token.group(1), "next": "//evil.example/"})
        assert "evil" not in r.headers.get("location", "")

"""The web console: pages for people, separate from the control plane, calling its HTTP API
with the signed-in user's key (``slicesched console --api URL``).

Server-rendered with Jinja2 (autoescaped) and htmx for the parts of a page that update (usage,
requests); no JavaScript is built and none runs inline (the Content-Security-Policy allows only
the console's own scripts). Sign-in is by API key; the key stays in the server-side session
(:mod:`service.webconsole.session`), the browser holds only the session id in an HttpOnly,
SameSite=Strict cookie, and every form carries the session's CSRF token. A page a role may not
see is a 403 page saying which role it needs; the API refuses the same calls anyway.

Pages: ``/onboarding`` (the request form, no key needed) and ``/onboarding/claim``; ``/login``;
``/`` (who you are, what you may do); ``/approvals`` (admin: the queue, approve or reject with a
reason); ``/tenants`` and ``/tenants/{id}`` (projects, members and their keys: create, rotate,
revoke); ``/usage`` (quota and usage, live); ``/requests`` (submit, and the list, live);
``/experiments``, ``/experiments/{uid}`` and ``/compare?a=&b=`` (side by side, with a plot);
``/audit`` (filters, and the chain's verification for admin and auditor keys); ``/cluster``
(admin: devices and where each tenant's work runs now, the sliced guests with their cuts, and
each device's last minute from the GMG's live Slices: its owner's leases and its guests').
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from service.webconsole.api import Api, ApiError
from service.webconsole.session import COOKIE, Session, SessionStore

log = logging.getLogger("slicesched.console")
HERE = Path(__file__).resolve().parent
ADMIN, TENANT_ADMIN, MEMBER, VIEWER, AUDITOR = "admin", "tenant_admin", "member", "viewer", "auditor"
READERS = (ADMIN, TENANT_ADMIN, MEMBER, VIEWER)
SUBMITTERS = (ADMIN, TENANT_ADMIN, MEMBER)
MANAGERS = (ADMIN, TENANT_ADMIN)
AUDIT_READERS = (ADMIN, TENANT_ADMIN, AUDITOR)
AUDIT_VERIFIERS = (ADMIN, AUDITOR)
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
}
#: The pages in the navigation bar: (path, label, roles that see it).
NAV: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("/", "Home", (*READERS, AUDITOR)), ("/approvals", "Approvals", (ADMIN,)), ("/tenants", "Tenants", MANAGERS),
    ("/usage", "Usage", READERS), ("/requests", "Requests", READERS), ("/experiments", "Experiments", READERS),
    ("/audit", "Audit log", AUDIT_READERS), ("/cluster", "Cluster", (ADMIN,)))


#: The cluster page reads each device's last :data:`RECENT_S` seconds (one ``device_timeline``
#: inspection per device) while the cluster has at most :data:`RECENT_MAX_DEVICES` devices.
RECENT_S = 60.0
RECENT_MAX_DEVICES = 32


class Refused(Exception):
    """The signed-in role may not see this page (a 403 page naming the roles that may)."""

    def __init__(self, roles: tuple[str, ...]) -> None:
        super().__init__(", ".join(roles))
        self.roles = roles


class SignInNeeded(Exception):
    pass


class BadForm(Exception):
    """A POST without this session's CSRF token, or from another site."""


def create_console(api_url: str, *, secure_cookies: bool = False, session_idle_s: float = 1800.0,
                   api: Api | None = None) -> FastAPI:
    """The console app for the API at ``api_url``. ``secure_cookies`` marks the session cookie
    Secure (set it when the console is served over HTTPS)."""
    sessions = SessionStore(idle_s=session_idle_s)
    client = api or Api(api_url)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await client.close()

    app = FastAPI(title="slicesched console", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.globals["nav"] = NAV
    templates.env.filters["ts"] = _when
    templates.env.filters["num"] = _num
    app.state.sessions = sessions
    app.state.api = client

    @app.middleware("http")
    async def session_and_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        session = sessions.get(request.cookies.get(COOKIE))
        fresh = session is None
        request.state.session = session or sessions.new()
        response = await call_next(request)
        s: Session = request.state.session
        if fresh or request.cookies.get(COOKIE) != s.sid:
            response.set_cookie(COOKIE, s.sid, httponly=True, samesite="strict", secure=secure_cookies, path="/")
        response.headers.update(SECURITY_HEADERS)
        if not request.url.path.startswith("/static/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    def page(request: Request, name: str, code: int = 200, **context: Any) -> HTMLResponse:
        s: Session = request.state.session
        return templates.TemplateResponse(request, name, {"s": s, "flashes": s.take_flashes(), **context},
                                          status_code=code)

    @app.exception_handler(SignInNeeded)
    async def to_login(request: Request, _: SignInNeeded) -> Response:
        return RedirectResponse(f"/login?next={request.url.path}", status_code=303)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> Response:
        return page(request, "error.html", 403, title="Not for your role",
                    message=f"This page needs one of these roles: {', '.join(exc.roles)}. "
                            f"You are signed in as {request.state.session.role}.")

    @app.exception_handler(BadForm)
    async def bad_form(request: Request, _: BadForm) -> Response:
        return page(request, "error.html", 403, title="Form expired",
                    message="This form was not sent from this console session. Reload the page and try again.")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        if exc.status == 401 and request.state.session.signed_in:
            sessions.drop(request.state.session.sid)  # the key was revoked, rotated or expired
            request.state.session = sessions.new()
            request.state.session.flash("error", f"Signed out: {exc.message}")
            return RedirectResponse("/login", status_code=303)
        status = exc.status if 400 <= exc.status < 600 else 502
        return page(request, "error.html", status, title=f"The API answered {exc.status}", message=exc.message)

    # ---- helpers ---------------------------------------------------------------------------------
    def need(request: Request, *roles: str) -> Session:
        s: Session = request.state.session
        if not s.signed_in:
            raise SignInNeeded()
        if roles and s.role not in roles:
            raise Refused(roles)
        return s

    async def form(request: Request) -> dict[str, str]:
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            raise BadForm()
        data = await request.form()
        fields = {k: v for k, v in data.items() if isinstance(v, str)}
        if not request.state.session.csrf_ok(fields.pop("csrf", None)):
            raise BadForm()
        return fields

    def tenant_of(s: Session, given: str | None) -> str | None:
        return s.tenant_id if s.tenant_id is not None else (given or None)

    # ---- sign-in ---------------------------------------------------------------------------------
    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/login", response_class=HTMLResponse)
    async def login_page(request: Request, next: str = "/") -> Response:
        return page(request, "login.html", next=_local(next))

    @app.post("/login", response_class=HTMLResponse)
    async def login(request: Request) -> Response:
        f = await form(request)
        key = f.get("key", "").strip()
        if not key:
            return page(request, "login.html", 400, error="Enter an API key.", next=_local(f.get("next")))
        try:
            who = await client.get("/v1/whoami", key)
        except ApiError as exc:
            return page(request, "login.html", 401 if exc.status == 401 else exc.status,
                        error=f"Sign-in refused: {exc.message}", next=_local(f.get("next")))
        request.state.session = sessions.sign_in(
            request.state.session, key, role=who["role"], tenant_id=who["tenant_id"], key_id=who["key_id"],
            projects=tuple(who["projects"]))
        return RedirectResponse(_local(f.get("next")), status_code=303)

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        await form(request)
        sessions.drop(request.state.session.sid)
        request.state.session = sessions.new()
        request.state.session.flash("info", "Signed out.")
        return RedirectResponse("/login", status_code=303)

    # ---- onboarding (no key) ---------------------------------------------------------------------
    @app.get("/onboarding", response_class=HTMLResponse)
    async def onboarding_page(request: Request) -> Response:
        return page(request, "onboarding.html", values={})

    @app.post("/onboarding", response_class=HTMLResponse)
    async def onboarding(request: Request) -> Response:
        f = await form(request)
        try:
            body = {"tenant_id": f.get("tenant_id", "").strip(), "organisation": f.get("organisation", "").strip(),
                    "contact": f.get("contact", "").strip(), "sla_class": f.get("sla_class") or "standard",
                    "note": f.get("note", ""), "models": _models(f.get("models", "")),
                    "quota": {"tokens_per_s": _number(f.get("tokens_per_s"), "tokens per second"),
                              "device_s_per_hour": _number(f.get("device_s_per_hour"), "device-seconds per hour"),
                              "mem_bytes": _gib(f.get("mem_gib"))}}
            done = await client.post("/v1/onboarding", None, body)
        except (ApiError, ValueError) as exc:
            message = exc.message if isinstance(exc, ApiError) else str(exc)
            return page(request, "onboarding.html", 400, error=message, values=f)
        return page(request, "onboarding_sent.html", submitted=done)

    @app.get("/onboarding/claim", response_class=HTMLResponse)
    async def claim_page(request: Request, request_id: str = "") -> Response:
        return page(request, "claim.html", request_id=request_id)

    @app.post("/onboarding/claim", response_class=HTMLResponse)
    async def claim(request: Request) -> Response:
        f = await form(request)
        rid, token = f.get("request_id", "").strip(), f.get("claim_token", "").strip()
        if not rid or not token:
            return page(request, "claim.html", 400, error="Enter the request id and the claim token.", request_id=rid)
        try:
            answer = await client.post(f"/v1/onboarding/{_seg(rid)}/claim", None, {"claim_token": token})
        except ApiError as exc:
            return page(request, "claim.html", exc.status, error=exc.message, request_id=rid)
        return page(request, "claim.html", request_id=rid, answer=answer)

    # ---- home ------------------------------------------------------------------------------------
    @app.get("/", response_class=HTMLResponse)
    async def home(request: Request) -> Response:
        need(request)
        return page(request, "home.html")

    # ---- approvals (admin) -----------------------------------------------------------------------
    @app.get("/approvals", response_class=HTMLResponse)
    async def approvals(request: Request, status: str = "pending") -> Response:
        s = need(request, ADMIN)
        rows = await client.get("/v1/access-requests", s.key, status=status if status != "all" else None)
        return page(request, "approvals.html", rows=rows, status=status)

    @app.post("/approvals/{request_id}", response_class=HTMLResponse)
    async def decide(request: Request, request_id: str) -> Response:
        s = need(request, ADMIN)
        f = await form(request)
        decision = f.get("decision")
        if decision not in ("approve", "reject"):
            raise ApiError(400, "decide with approve or reject")
        reason = f.get("reason", "").strip()
        if not reason:
            s.flash("error", "Give a reason: it is kept in the request's history.")
            return RedirectResponse("/approvals", status_code=303)
        done = await client.post(f"/v1/access-requests/{_seg(request_id)}/{decision}", s.key, {"reason": reason})
        s.flash("ok", f"{done['kind']} request {done['request_id']} of {done['tenant_id']}: {done['status']}.")
        return RedirectResponse("/approvals", status_code=303)

    # ---- tenants, projects, members and keys -----------------------------------------------------
    @app.get("/tenants", response_class=HTMLResponse)
    async def tenants(request: Request) -> Response:
        s = need(request, *MANAGERS)
        if s.tenant_id is not None:
            return RedirectResponse(f"/tenants/{s.tenant_id}", status_code=303)
        return page(request, "tenants.html", rows=await client.get("/v1/tenants", s.key))

    @app.get("/tenants/{tenant_id}", response_class=HTMLResponse)
    async def tenant(request: Request, tenant_id: str) -> Response:
        s = need(request, *READERS)
        t = _seg(tenant_id)
        record = await client.get(f"/v1/tenants/{t}", s.key)
        projects = await client.get(f"/v1/tenants/{t}/projects", s.key)
        keys = await client.get(f"/v1/tenants/{t}/api-keys", s.key) if s.role in MANAGERS else None
        models = await client.get("/v1/catalog/models", s.key, tenant_id=None if s.tenant_id else t)
        return page(request, "tenant.html", tenant=record, projects=projects, keys=keys, models=models,
                    manage=s.role in MANAGERS)

    @app.post("/tenants/{tenant_id}/projects", response_class=HTMLResponse)
    async def create_project(request: Request, tenant_id: str) -> Response:
        s = need(request, *MANAGERS)
        f = await form(request)
        done = await client.post(f"/v1/tenants/{_seg(tenant_id)}/projects", s.key,
                                 {"project_id": f.get("project_id", "").strip(), "description": f.get("description", "")})
        s.flash("ok", f"Project {done['project_id']} created.")
        return RedirectResponse(f"/tenants/{_seg(tenant_id)}", status_code=303)

    @app.post("/tenants/{tenant_id}/keys", response_class=HTMLResponse)
    async def create_key(request: Request, tenant_id: str) -> Response:
        s = need(request, *MANAGERS)
        f = await form(request)
        projects = [p.strip() for p in f.get("projects", "").split(",") if p.strip()]
        try:
            days = _number(f.get("expires_days"), "expiry (days)")
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        done = await client.post(f"/v1/tenants/{_seg(tenant_id)}/api-keys", s.key, {
            "key_id": f.get("key_id", "").strip(), "name": f.get("name", "").strip(), "role": f.get("role", "member"),
            "projects": projects, "expires_in_s": None if days is None else days * 86400.0})
        return page(request, "secret.html", what=f"Key {done['key_id']} ({done['role']}) for {done['name']}",
                    secret=done["api_key"], back=f"/tenants/{_seg(tenant_id)}")

    async def change_key(request: Request, tenant_id: str, action: str, api_path: str, what: str) -> Response:
        """Rotate (the new secret shown once) or revoke a key through ``api_path``; ``what`` names it."""
        s = need(request, *MANAGERS)
        await form(request)
        if action not in ("rotate", "revoke"):
            raise ApiError(404, f"no key action {action!r}")
        done = await client.post(f"{api_path}/{action}", s.key)
        if action == "rotate":
            return page(request, "secret.html", what=f"New secret of {what}", secret=done["api_key"],
                        back=f"/tenants/{_seg(tenant_id)}")
        s.flash("ok", f"{what[0].upper()}{what[1:]} revoked: it is refused from now on.")
        return RedirectResponse(f"/tenants/{_seg(tenant_id)}", status_code=303)

    @app.post("/tenants/{tenant_id}/tenant-key/{action}", response_class=HTMLResponse)
    async def tenant_key_action(request: Request, tenant_id: str, action: str) -> Response:
        """The tenant's own key (not a member's)."""
        return await change_key(request, tenant_id, action, f"/v1/tenants/{_seg(tenant_id)}/keys",
                                f"tenant {tenant_id}'s own key")

    @app.post("/tenants/{tenant_id}/keys/{key_id}/{action}", response_class=HTMLResponse)
    async def key_action(request: Request, tenant_id: str, key_id: str, action: str) -> Response:
        return await change_key(request, tenant_id, action,
                                f"/v1/tenants/{_seg(tenant_id)}/api-keys/{_seg(key_id)}", f"key {key_id}")

    # ---- usage (live) ----------------------------------------------------------------------------
    async def usage_of(s: Session, tenant_id: str | None) -> tuple[str | None, Any]:
        t = tenant_of(s, tenant_id)
        if t is None:
            return None, None
        return t, await client.get(f"/v1/tenants/{_seg(t)}/usage", s.key)

    @app.get("/usage", response_class=HTMLResponse)
    async def usage(request: Request, tenant_id: str | None = None) -> Response:
        s = need(request, *READERS)
        t, doc = await usage_of(s, tenant_id)
        tenants = await client.get("/v1/tenants", s.key) if s.role == ADMIN else []
        return page(request, "usage.html", tenant_id=t, usage=doc, tenants=tenants)

    @app.get("/usage/live", response_class=HTMLResponse)
    async def usage_live(request: Request, tenant_id: str | None = None) -> Response:
        s = need(request, *READERS)
        t, doc = await usage_of(s, tenant_id)
        return page(request, "usage_table.html", tenant_id=t, usage=doc)

    # ---- requests (live) -------------------------------------------------------------------------
    @app.get("/requests", response_class=HTMLResponse)
    async def requests_page(request: Request, status: str | None = None) -> Response:
        s = need(request, *READERS)
        rows = await client.get("/v1/requests", s.key, status=status, limit=50)
        models = await client.get("/v1/catalog/models", s.key) if s.role in SUBMITTERS and s.tenant_id else []
        return page(request, "requests.html", rows=rows[::-1], status=status or "", models=models,
                    submit=s.role in SUBMITTERS and s.tenant_id is not None)

    @app.get("/requests/live", response_class=HTMLResponse)
    async def requests_live(request: Request, status: str | None = None) -> Response:
        s = need(request, *READERS)
        rows = await client.get("/v1/requests", s.key, status=status, limit=50)
        return page(request, "requests_table.html", rows=rows[::-1], status=status or "")

    @app.post("/requests", response_class=HTMLResponse)
    async def submit(request: Request) -> Response:
        s = need(request, *SUBMITTERS)
        f = await form(request)
        try:
            max_tokens = int(f.get("max_tokens") or "16")
        except ValueError:
            raise ApiError(400, "max tokens must be a whole number") from None
        body = {"model_id": f.get("model_id", ""), "prompt": f.get("prompt", ""), "max_tokens": max_tokens}
        if f.get("project_id"):
            body["project_id"] = f["project_id"].strip()
        done = await client.post("/v1/requests", s.key, body)
        s.flash("ok", f"Request {done['request_id']} accepted ({done['status']}, budget {done['token_budget']} tokens).")
        return RedirectResponse("/requests", status_code=303)

    # ---- experiments -----------------------------------------------------------------------------
    @app.get("/experiments", response_class=HTMLResponse)
    async def experiments(request: Request, project: str | None = None) -> Response:
        s = need(request, *READERS)
        rows = await client.get("/v1/experiments", s.key, project=project)
        return page(request, "experiments.html", rows=rows, project=project or "")

    @app.get("/experiments/{uid}", response_class=HTMLResponse)
    async def experiment(request: Request, uid: str) -> Response:
        s = need(request, *READERS)
        return page(request, "experiment.html", e=await client.get(f"/v1/experiments/{_seg(uid)}", s.key))

    @app.get("/compare", response_class=HTMLResponse)
    async def compare(request: Request, a: str = "", b: str = "") -> Response:
        s = need(request, *READERS)
        if not a or not b or a == b:
            s.flash("error", "Pick two different experiments to compare.")
            return RedirectResponse("/experiments", status_code=303)
        doc = await client.get(f"/v1/experiments/{_seg(a)}/compare", s.key, other=b)
        return page(request, "compare.html", c=doc)

    @app.get("/compare.png")
    async def compare_png(request: Request, a: str, b: str) -> Response:
        s = need(request, *READERS)
        doc = await client.get(f"/v1/experiments/{_seg(a)}/compare", s.key, other=b)
        from service.live.plots import plot_headline

        buf = io.BytesIO()
        plot_headline(buf, doc["rows"], doc["a"], doc["b"])
        return Response(buf.getvalue(), media_type="image/png")

    # ---- audit -----------------------------------------------------------------------------------
    @app.get("/audit", response_class=HTMLResponse)
    async def audit(request: Request, action: str | None = None, actor: str | None = None,
                    target: str | None = None, tenant_id: str | None = None, since_seq: str | None = None) -> Response:
        s = need(request, *AUDIT_READERS)
        filters = {"action": action, "actor": actor, "target": target, "tenant_id": tenant_id,
                   "since_seq": since_seq}
        page_doc = await client.get("/v1/audit", s.key, limit=200, **filters)
        verified = await client.get("/v1/audit/verify", s.key) if s.role in AUDIT_VERIFIERS else None
        return page(request, "audit.html", entries=page_doc["entries"][::-1], next_since_seq=page_doc["next_since_seq"],
                    verified=verified, filters={k: v or "" for k, v in filters.items()})

    # ---- cluster (admin) -------------------------------------------------------------------------
    @app.get("/cluster", response_class=HTMLResponse)
    async def cluster(request: Request) -> Response:
        s = need(request, ADMIN)
        devices = await client.get("/v1/devices", s.key)
        replicas = (await client.get("/v1/stats", s.key))["replicas"]
        by_tenant: dict[str, list[str]] = {}
        for d in devices:
            for replica in d["replicas"]:
                by_tenant.setdefault(replica.partition("/")[0], []).append(d["device_id"])
        owners = _owners(replicas)
        recent: list[dict[str, Any]] | None = None
        now = time.time()
        if len(devices) <= RECENT_MAX_DEVICES:
            ids = sorted(d["device_id"] for d in devices)
            tables = await asyncio.gather(*(client.post("/v1/inspect", s.key, {
                "name": "device_timeline", "params": {"device_id": dev, "since_s": now - RECENT_S, "tenant_id": None}})
                for dev in ids))
            recent = [{"device_id": dev, "owner": owners.get(dev), "tenants": _device_use(t, owners.get(dev), now)}
                      for dev, t in zip(ids, tables, strict=True)]
        return page(request, "cluster.html", devices=devices,
                    by_tenant={t: sorted(set(ds)) for t, ds in sorted(by_tenant.items())},
                    sliced=[r for r in replicas if r.get("slices")], recent=recent, recent_s=RECENT_S,
                    recent_max=RECENT_MAX_DEVICES)

    return app


# ---- the cluster page ------------------------------------------------------------------------------
def _owners(replicas: list[dict[str, Any]]) -> dict[str, str]:
    """Device -> the tenant whose home replica (not a guest) is on it, from ``/v1/stats``."""
    out: dict[str, str] = {}
    for r in replicas:
        if not r["guest"]:
            for dev in r["devices"]:
                out.setdefault(dev, r["model"].partition("/")[0])
    return out


def _device_use(table: dict[str, Any], owner: str | None, now: float, window_s: float = RECENT_S
                ) -> list[dict[str, Any]]:
    """One device's last ``window_s`` seconds from its ``device_timeline`` answer: per tenant (the
    owner first) its leases, how many run now, and the share of the window in which at least one
    of them held the device (a lease's window is its request's time in the device's batch). The
    executors' stage observations (no model) are left out."""
    cols = {c: i for i, c in enumerate(table["columns"])}
    since = now - window_s
    spans: dict[str, list[tuple[float, float]]] = {}
    running: dict[str, int] = {}
    for row in table["rows"]:
        tenant, state = row[cols["tenant"]], row[cols["state"]]
        if tenant is None or row[cols["model"]] is None:
            continue
        end = now if row[cols["end_s"]] is None or state == "running" else min(float(row[cols["end_s"]]), now)
        start = max(since, float(row[cols["start_s"]]))
        spans.setdefault(tenant, [])
        if end > start:
            spans[tenant].append((start, end))
        running[tenant] = running.get(tenant, 0) + (state == "running")
    out = []
    for tenant in sorted(spans, key=lambda t: (t != owner, t)):
        held, reach = 0.0, since
        for start, end in sorted(spans[tenant]):
            if end > reach:
                held += end - max(start, reach)
                reach = end
        out.append({"tenant": tenant, "guest": tenant != owner, "leases": len(spans[tenant]),
                    "running": running.get(tenant, 0), "held_share": held / window_s})
    return out


# ---- template filters ------------------------------------------------------------------------------
def _when(epoch: float | None) -> str:
    if epoch is None:
        return ""
    return dt.datetime.fromtimestamp(float(epoch), dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _num(value: Any) -> str:
    """A figure at a readable precision (blank for none)."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return "" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if value != value:  # NaN
        return "—"
    return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}"


# ---- form values -----------------------------------------------------------------------------------
def _local(target: str | None) -> str:
    """A redirect target inside the console (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _seg(value: str) -> str:
    """A value for one path segment of an API URL (percent-encoded)."""
    return quote(value, safe="")


def _number(value: str | None, label: str) -> float | None:
    if value is None or not value.strip():
        return None
    try:
        n = float(value)
    except ValueError:
        raise ValueError(f"{label} must be a number, got {value!r}") from None
    if n <= 0:
        raise ValueError(f"{label} must be above 0, got {value!r}")
    return n


def _gib(value: str | None) -> int | None:
    n = _number(value, "memory (GiB)")
    return None if n is None else int(n * 2**30)


def _models(text: str) -> list[dict[str, str]]:
    """``id:family`` pairs, separated by commas or new lines (``chat:tiny, code:tiny-llama``)."""
    out = []
    for item in text.replace("\n", ",").split(","):
        item = item.strip()
        if not item:
            continue
        model_id, sep, family = item.partition(":")
        if not sep or not model_id.strip() or not family.strip():
            raise ValueError(f"models are written id:family (e.g. chat:tiny), got {item!r}")
        out.append({"model_id": model_id.strip(), "family": family.strip()})
    return out

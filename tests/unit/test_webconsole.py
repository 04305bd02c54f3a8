"""The console's pieces without a browser: sessions, redirects, form values."""

from __future__ import annotations

import pytest

from service.webconsole.app import _gib, _local, _models, _num, _number
from service.webconsole.session import SessionStore


def test_a_session_expires_when_idle_and_sign_in_starts_a_new_one() -> None:
    now = [0.0]
    store = SessionStore(idle_s=10.0, clock=lambda: now[0])
    s = store.new()
    assert store.get(s.sid) is s and not s.signed_in
    signed = store.sign_in(s, "key-1", role="viewer", tenant_id="t", key_id="v", projects=("p",))
    assert signed.sid != s.sid and signed.csrf != s.csrf  # a planted session id is worth nothing after sign-in
    assert store.get(s.sid) is None and store.get(signed.sid) is signed and signed.signed_in
    assert signed.csrf_ok(signed.csrf) and not signed.csrf_ok(s.csrf) and not signed.csrf_ok(None)
    now[0] = 9.0
    assert store.get(signed.sid) is signed  # seen: the idle clock restarts
    now[0] = 20.0
    assert store.get(signed.sid) is None
    assert "key-1" not in repr(signed)


def test_the_store_keeps_at_most_max_sessions() -> None:
    store = SessionStore(max_sessions=3)
    first = store.new()
    for _ in range(3):
        store.new()
    assert len(store) == 3 and store.get(first.sid) is None


def test_flashes_are_shown_once() -> None:
    s = SessionStore().new()
    s.flash("ok", "done")
    assert s.take_flashes() == [("ok", "done")] and s.take_flashes() == []


@pytest.mark.parametrize(("target", "want"), [("/requests", "/requests"), (None, "/"), ("//evil.example", "/"),
                                              ("https://evil.example/", "/"), ("/\\evil", "/"), ("", "/")])
def test_redirects_stay_in_the_console(target: str | None, want: str) -> None:
    assert _local(target) == want


def test_form_values() -> None:
    assert _models("chat:tiny, code:tiny-llama\nx:gpt2-small") == [
        {"model_id": "chat", "family": "tiny"}, {"model_id": "code", "family": "tiny-llama"},
        {"model_id": "x", "family": "gpt2-small"}]
    assert _models("") == []
    with pytest.raises(ValueError, match="id:family"):
        _models("chat")
    assert _number("", "x") is None and _number("2.5", "x") == 2.5
    with pytest.raises(ValueError, match="must be a number"):
        _number("lots", "tokens per second")
    with pytest.raises(ValueError, match="above 0"):
        _number("-1", "x")
    assert _gib("1.5") == 3 * 2**29
    assert _num(None) == "" and _num(1234567) == "1,234,567" and _num(0.12345) == "0.123" and _num(float("nan")) == "—"


def test_the_audit_page_shows_a_placement_decision_s_reasons_by_code_and_line() -> None:
    from pathlib import Path

    from jinja2 import Environment, FileSystemLoader

    import service.webconsole.app as console

    env = Environment(loader=FileSystemLoader(Path(console.__file__).parent / "templates"), autoescape=True)
    env.filters["ts"] = console._when
    reason = {"code": "add", "tenant": "acme", "model": "acme/m", "devices": ["eb"],
              "figures": {"tokens_gain": 60}, "text": "add acme/m on eb: +60 tokens in 20s, no SLA or memory at risk"}
    entry = {"seq": 1, "at": 0.0, "actor": "scheduler", "actor_role": "scheduler", "action": "placement.decision",
             "target_kind": "placement", "target_id": None, "tenant_id": None, "after": None, "hash": "ab" * 32,
             "details": {"notes": [reason["text"]], "reasons": [reason]}}
    other = {**entry, "seq": 2, "action": "tenant.create", "details": {"reason": "x"}}
    html = env.get_template("audit.html").render(entries=[entry, other], verified=None, filters=dict.fromkeys(
        ["action", "actor", "target", "tenant_id", "since_seq"], ""), next_since_seq=None, nav=[], s=None, flashes=[])
    assert '<div class="reason" data-code="add"><span class="mono">add</span> add acme/m on eb: +60 tokens' in html
    assert html.count('class="reason"') == 1  # an entry without reasons shows none


def test_a_device_s_last_minute_separates_its_owner_from_its_guests() -> None:
    from service.webconsole.app import _device_use, _owners

    owners = _owners([{"model": "initech/m", "devices": ["e/cpu:1"], "guest": False},
                      {"model": "acme/m", "devices": ["e/cpu:1"], "guest": True}])
    assert owners == {"e/cpu:1": "initech"}
    cols = ["slice", "tenant", "model", "state", "start_s", "end_s", "operators"]
    rows = [["L1", "acme", "acme/m", "done", 950.0, 980.0, 0], ["L2", "acme", "acme/m", "running", 970.0, 2000.0, 0],
            ["L3", "initech", "initech/m", "done", 900.0, 955.0, 0],  # started before the window
            ["L1/1", "acme", None, "done", 960.0, 970.0, None],  # an executor's stage observation: left out
            [None, None, None, None, 990.0, 995.0, None]]  # another tenant's window, unnamed: left out
    use = _device_use({"columns": cols, "rows": rows}, "initech", now=1000.0, window_s=60.0)
    assert [u["tenant"] for u in use] == ["initech", "acme"]  # the owner first
    initech, acme = use
    assert initech == {"tenant": "initech", "guest": False, "leases": 1, "running": 0, "held_share": 15.0 / 60.0}
    assert acme["guest"] and acme["leases"] == 2 and acme["running"] == 1
    assert acme["held_share"] == 50.0 / 60.0  # 950-980 and 970-1000 (running: until now), once


def test_the_cluster_page_shows_sliced_guests_and_each_device_s_last_minute() -> None:
    from pathlib import Path

    from jinja2 import Environment, FileSystemLoader

    import service.webconsole.app as console

    env = Environment(loader=FileSystemLoader(Path(console.__file__).parent / "templates"), autoescape=True)
    sliced = [{"replica_id": "acme/m@eb/cpu:0:0-12+ea/cpu:0:12-24", "model": "acme/m", "leases": 3, "draining": False,
               "yields": True, "slices": [{"device": "eb/cpu:0", "layers": [0, 12]},
                                          {"device": "ea/cpu:0", "layers": [12, 24]}]}]
    recent = [{"device_id": "eb/cpu:0", "owner": "initech", "tenants": [
                  {"tenant": "initech", "guest": False, "leases": 4, "running": 1, "held_share": 0.5},
                  {"tenant": "acme", "guest": True, "leases": 3, "running": 2, "held_share": 0.25}]},
              {"device_id": "ea/cpu:0", "owner": None, "tenants": []}]
    html = env.get_template("cluster.html").render(devices=[], by_tenant={}, sliced=sliced, recent=recent, recent_s=60.0,
                                                   recent_max=32, nav=[], s=None, flashes=[])
    assert "eb/cpu:0 [0, 12), ea/cpu:0 [12, 24)" in html
    assert "<td>acme</td><td>guest</td>" in html and ">25%<" in html and ">50%<" in html
    assert 'colspan="5" class="muted">idle' in html
    many = env.get_template("cluster.html").render(devices=[], by_tenant={}, sliced=[], recent=None, recent_s=60.0,
                                                   recent_max=32, nav=[], s=None, flashes=[])
    assert "No sliced guest placed." in many and "More than 32 devices" in many

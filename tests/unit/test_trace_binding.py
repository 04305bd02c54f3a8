"""Trace files bound to tenants, requests fitted to their context, SLAs that grow with the prompt."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from service.domain.error import InvalidInputError
from service.domain.model_config import MODEL_CONFIGS
from service.replay.binding import TraceBinding, deal, parse_binding, read_source, session_key
from service.replay.context import clamp_to_context, fit_context
from service.replay.mix import TenantMix, load_mix, parse_mix, sample_workload
from service.sim.sla import SLA_CLASSES, SlaClass
from tests.conftest import cli_in_process, data_path, needs_data

ROOT = Path(__file__).resolve().parents[2]
AZURE_CODE = "azure-llm-2023/AzureLLMInferenceTrace_code.csv"
AZURE_CONV = "azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
MOONCAKE = "mooncake-synthetic/synthetic_trace.jsonl"


def test_binding_syntax() -> None:
    assert parse_binding("azure-code:acme") == TraceBinding("azure-code", "acme")
    assert parse_binding("azure-conv:globex@30") == TraceBinding("azure-conv", "globex", 30.0, 1.0)
    assert parse_binding("mooncake:docs@1.5*2") == TraceBinding("mooncake", "docs", 1.5, 2.0)
    assert parse_binding("mooncake:docs*0.5") == TraceBinding("mooncake", "docs", 0.0, 0.5)
    assert parse_binding("mooncake") == TraceBinding("mooncake")


@pytest.mark.parametrize(("spec", "message"), [
    ("azure-code:acme@soon", "TENANT[@OFFSET_S][*RATE_SCALE]"),
    ("azure-code:acme*0", "rate scale must be positive"),
    ("azure-code:", "expected FILE[:TENANT"),
    ("/nowhere/trace.csv:acme", "no file /nowhere/trace.csv"),
])
def test_bad_binding_is_refused(spec: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        parse_binding(spec)


def _mix(*tenants: dict[str, object], **extra: object) -> TenantMix:
    return parse_mix({"name": "m", "duration_s": 10_000, "tenants": list(tenants), **extra})


@needs_data("azure-llm-2023")
def test_a_tenant_gets_exactly_its_files_requests_in_order_offset_and_scaled() -> None:
    code = read_source(AZURE_CODE).requests
    conv = read_source(AZURE_CONV).requests
    mix = _mix({"tenant_id": "acme", "model": "llama2-70b"}, {"tenant_id": "globex", "model": "llama2-13b"},
               {"tenant_id": "synth", "model": "tiny"})
    mix = mix.bind_trace("acme", {"source": str(data_path(AZURE_CODE)), "offset_s": 30.0, "rate_scale": 1.0})
    mix = mix.bind_trace("globex", {"source": "azure-conv", "offset_s": 0.0, "rate_scale": 2.0})
    horizon = 600.0
    w, counts = sample_workload(mix, np.random.default_rng(0), duration_s=horizon, context="clamp")
    acme = [r for r in w.requests if r.tenant_id == "acme"]
    globex = [r for r in w.requests if r.tenant_id == "globex"]
    want_acme = [r for r in code if 30.0 + r.arrival_s - code[0].arrival_s < horizon]
    want_globex = [r for r in conv if (r.arrival_s - conv[0].arrival_s) / 2.0 < horizon]
    assert len(acme) == len(want_acme) > 100 and len(globex) == len(want_globex) > 100
    for got, want in zip(acme, want_acme, strict=True):
        assert got.arrival_s == pytest.approx(30.0 + want.arrival_s - code[0].arrival_s)
        assert (got.prompt_tokens, got.output_tokens) == clamp_to_context(want.prompt_tokens, want.output_tokens, 4096)
        assert (got.model, got.sla_class) == ("llama2-70b", "standard")
    for got, want in zip(globex, want_globex, strict=True):
        assert got.arrival_s == pytest.approx((want.arrival_s - conv[0].arrival_s) / 2.0)
        assert (got.prompt_tokens, got.output_tokens) == clamp_to_context(want.prompt_tokens, want.output_tokens, 4096)
    assert acme[0].arrival_s == 30.0 and globex[0].arrival_s == 0.0
    assert any(r.tenant_id == "synth" for r in w.requests)  # an unbound tenant keeps the mix's workload
    assert counts.per_tenant["acme"]["clamped"] == sum(r.prompt_tokens + r.output_tokens > 4096 for r in want_acme)


@needs_data("mooncake-synthetic", "azure-llm-2023")
def test_sessions_stay_in_one_tenant() -> None:
    requests = read_source(MOONCAKE).requests
    tenants = load_mix("a100-4tenants").tenants
    dealt = deal(requests, tenants, "session", source=MOONCAKE)
    owner: dict[int, str] = {}
    for src, r in zip(requests, dealt, strict=True):
        assert owner.setdefault(session_key(src), r.tenant_id) == r.tenant_id
        assert (r.arrival_s, r.prompt_tokens, r.prefix_hashes) == (src.arrival_s, src.prompt_tokens, src.prefix_hashes)
    assert len(set(owner.values())) == 4 and len(owner) > 1000
    # every request sharing any prefix block with another is in the same tenant
    block_owner: dict[int, str] = {}
    for r in dealt:
        for h in r.prefix_hashes:
            assert block_owner.setdefault(h, r.tenant_id) == r.tenant_id
    with pytest.raises(InvalidInputError, match="no session key"):
        deal(read_source(AZURE_CONV).requests, tenants, "session", source=AZURE_CONV)


@needs_data("mooncake-synthetic")
def test_clamping_and_rejection_are_counted_and_everything_fits() -> None:
    tenants = _mix({"tenant_id": "big", "model": "llama2-7b"}, {"tenant_id": "small", "model": "gpt2-small"}).tenants
    requests = deal(read_source(MOONCAKE).requests, tenants, "round-robin", source=MOONCAKE)
    limit = {t.tenant_id: MODEL_CONFIGS[t.model].max_seq_len for t in tenants}
    over = {t: sum(r.prompt_tokens + r.output_tokens > limit[t] for r in requests if r.tenant_id == t)
            for t in limit}
    clamped, c = fit_context(requests, "clamp")
    assert len(clamped) == len(requests) and c.clamped == sum(over.values()) > 0 and c.rejected == 0
    assert {t: c.per_tenant[t]["clamped"] for t in limit} == over
    assert all(r.prompt_tokens + r.output_tokens <= limit[r.tenant_id] for r in clamped)
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in clamped)
    for before, after in zip(requests, clamped, strict=True):
        if before.prompt_tokens + before.output_tokens <= limit[before.tenant_id]:
            assert after == before
        else:  # the prompt is cut, the output capped, never grown
            assert after.prompt_tokens <= before.prompt_tokens and after.output_tokens <= before.output_tokens
    kept, r = fit_context(requests, "reject")
    assert r.rejected == sum(over.values()) and len(kept) == len(requests) - r.rejected and r.clamped == 0
    assert {t: r.per_tenant[t]["rejected"] for t in limit} == over


def test_clamp_rule() -> None:
    assert clamp_to_context(100, 50, 1024) == (100, 50)  # fits: unchanged
    assert clamp_to_context(126_000, 50, 1024) == (974, 50)  # prompt cut from the front, output kept
    assert clamp_to_context(126_000, 2000, 1024) == (768, 256)  # output room at most a quarter
    assert clamp_to_context(10, 5000, 4096) == (10, 4086)  # output capped to what is left


def test_ttft_target_grows_with_the_prompt() -> None:
    sla = SlaClass("long", ttft_s=0.5, tbt_s=0.1, e2e_s=60.0, ttft_per_prompt_token_s=0.0002)
    assert sla.ttft_target_s(2000) == pytest.approx(0.9)
    assert sla.slack_s(0.8, 0.05, 10.0, prompt_tokens=2000) == pytest.approx(0.05)  # TPOT slack is the least
    assert sla.slack_s(1.0, 0.05, 10.0, prompt_tokens=2000) == pytest.approx(-0.1)  # TTFT over 0.9 s: missed
    assert sla.slack_s(1.0, 0.05, 10.0, prompt_tokens=5000) > 0  # a longer prompt is allowed more
    assert SlaClass("open").slack_s(1e6, 1e6, 1e6, prompt_tokens=10) == math.inf  # no targets


def test_mix_sla_classes_and_old_yaml() -> None:
    mix = _mix({"tenant_id": "a", "model": "tiny", "sla_class": "gold"},
               sla_classes={"gold": {"ttft_s": 0.2, "ttft_per_prompt_token_s": 0.001, "tbt_s": 0.05}})
    gold = mix.sla_classes["gold"]
    assert (gold.ttft_s, gold.ttft_per_prompt_token_s, gold.tbt_s, gold.e2e_s) == (0.2, 0.001, 0.05, math.inf)
    assert load_mix("synthetic-3").sla_classes == SLA_CLASSES  # no sla_classes: the built-ins, unchanged
    shipped = load_mix("a100-4tenants").sla_classes["interactive"]
    assert shipped.ttft_per_prompt_token_s > 0 and shipped.tbt_s == 0.1
    with pytest.raises(InvalidInputError, match="unknown field"):
        _mix({"tenant_id": "a", "model": "tiny"}, sla_classes={"gold": {"ttft": 1}})
    with pytest.raises(InvalidInputError, match="absolute path"):
        _mix({"tenant_id": "a", "model": "tiny", "trace": {"source": "/tmp/x.csv"}})


@pytest.mark.slow
@needs_data("servegen", "azure-llm-2023", "mooncake-synthetic")
def test_the_traces_mix_names_its_sources_relative_to_the_data_folder() -> None:
    mix = load_mix("a100-4tenants-traces")
    sources = {t.tenant_id: t.trace["source"] if t.trace else t.arrivals["kind"] for t in mix.tenants}
    assert sources == {"assistant": "servegen", "coder": "azure-code", "chat": "azure-conv", "docs": "mooncake"}
    w, counts = sample_workload(mix, np.random.default_rng(0), duration_s=400)  # docs start at 300 s
    assert set(w.tenants()) == {"assistant", "coder", "chat", "docs"}
    assert all(r.prompt_tokens + r.output_tokens <= MODEL_CONFIGS[r.model].max_seq_len for r in w.requests)
    assert counts.per_tenant["docs"]["clamped"] > 0


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli.main", "replay", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


@pytest.mark.slow
def test_replay_report_names_dealing_sources_context_and_classes(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{10 + i // 4:02d}.{(i % 4) * 25:02d}00000,{40 + 60 * i},{8 + i % 5}" for i in range(40)]
    trace.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    res = replay("--cluster", "local-cpu-4", "--tenants", "synthetic-3", "--duration", "20", "--policy",
                 "fifo/container", "--trace", f"{trace}:acme@2*2", "--context", "reject", "--out", str(out))
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    wl = report["workload"]
    assert wl["dealing"] == "per-tenant"
    assert wl["sources"]["acme"] == {"source": str(trace), "offset_s": 2.0, "rate_scale": 2.0}
    assert wl["sources"]["globex"]["source"] == "mix"
    ctx = wl["context"]["by_load"][0]
    # acme runs tiny (512 tokens): prompts 40 + 60 i, outputs 8 + i % 5
    over = sum(40 + 60 * i + 8 + i % 5 > 512 for i in range(40))
    assert wl["context"]["mode"] == "reject" and ctx["rejected"] == ctx["per_tenant"]["acme"]["rejected"] == over
    result = report["results"][0]
    assert set(result["sla_violation_rate_by_class"]) == {"interactive", "standard", "batch"}
    assert set(report["config"]["sla_classes"]) == {"interactive", "standard", "batch"}


@pytest.mark.parametrize(("args", "message"), [
    (["--trace", "azure-code:acme@soon"], "is not TENANT[@OFFSET_S][*RATE_SCALE]"),
    (["--trace", "missing.csv:acme"], "no file missing.csv"),
    (["--trace", "azure-code:nobody"], "no tenant 'nobody'"),
    (["--trace", "azure-code"], "--deal"),
    (["--trace", "azure-code:acme", "--trace", "azure-conv:acme"], "more than once"),
    (["--trace", "azure-code:acme", "--deal", "session"], "--deal applies"),
    (["--trace", "azure-code:acme", "--context", "stretch"], "invalid choice"),
])
def test_bad_trace_spec_is_a_message_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "never"
    res = cli_in_process("replay", "--cluster", "local-cpu-4", "--tenants", "synthetic-3", "--duration", "5", *args,
                         "--out", str(out))
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()

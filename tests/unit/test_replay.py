"""Tenant mixes and the replay command: bad input is refused before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from service.domain.error import InvalidInputError
from service.replay.mix import build_workload, builtin_mixes, load_mix, parse_mix
from tests.conftest import cli_in_process, needs_data

ROOT = Path(__file__).resolve().parents[2]


def test_builtin_mixes_and_deterministic_workloads() -> None:
    assert {"synthetic-3", "a100-4tenants"} <= set(builtin_mixes())
    mix = load_mix("synthetic-3")
    a = build_workload(mix, np.random.default_rng(3), duration_s=30)
    b = build_workload(mix, np.random.default_rng(3), duration_s=30)
    assert a.requests == b.requests and a.num_requests > 50
    assert set(a.tenants()) == {"acme", "globex", "initech"}
    double = build_workload(mix, np.random.default_rng(3), duration_s=30, load_scale=2.0)
    assert 1.6 < double.num_requests / a.num_requests < 2.4


@pytest.mark.slow
@needs_data("servegen", "azure-llm-2023", "mooncake-synthetic")
def test_the_headline_mix_reads_public_traces() -> None:
    w = build_workload(load_mix("a100-4tenants"), np.random.default_rng(0), duration_s=120)
    assert set(w.tenants()) == {"assistant", "coder", "docs", "chat"}
    assert all(r.prompt_tokens + r.output_tokens <= 4096 for r in w.requests if r.model.startswith("llama2"))


@pytest.mark.parametrize(("doc", "message"), [
    ({"tenants": [{"tenant_id": "a", "model": "gpt5"}]}, "unknown model"),
    ({"tenants": [{"tenant_id": "a", "model": "tiny", "sla_class": "platinum"}]}, "unknown SLA class"),
    ({"tenants": [{"tenant_id": "a", "model": "tiny", "arrivals": {"kind": "psychic"}}]}, "arrivals.kind"),
    ({"tenants": [{"tenant_id": "a", "model": "tiny"}, {"tenant_id": "a", "model": "tiny"}]}, "duplicate"),
    ({"tenants": []}, "non-empty"),
    ({"duration_s": -1, "tenants": [{"tenant_id": "a", "model": "tiny"}]}, "positive"),
])
def test_bad_mixes_are_refused(doc: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        parse_mix(doc)


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli.main", "replay", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


@pytest.mark.slow
def test_replay_writes_a_report_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = replay("--cluster", "local-cpu-4", "--tenants", "synthetic-3", "--duration", "20",
                 "--policy", "fifo/container", "--policy", "sjf/slice", "--load-sweep", "0.5,1", "--out", str(out))
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    assert {r["policy"] for r in report["results"]} == {"fifo/container", "sjf/slice"}
    assert len(report["results"]) == 4
    first = report["results"][0]
    assert first["token_throughput_tps"] > 0 and 0 <= first["sla_violation_rate"] <= 1
    assert set(first["sla_violation_rate_by_tenant"]) == {"acme", "globex", "initech"}
    assert {"latency_cdf.png", "load_sweep.png", "timeline-fifo-container.png"} <= {p.name for p in out.iterdir()}
    for r in report["results"]:  # every what-if listed with its reason, counted by verdict
        whatifs = r["whatifs"]
        assert sum(whatifs["by_verdict"].values()) == whatifs["num_runs"] == r["num_whatifs"]
        assert whatifs["runs_kept"] == len(whatifs["runs"]) <= 200
        assert all(run["verdict"] in whatifs["by_verdict"] for run in whatifs["runs"])


@pytest.mark.parametrize(("args", "message"), [
    (["--policy", "lifo/container"], "unknown queue policy"),
    (["--policy", "fifo/teleport"], "unknown placement policy"),
    (["--policy", "fifo"], "QUEUE/PLACEMENT"),
    (["--cluster", "16xB200"], "no cluster spec"),
    (["--tenants", "nobody"], "no tenant mix"),
    (["--cluster", "local-cpu-2", "--tenants", "a100-4tenants"], "needs"),
    (["--load-sweep", "1,fast"], "--load-sweep"),
])
def test_bad_replay_input_is_a_message_and_writes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "never"
    res = cli_in_process("replay", "--cluster", "local-cpu-4", "--tenants", "synthetic-3", "--duration", "5", *args,
                         "--out", str(out))
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()


@pytest.mark.slow
def test_the_replay_command_refuses_bad_input_as_a_process(tmp_path: Path) -> None:
    """The same refusal from a process of its own: exit code 2 and a message, no traceback."""
    out = tmp_path / "never"
    res = replay("--cluster", "16xB200", "--tenants", "synthetic-3", "--duration", "5", "--out", str(out))
    assert res.returncode == 2 and "no cluster spec" in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()

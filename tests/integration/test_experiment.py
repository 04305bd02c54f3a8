"""Experiment records (`replay --record`, `slicesched experiments list|show|compare|rerun`) on the
real Neo4j: a recorded replay is listed and shown with its provenance, rerun reproduces it
exactly, a changed commit, data digest or data file is named with exit 1, two seeds compare side
by side with a plot, and an unknown id is exit 2 with a message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from service.cli.main import main
from service.graph.connection import Neo4jSettings

pytestmark = pytest.mark.neo4j
ROOT = Path(__file__).resolve().parents[2]

# 20 s of the built-in mix on the built-in CPU cluster, priced by the roofline: about a second
QUICK = ["--cluster", "local-cpu-4", "--tenants", "synthetic-3", "--duration", "20", "--policy", "fifo/container"]


@pytest.fixture
def cli(neo4j: Neo4jSettings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """Run ``slicesched ARGS`` in this process against the test server: ``(exit code, stdout, stderr)``."""
    for key, value in neo4j.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLICESCHED_COST_MODEL", "roofline")

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def project() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


def _rerun_in_a_new_process(neo4j: Neo4jSettings, uid: str, out: Path) -> subprocess.CompletedProcess[str]:
    """``experiments rerun`` as a user runs it: a fresh process (its own hash seed, no trace file
    already read), so a reproduction cannot lean on this process's state."""
    env = {**os.environ, **neo4j.env(), "SLICESCHED_COST_MODEL": "roofline"}
    return subprocess.run([sys.executable, "-m", "service.cli.main", "experiments", "rerun", uid, "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def _record(cli: Any, out: Path, project: str, *extra: str) -> str:
    code, stdout, stderr = cli("replay", *QUICK, *extra, "--out", str(out), "--record", "--project", project)
    assert code == 0, stderr
    line = next(x for x in stdout.splitlines() if x.startswith("recorded experiment "))
    return line.split()[2]


def test_a_recorded_replay_is_listed_shown_and_rerun_reproduces_it_exactly(
        cli: Any, project: str, neo4j: Neo4jSettings, tmp_path: Path) -> None:
    uid = _record(cli, tmp_path / "run", project)
    report = json.loads((tmp_path / "run" / "report.json").read_text())

    code, stdout, _ = cli("experiments", "list", "--project", project, "--json")
    assert code == 0
    rows = json.loads(stdout)
    assert [(r["uid"], r["kind"], r["project"], r["seed"], r["cost_model_kind"]) for r in rows] == \
        [(uid, "replay", project, 0, "roofline")]

    code, stdout, _ = cli("experiments", "show", uid, "--json")
    assert code == 0
    doc = json.loads(stdout)
    assert doc["results"] == report["results"]
    assert doc["config"]["options"]["policy"] == ["fifo/container"]
    assert doc["config"]["options"]["duration"] == 20.0 and doc["config"]["options"]["cost_model"] == "roofline"
    assert set(doc["data_digests"]) == {"builtin:cluster/local-cpu-4", "builtin:mix/synthetic-3"}
    assert all(len(d) == 64 for d in doc["data_digests"].values())
    assert doc["cost_model"]["kind"] == "roofline" and doc["cost_model"]["sha256"] is None
    assert len(doc["code"]["commit"]) == 40 and isinstance(doc["code"]["dirty"], bool)
    assert sorted(p["name"] for p in doc["plots"]) == ["latency_cdf.png", "timeline-fifo-container-10s.png",
                                                        "timeline-fifo-container.png"]
    assert all(Path(p["path"]).is_file() and p["size_bytes"] > 0 for p in doc["plots"])
    code, stdout, _ = cli("experiments", "show", uid)
    assert code == 0 and "builtin:mix/synthetic-3" in stdout and "fifo/container x1" in stdout

    done = _rerun_in_a_new_process(neo4j, uid, tmp_path / "again")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reproduced exactly" in done.stdout
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in report["results"]]
    assert [{k: v for k, v in r.items() if k != "wall_s"} for r in again["results"]] == strip


def test_rerun_names_a_changed_commit_and_data_digest_with_exit_1(
        cli: Any, project: str, driver: Any, tmp_path: Path) -> None:
    uid = _record(cli, tmp_path / "run", project)
    with driver.session() as s:
        digests = json.loads(s.run("MATCH (e:Experiment {uid: $uid}) RETURN e.data_digests_json AS d",
                                   uid=uid).single()["d"])
        digests["builtin:mix/synthetic-3"] = "0" * 64
        s.run("MATCH (e:Experiment {uid: $uid}) SET e.code_commit = $commit, e.data_digests_json = $d",
              uid=uid, commit="f" * 40, d=json.dumps(digests)).consume()

    code, stdout, _ = cli("experiments", "rerun", uid, "--out", str(tmp_path / "again"))
    assert code == 1
    assert "reproduced exactly" not in stdout
    assert "results reproduced number for number, but not from the same inputs" in stdout
    assert f"code version: commit was '{'f' * 40}'" in stdout
    assert "data digest: builtin:mix/synthetic-3 was sha256 0000000000000000…" in stdout


def test_rerun_names_a_trace_file_that_changed_and_the_results_that_moved(
        cli: Any, project: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{10 + i // 4:02d}.{(i % 4) * 25:02d}00000,{40 + 7 * i},{8 + i % 5}" for i in range(40)]
    trace.write_text("\n".join(rows) + "\n")
    uid = _record(cli, tmp_path / "run", project, "--trace", f"{trace}:acme")
    trace.write_text("\n".join(rows[:21]) + "\n")  # half the requests

    # in this process, which has read the old file: the rerun must read the new one
    code, stdout, _ = cli("experiments", "rerun", uid, "--out", str(tmp_path / "again"))
    assert code == 1
    assert f"data digest: {trace.resolve()} was sha256" in stdout
    assert "not reproduced:" in stdout
    assert "result fifo/container x1: num_requests: recorded" in stdout


def test_compare_prints_both_seeds_side_by_side_and_writes_a_plot(cli: Any, project: str, tmp_path: Path) -> None:
    a = _record(cli, tmp_path / "a", project)
    b = _record(cli, tmp_path / "b", project, "--seed", "1")
    ra = json.loads((tmp_path / "a" / "report.json").read_text())["results"][0]
    rb = json.loads((tmp_path / "b" / "report.json").read_text())["results"][0]
    assert ra["num_requests"] != rb["num_requests"]  # different seeds, different workloads

    code, stdout, stderr = cli("experiments", "compare", a, b, "--out", str(tmp_path / "cmp"))
    assert code == 0, stderr
    seed_row = next(line for line in stdout.splitlines() if " seed " in line)
    assert "0" in seed_row.split() and "1" in seed_row.split()
    assert "fifo/container x1" in stdout and "tokens/s" in stdout and "SLA viol." in stdout
    assert f"{ra['token_throughput_tps']:.4g}" in stdout and f"{rb['token_throughput_tps']:.4g}" in stdout
    assert "result value(s) differ" in stdout
    plot = tmp_path / "cmp" / "compare.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5_000

    code, stdout, _ = cli("experiments", "list", "--project", project, "--json")
    assert code == 0 and {r["uid"] for r in json.loads(stdout)} == {a, b}
    code, stdout, _ = cli("experiments", "list", "--project", project)
    assert code == 0 and "2 experiment(s)" in stdout


def test_an_unknown_experiment_id_is_exit_2_with_a_message(cli: Any, tmp_path: Path) -> None:
    for args in (("show", "no-such-experiment"), ("rerun", "no-such-experiment", "--out", str(tmp_path / "r")),
                 ("compare", "no-such-experiment", "nor-this")):
        code, _, stderr = cli("experiments", *args)
        assert code == 2, args
        assert stderr.startswith("error: no experiment 'no-such-experiment'") and "Traceback" not in stderr
    assert not (tmp_path / "r").exists()

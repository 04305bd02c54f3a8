"""`slicesched replay --record` writes the run and its results to Neo4j; a trace file drives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.graph.connection import Neo4jSettings
from service.graph.repository import GraphRepository

pytestmark = pytest.mark.neo4j
ROOT = Path(__file__).resolve().parents[2]


def test_replay_of_a_trace_file_is_recorded_as_an_experiment(repo: GraphRepository, neo4j: Neo4jSettings,
                                                               tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{10 + i // 4:02d}.{(i % 4) * 25:02d}00000,{40 + 7 * i},{8 + i % 5}" for i in range(60)]
    rows.insert(5, "2023-11-16 18:15:11.0000000,oops,3")
    trace.write_text("\n".join(rows) + "\n")
    before = repo.inspection.run_read("MATCH (e:Experiment) RETURN count(e)").rows[0][0]
    out = tmp_path / "out"
    env = {**os.environ, **neo4j.env()}
    res = subprocess.run([sys.executable, "-m", "service.cli.main", "replay", "--trace", str(trace), "--deal", "round-robin", "--skip-bad",
                          "--cluster", "local-cpu-4", "--tenants", "synthetic-3", "--duration", "30",
                          "--policy", "fifo/container", "--out", str(out), "--record"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["bad_trace_lines"] == 1
    assert report["results"][0]["num_requests"] == 60
    rows_after = repo.inspection.run_read("MATCH (e:Experiment) RETURN e.kind, e.results_json ORDER BY e.created_at").rows
    assert len(rows_after) == before + 1
    kind, results_json = rows_after[-1]
    assert kind == "replay" and json.loads(results_json)[0]["policy"] == "fifo/container"

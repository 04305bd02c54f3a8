"""The command line without Neo4j: listings, traces, bad input as messages with exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_listings() -> None:
    models = cli("model", "list")
    assert models.returncode == 0 and "llama2-70b" in models.stdout and "shape-only" in models.stdout
    clusters = cli("cluster", "list")
    assert clusters.returncode == 0 and "8xA100-nvlink" in clusters.stdout
    queries = cli("cypher", "--list")
    assert queries.returncode == 0 and "dependency_chain" in queries.stdout


def test_trace_stats_reports_bad_lines_or_fails_on_them(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:15:46.6805900,374,44\n"
                   "2023-11-16 18:15:50.9951690,abc,11\n"
                   "2023-11-16 18:15:51.0000000,396,12\n")
    strict = cli("trace", "stats", str(bad))
    assert strict.returncode == 2 and f"{bad}:3" in strict.stderr and "Traceback" not in strict.stderr
    lenient = cli("trace", "stats", str(bad), "--skip-bad")
    assert lenient.returncode == 0 and "line 3" in lenient.stdout
    missing = cli("trace", "stats", str(tmp_path / "none.csv"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_model_export_writes_a_graph_document(tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    res = cli("model", "export", "tiny", "--phase", "decode", "--context", "16", "-o", str(out))
    assert res.returncode == 0 and out.exists() and '"phase": "decode"' in out.read_text()
    bad = cli("model", "export", "tiny", "--phase", "prefill", "--tokens", "0")
    assert bad.returncode == 2 and "tokens must be" in bad.stderr

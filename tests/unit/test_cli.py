"""The command line without Neo4j: listings, traces, bad input as messages with exit codes.

Listings and work that succeeds run the real command; bad input and trace statistics run
:func:`service.cli.main` in this process (:func:`tests.conftest.cli_in_process`): the same exit
codes and messages without a process that imports torch for each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_in_process

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli.main", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


@pytest.mark.slow
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
    strict = cli_in_process("trace", "stats", str(bad))
    assert strict.returncode == 2 and f"{bad}:3" in strict.stderr and "Traceback" not in strict.stderr
    lenient = cli_in_process("trace", "stats", str(bad), "--skip-bad")
    assert lenient.returncode == 0 and "line 3" in lenient.stdout
    missing = cli_in_process("trace", "stats", str(tmp_path / "none.csv"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_trace_stats_skips_a_line_that_is_not_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
                    b'{"timestamp": 5, "input_length": 10, "output_length": 5, "hash_ids": [1], "p": "\xff"}\n'
                    b'{"timestamp": 9, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n')
    strict = cli_in_process("trace", "stats", str(bad))
    assert strict.returncode == 2 and f"{bad}:2: not UTF-8" in strict.stderr and "Traceback" not in strict.stderr
    assert len(strict.stderr.strip().splitlines()) == 1
    lenient = cli_in_process("trace", "stats", str(bad), "--skip-bad")
    assert lenient.returncode == 0 and "line 2: not UTF-8" in lenient.stdout, lenient.stdout + lenient.stderr


@pytest.mark.subprocess
def test_malformed_cluster_yaml_is_one_line_with_line_and_column(tmp_path: Path) -> None:
    spec = tmp_path / "broken.yaml"
    spec.write_text("name: c\nhosts:\n  - host_id: h0\n    devices: [a, b\n  - host_id: h1\n")
    r = cli("cluster", "apply", str(spec))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{spec}:5:" in r.stderr and "not valid YAML" in r.stderr


@pytest.mark.slow
def test_model_export_writes_a_graph_document(tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    res = cli("model", "export", "tiny", "--phase", "decode", "--context", "16", "-o", str(out))
    assert res.returncode == 0 and out.exists() and '"phase": "decode"' in out.read_text()
    bad = cli_in_process("model", "export", "tiny", "--phase", "prefill", "--tokens", "0")
    assert bad.returncode == 2 and "tokens must be" in bad.stderr


@pytest.mark.slow
def test_model_export_traces_a_model_directory(hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    res = cli("model", "export", "--path", str(hf_dirs["gpt2"]), "--phase", "decode", "--context", "16",
              "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert f'"model_name": "hf:{hf_dirs["gpt2"]}"' in out.read_text()
    neither = cli_in_process("model", "export", "--phase", "decode")
    assert neither.returncode == 2 and "--path DIR" in neither.stderr and "--graph" not in neither.stderr
    unsupported = cli_in_process("model", "export", "--path", str(tmp_path))
    assert unsupported.returncode == 2 and "no config.json" in unsupported.stderr and "Traceback" not in unsupported.stderr


def test_neo4j_start_refuses_a_bad_port_and_a_port_in_use(tmp_path: Path) -> None:
    import socket

    from tests.conftest import cli_in_process

    bad = cli_in_process("neo4j", "start", "--port", "70000", "--state-dir", str(tmp_path / "s"))
    assert bad.returncode == 2 and "a TCP port in 1..65535" in bad.stderr
    wrong_action = cli_in_process("neo4j", "stop", "--port", "7687", "--state-dir", str(tmp_path / "s"))
    assert wrong_action.returncode == 2 and "--port is for 'start' only" in wrong_action.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = cli_in_process("neo4j", "start", "--port", str(port), "--state-dir", str(tmp_path / "s"))
    assert busy.returncode == 3 and f"port {port} on 127.0.0.1 is in use" in busy.stderr

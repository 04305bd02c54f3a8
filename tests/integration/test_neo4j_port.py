"""``slicesched neo4j start --port``: the managed server listens where it is told."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.graph.local_server import free_port


@pytest.mark.slow
def test_neo4j_starts_on_the_port_it_is_given(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLICESCHED_NEO4J_")}
    state = str(tmp_path / "state")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "service.cli.main", "neo4j", *args, "--state-dir", state],
                              capture_output=True, text=True, env=env, timeout=180)

    try:
        started = cli("start", "--port", str(port))
        assert started.returncode == 0, started.stderr
        assert f"bolt://127.0.0.1:{port}" in started.stdout
        status = cli("status")
        assert status.returncode == 0 and f"bolt://127.0.0.1:{port}" in status.stdout
        moved = cli("start", "--port", str(free_port()))
        assert moved.returncode == 2 and f"already running on port {port}" in moved.stderr
    finally:
        assert cli("stop").returncode == 0

"""Installing the managed Neo4j's jars: processes installing at once (the test workers on a fresh
machine) resolve them once, the others wait and find them complete."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from service.graph.local_server import LocalNeo4j

# Stands in for Maven: counts its runs, takes a while, and copies one "jar" into -DoutputDirectory.
FAKE_MVN = """#!/bin/sh
echo run >> "{runs}"
sleep 0.5
for a in "$@"; do case "$a" in -DoutputDirectory=*) d="${{a#-DoutputDirectory=}}";; esac; done
mkdir -p "$d" && echo jar > "$d/neo4j.jar"
"""


@pytest.mark.subprocess
def test_concurrent_installs_resolve_the_jars_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir, runs = tmp_path / "bin", tmp_path / "mvn-runs"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text(FAKE_MVN.format(runs=runs))
    mvn.chmod(mvn.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLICESCHED_CACHE", str(tmp_path / "cache"))

    errors: list[BaseException] = []

    def install() -> None:
        try:
            LocalNeo4j(tmp_path / "state", version="0.0-test").install(log=False)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=install) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert runs.read_text().count("run") == 1
    lib = tmp_path / "cache" / "neo4j" / "0.0-test" / "lib"
    assert (lib / "neo4j.jar").read_text() == "jar\n"

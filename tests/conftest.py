"""Shared fixtures. Integration tests run against the real Neo4j server, never a mock.

One managed server per test process (``make test`` runs pytest-xdist workers, each its own
process: own free port, own data dir under pytest's tmp dir, its own generated password: auth is
on); each test isolates itself by a fresh tenant id, so tests never share graph state. With
``SLICESCHED_NEO4J_URI`` set (and ``SLICESCHED_NEO4J_USER`` / ``SLICESCHED_NEO4J_PASSWORD``),
tests use that server instead. ``neo4j`` is the server's resolved settings (URI and credentials;
``neo4j.env()`` for a child process), ``neo4j_uri`` its URI alone.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from service.data import fetch_hint, is_present, locate

if TYPE_CHECKING:
    from service.graph.connection import Neo4jSettings

# The default (learned) cost model needs a trained artifact; tests that exercise it train a small
# one into a tmp cache (tests/unit/test_cost_model_choice.py). Everything else, and every service
# a test starts, prices iterations with the roofline as before.
os.environ.setdefault("SLICESCHED_COST_MODEL", "roofline")


def data_absent(*names: str) -> list[str]:
    """The named data sets (service/data/manifest.json) that no data folder holds completely
    (``$SLICESCHED_DATA``, then ``../shared/data``) and that a test may therefore skip for: none in
    CI (``CI=true``), where the data is always there, so such tests run and fail loudly."""
    return [] if os.environ.get("CI") == "true" else [n for n in names if not is_present(n)]


def needs_data(*names: str) -> pytest.MarkDecorator:
    """Skip unless the named data sets are present; the reason says how to fetch them."""
    missing = data_absent(*names)
    return pytest.mark.skipif(bool(missing), reason=fetch_hint(*missing) if missing else "", data_sets=names)


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``make test-fast`` (``TEST_TIER=fast``) a test that starts a process fails, saying
    which marker it lacks: the tier's "no subprocess" is checked, not hoped for."""
    if os.environ.get("TEST_TIER") != "fast":
        return

    def refuse(self: object, args: object, *rest: object, **kwargs: object) -> None:
        raise AssertionError(f"this test starts a process ({args!r}): mark it subprocess (or slow)")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tiers by what a test needs, so ``-m`` can pick them (``make test-fast``): ``neo4j`` for every
    test that reaches the session's server through its fixtures (directly or through another
    fixture), ``browser`` for tests/browser, ``data`` for tests that read the public data sets."""
    for item in items:
        if "neo4j" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.neo4j)
        if "tests/browser/" in item.nodeid:
            item.add_marker(pytest.mark.browser)
        if any("data_sets" in m.kwargs for m in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.data)


def cli_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``slicesched ARGS`` run by :func:`service.cli.main` in this process, with its exit code and
    output captured as a subprocess's would be. For bad-input paths, which exit before any work:
    a process of its own would spend its seconds importing torch. Each command keeps a test that
    runs the real process."""
    from service.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's refusals
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(["slicesched", *args], code, out.getvalue(), err.getvalue())


def data_path(rel: str) -> Path:
    """A public data file or folder by its data-folder path, where readers find it (or where fetch
    would put it, for a test that skips without it)."""
    return locate(rel)


@pytest.fixture(scope="session")
def neo4j(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Neo4jSettings]:
    from service.graph.connection import Neo4jSettings
    from service.graph.local_server import LocalNeo4j

    external = Neo4jSettings.from_env()
    if not external.managed:
        yield external
        return
    server = LocalNeo4j(tmp_path_factory.mktemp("neo4j-state"), heap="512m", pagecache="128m")
    info = server.start(log=False)
    user, password = server.auth()
    try:
        yield Neo4jSettings(uri=info.uri, user=user, password=password, database=external.database,
                            state_dir=server.state_dir)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def neo4j_uri(neo4j: Neo4jSettings) -> str:
    assert neo4j.uri is not None
    return neo4j.uri


@pytest.fixture(scope="session")
def driver(neo4j: Neo4jSettings) -> Iterator[object]:
    from neo4j import GraphDatabase

    drv = GraphDatabase.driver(neo4j.uri, auth=neo4j.auth)
    drv.verify_connectivity()
    yield drv
    drv.close()


@pytest.fixture(scope="session")
def repo(driver: object) -> object:
    from service.graph.repository import GraphRepository

    r = GraphRepository(driver)  # type: ignore[arg-type]
    r.apply_schema()
    return r


@pytest.fixture
def tenant() -> str:
    """A tenant id no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def cluster_name() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random Hugging Face model directories, ``llama`` and ``gpt2`` (tests/hf_dirs.py)."""
    from tests.hf_dirs import make_model_dir

    root = tmp_path_factory.mktemp("hf-models")
    return {kind: make_model_dir(root / kind, kind) for kind in ("llama", "gpt2")}

"""The data manifest, the resolver ($SLICESCHED_DATA, then ../shared/data), fetch and list.

Fetch runs against local ``file://`` folders and an ``httpx.MockTransport``: no network. A test
manifest with small generated files stands in for the real one, except where the real manifest
itself is checked (its checksums against the copies in ../shared/data, and that every path a
reader uses is in it).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.cli.main import main
from service.data import (
    DataMissingError,
    DataRoots,
    Manifest,
    UnknownDataSetError,
    fetch_hint,
    find,
    list_files,
    load_manifest,
    locate,
    resolve,
)
from service.data import location as data_location
from service.data.fetch import DataFetchError, FetchEvent, fetch
from service.data.manifest import parse_manifest
from service.replay.binding import TRACE_FILES, resolve_source
from service.replay.mix import builtin_mixes, load_mix
from tests.conftest import data_absent, needs_data

FILES = {"alpha/a.csv": b"x,y\n1,2\n", "alpha/sub/b.csv": b"z\n" * 50, "beta/c.jsonl": b'{"t": 1}\n'}


def _manifest(upstream: Path) -> Manifest:
    """Two data sets whose upstream URLs point into ``upstream/repo/`` (not the data-folder layout)."""
    datasets: dict[str, list[dict[str, Any]]] = {}
    for rel, body in FILES.items():
        src = upstream / "repo" / rel.replace("/", "-")
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_bytes(body)
        datasets.setdefault(rel.split("/")[0], []).append(
            {"path": rel, "url": src.as_uri(), "sha256": hashlib.sha256(body).hexdigest(), "size_bytes": len(body)})
    return parse_manifest({"datasets": [
        {"name": name, "description": "d", "license": "MIT", "source": "https://example.org", "citation": "c",
         "read_by": ["tests"], "files": files} for name, files in datasets.items()]})


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Manifest, DataRoots, Path]:
    """(test manifest, empty data folders, a mirror folder holding every file at its data path)."""
    manifest = _manifest(tmp_path / "upstream")
    mirror = tmp_path / "mirror"
    for rel, body in FILES.items():
        (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
        (mirror / rel).write_bytes(body)
    return manifest, DataRoots(tmp_path / "cache", tmp_path / "shared"), mirror


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) if folder.exists() else []


# ---- fetch ----------------------------------------------------------------------------------------

def test_fetch_downloads_verifies_and_then_keeps_what_is_there(setup: tuple[Manifest, DataRoots, Path]) -> None:
    manifest, roots, _ = setup
    seen: list[FetchEvent] = []
    done = fetch(["alpha"], roots=roots, manifest=manifest, progress=seen.append)
    assert [(e.file.path, e.state) for e in done] == [("alpha/a.csv", "downloaded"), ("alpha/sub/b.csv", "downloaded")]
    assert [e.state for e in seen] == ["downloading", "downloaded"] * 2 and seen[0].url.startswith("file://")
    assert (roots.cache / "alpha/sub/b.csv").read_bytes() == FILES["alpha/sub/b.csv"]
    assert _files(roots.cache) == ["alpha", "alpha/a.csv", "alpha/sub", "alpha/sub/b.csv"]  # no temporary left
    again: list[FetchEvent] = []
    fetch([], roots=roots, manifest=manifest, progress=again.append)  # all: alpha kept, beta downloaded
    assert [(e.file.path, e.state) for e in again if e.state != "downloading"] == [
        ("alpha/a.csv", "present"), ("alpha/sub/b.csv", "present"), ("beta/c.jsonl", "downloaded")]


def test_a_mirror_replaces_the_upstream_urls(setup: tuple[Manifest, DataRoots, Path], tmp_path: Path) -> None:
    manifest, roots, mirror = setup
    shutil.rmtree(tmp_path / "upstream")  # upstream unreachable: only the mirror can serve
    done = fetch(["beta"], roots=roots, manifest=manifest, mirror=mirror.as_uri())
    assert done[0].url == f"{mirror.as_uri()}/beta/c.jsonl" and done[0].state == "downloaded"
    assert (roots.cache / "beta/c.jsonl").read_bytes() == FILES["beta/c.jsonl"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend"])
def test_a_corrupt_mirror_file_is_refused_and_nothing_is_left(setup: tuple[Manifest, DataRoots, Path],
                                                              damage: str) -> None:
    manifest, roots, mirror = setup
    path, body = mirror / "alpha/sub/b.csv", FILES["alpha/sub/b.csv"]
    bad = {"flip": b"Z" + body[1:], "truncate": body[:-3], "extend": body + b"more"}[damage]
    path.write_bytes(bad)
    with pytest.raises(DataFetchError, match=r"alpha/sub/b\.csv: ") as info:
        fetch(["alpha"], roots=roots, manifest=manifest, mirror=mirror.as_uri())
    expected = hashlib.sha256(body).hexdigest()
    assert expected in str(info.value)
    if damage != "extend":  # an overlong file is cut off at the manifest's size, before its digest is known
        assert hashlib.sha256(bad).hexdigest() in str(info.value)
    assert _files(roots.cache / "alpha" / "sub") == []  # no temporary, no half file, no empty folder
    assert _files(roots.cache) == ["alpha", "alpha/a.csv"]  # the file verified before it stays


def test_http_downloads_stream_through_httpx(setup: tuple[Manifest, DataRoots, Path]) -> None:
    manifest, roots, _ = setup
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        rel = request.url.path.removeprefix("/data/")
        return httpx.Response(200, content=FILES[rel]) if rel in FILES else httpx.Response(404)

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        fetch(["beta"], roots=roots, manifest=manifest, mirror="https://mirror.example/data/", client=client)
        assert asked == ["https://mirror.example/data/beta/c.jsonl"]
        assert (roots.cache / "beta/c.jsonl").read_bytes() == FILES["beta/c.jsonl"]
        with pytest.raises(DataFetchError, match=r"alpha/a.csv: https://mirror.example/elsewhere/alpha/a.csv "
                                                 r"answered HTTP 404"):
            fetch(["alpha"], roots=roots, manifest=manifest, mirror="https://mirror.example/elsewhere", client=client)
    assert _files(roots.cache) == ["beta", "beta/c.jsonl"]


def test_an_unknown_name_is_refused_before_anything_is_fetched(setup: tuple[Manifest, DataRoots, Path]) -> None:
    manifest, roots, _ = setup
    with pytest.raises(UnknownDataSetError, match="unknown data set 'gamma': the data sets are alpha, beta"):
        fetch(["alpha", "gamma"], roots=roots, manifest=manifest)
    assert not roots.cache.exists()


# ---- list and the resolver ------------------------------------------------------------------------

def test_list_reports_present_missing_and_corrupt_where_readers_find_them(
        setup: tuple[Manifest, DataRoots, Path]) -> None:
    manifest, roots, mirror = setup
    shutil.copytree(mirror / "alpha", roots.shared / "alpha")
    (roots.cache / "alpha").mkdir(parents=True)
    (roots.cache / "alpha/a.csv").write_bytes(b"x,y\n1,3\n")  # same size, other bytes: shadows the good copy
    got = {s.file.path: (s.status, s.folder) for s in list_files(roots=roots, manifest=manifest)}
    assert got == {"alpha/a.csv": ("corrupt", roots.cache), "alpha/sub/b.csv": ("present", roots.shared),
                   "beta/c.jsonl": ("missing", None)}
    (status,) = list_files(["beta"], roots=roots, manifest=manifest)
    assert status.status == "missing"


def test_the_resolver_looks_in_the_cache_then_beside_the_project(setup: tuple[Manifest, DataRoots, Path]) -> None:
    manifest, roots, mirror = setup
    shutil.copytree(mirror / "alpha", roots.shared / "alpha")
    assert find("alpha/a.csv", roots=roots, manifest=manifest) == roots.shared / "alpha/a.csv"
    (roots.cache / "alpha").mkdir(parents=True)
    shutil.copy(mirror / "alpha/a.csv", roots.cache / "alpha/a.csv")
    assert resolve("alpha/a.csv", roots=roots, manifest=manifest) == roots.cache / "alpha/a.csv"
    # a folder counts where it is complete: the cache's lacks sub/b.csv
    assert find("alpha", roots=roots, manifest=manifest) == roots.shared / "alpha"
    assert find("alpha/sub", roots=roots, manifest=manifest) == roots.shared / "alpha/sub"
    assert find("beta/c.jsonl", roots=roots, manifest=manifest) is None
    with pytest.raises(DataMissingError, match=r"data set 'beta' is absent .*: run `slicesched data fetch beta`"):
        resolve("beta/c.jsonl", roots=roots, manifest=manifest)
    with pytest.raises(DataMissingError, match=r"own/x\.csv is in neither data folder"):
        resolve("own/x.csv", roots=roots, manifest=manifest)


def test_the_data_folders_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLICESCHED_DATA", str(tmp_path / "d"))
    roots = DataRoots.from_env()
    assert roots.cache == tmp_path / "d"
    assert roots.shared == Path(__file__).resolve().parents[3] / "shared" / "data"  # beside the project
    monkeypatch.delenv("SLICESCHED_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert DataRoots.from_env().cache == tmp_path / "xdg" / "slicesched" / "data"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert DataRoots.from_env().cache == tmp_path / "home" / ".cache" / "slicesched" / "data"


def _no_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Neither data folder holds anything: an empty cache and no ../shared/data."""
    monkeypatch.setenv("SLICESCHED_DATA", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(data_location, "PROJECT_ROOT", tmp_path / "clone" / "slicesched")
    monkeypatch.delenv("CI", raising=False)


def test_readers_use_the_resolver_and_a_missing_trace_says_how_to_fetch_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_data(monkeypatch, tmp_path)
    with pytest.raises(DataMissingError, match=r"run `slicesched data fetch azure-llm-2023`"):
        resolve_source("azure-code")
    own = tmp_path / "empty-cache" / TRACE_FILES["azure-code"]
    own.parent.mkdir(parents=True)
    own.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    assert resolve_source("azure-code") == own
    assert data_absent("azure-llm-2023", "servegen") == ["azure-llm-2023", "servegen"]
    mark = needs_data("servegen")
    assert mark.kwargs["reason"] == "data set 'servegen' is absent: run `slicesched data fetch servegen`"
    assert locate("servegen/reason") == tmp_path / "empty-cache" / "servegen" / "reason"  # where fetch puts it


# ---- the CLI --------------------------------------------------------------------------------------

def test_cli_exit_codes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _no_data(monkeypatch, tmp_path)
    assert main(["data", "fetch", "azure-llm-2023", "nope"]) == 2
    assert "unknown data set 'nope': the data sets are azure-llm-2023, mooncake-synthetic" in capsys.readouterr().err
    assert main(["data", "fetch", "--mirror", "ftp://example.org/data"]) == 2
    assert "expected an http://, https:// or file:// URL" in capsys.readouterr().err
    empty = tmp_path / "empty-mirror"
    empty.mkdir()
    assert main(["data", "fetch", "splitwise-perf", "--mirror", empty.as_uri()]) == 1
    err = capsys.readouterr().err
    assert "[1/1] splitwise-perf/perf_model.csv" in err and "error: splitwise-perf/perf_model.csv: cannot read" in err
    assert not (tmp_path / "empty-cache").exists()
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in load_manifest().names) and "slicesched data fetch azure-llm-2023" in out


@needs_data("splitwise-perf")
def test_cli_fetch_from_a_file_mirror_then_list(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    shared = locate("splitwise-perf").parent  # the data folder holding it serves as the mirror
    monkeypatch.setenv("SLICESCHED_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("SLICESCHED_DATA_MIRROR", shared.as_uri())
    assert main(["data", "fetch", "splitwise-perf"]) == 0
    assert "splitwise-perf: 1 file, 0.1 MB verified" in capsys.readouterr().out
    assert (tmp_path / "cache/splitwise-perf/perf_model.csv").read_bytes() == (
        shared / "splitwise-perf/perf_model.csv").read_bytes()
    assert main(["data", "list", "splitwise-perf", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["status"], row["folder"]) == ("present", str(tmp_path / "cache"))
    # --missing (what make test and make demo run) leaves a data set some folder holds alone
    monkeypatch.setenv("SLICESCHED_DATA_MIRROR", (tmp_path / "no-mirror").as_uri())  # a download would fail
    assert main(["data", "fetch", "--missing", "splitwise-perf"]) == 0
    assert "splitwise-perf: present in" in capsys.readouterr().out


# ---- the real manifest ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", load_manifest().names)
def test_the_manifest_matches_the_public_copies(name: str) -> None:
    if missing := data_absent(name):
        pytest.skip(fetch_hint(*missing))
    wrong = [(s.file.path, s.status, s.detail) for s in list_files([name]) if s.status != "present"]
    assert wrong == []


def test_every_path_a_reader_uses_is_in_the_manifest() -> None:
    manifest = load_manifest()
    paths = {f.path for d in manifest.datasets for f in d.files}
    assert set(TRACE_FILES.values()) <= paths  # the cost model's: tests/unit/test_cost_models.py
    servegen = {t.arrivals["source"] for m in builtin_mixes() for t in load_mix(m).tenants
                if t.arrivals.get("kind") == "servegen"}
    assert servegen and all(manifest.files_under(f"servegen/{s}") for s in servegen)
    assert all(manifest.files_under(f"servegen/{s}") for s in ("reason/deepseek-r1", "multimodal/mm-image"))

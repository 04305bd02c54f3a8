"""Live slice observations as training rows: the traced operators of a slice's layers, the
observed latency as the target, the JSON-lines file, the refit of the default artifact's GNN,
and the command's bad options."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from learned.artifact import SHIPPED_GNN, TrainingInputs, default_cache_dir
from learned.observations import (
    ObservedSlice,
    load_observations,
    load_observed,
    observation_samples,
    observations_file,
    save_observations,
    slice_op_ids,
    train_observed,
)
from service.cli.cost_model import parse_since, train_command
from service.core.cost import slice_of
from service.domain.model_config import model_config
from service.live.retraining import trace_observed
from service.models.trace import trace_phase


def obs(uid: str, family: str = "tiny-llama", start: int = 0, end: int = 1, latency_s: float = 0.004,
        device_kind: str = "cpu", **kw: object) -> ObservedSlice:
    return ObservedSlice(uid, family, device_kind, start, end, 2, 8, latency_s, 1000.0, **kw)  # type: ignore[arg-type]


def test_a_slices_operators_are_its_layers_with_the_ends_it_carries() -> None:
    graph = trace_phase(model_config("tiny-llama"), "prefill", batch=2, tokens=8)
    first, second = slice_op_ids(graph, 2, 0, 1), slice_op_ids(graph, 2, 1, 2)
    assert sorted(first + second) == sorted(o.op_id for o in graph.operators)  # every operator once
    kinds = {o.op_id: o.kind for o in graph.operators}
    assert kinds[first[0]] == "embedding" and "embedding" not in {kinds[o] for o in second}
    assert kinds[second[-2]] == "linear"  # the head ends the last slice
    assert all(o.layer in (-1, 0) for o in graph.operators if o.op_id in first)


def test_observations_become_samples_with_their_latency_as_the_target() -> None:
    rows = [obs("a"), obs("b", start=1, end=2, latency_s=0.006), obs("c", family="no-such-model"),
            obs("d", device_kind="no-such-device"), obs("e", start=1, end=3), obs("f", latency_s=0.0),
            obs("g", phase="decode", context=20, latency_s=0.002), obs("h", phase="warmup")]
    samples = observation_samples(rows, trace_observed)
    assert [s.target_ms for s in samples] == pytest.approx([4.0, 6.0, 2.0])  # the others are left out
    graph = trace_phase(model_config("tiny-llama"), "prefill", batch=2, tokens=8)
    features, edges = slice_of(graph, slice_op_ids(graph, 2, 1, 2))
    assert samples[1].ops == tuple(features) and samples[1].edges == tuple(edges)
    assert samples[0].device.kind == "cpu"
    # a decode row: one new token for each of its 2 sequences over 20 cached tokens
    step = trace_phase(model_config("tiny-llama"), "decode", batch=2, context=20)
    features, edges = slice_of(step, slice_op_ids(step, 2, 0, 1))
    assert samples[2].ops == tuple(features) and samples[2].edges == tuple(edges)


def test_observation_files_round_trip_and_are_named_by_their_bytes(tmp_path: Path) -> None:
    rows = [obs("a"), obs("b", start=1, end=2)]
    assert load_observations(save_observations(rows, tmp_path / "x.jsonl")) == rows
    one, two = observations_file(rows, tmp_path), observations_file(list(rows), tmp_path)
    assert one == two and one.parent == tmp_path / "observations"
    assert observations_file(rows[:1], tmp_path) != one
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(Exception, match="not a file of slice observations"):
        load_observations(tmp_path / "bad.jsonl")


class _Inputs(TrainingInputs):
    """Inputs whose key needs no Vidur files (the base artifact is copied from the cache)."""

    def key(self) -> str:
        return "test0000base0000"


def test_the_gnn_is_refitted_on_the_observations_beside_the_base_artifact(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cached = sorted(default_cache_dir().glob("learned-*/meta.json"))
    if not cached:
        pytest.skip("no trained default artifact in the cache to copy a base from")
    base = tmp_path / "learned-test0000base0000"
    base.mkdir()
    for name in ("meta.json", "table.json"):
        shutil.copy(cached[0].parent / name, base / name)
    import learned.observations as module

    monkeypatch.setattr(module, "load_vidur", lambda data_dir: [])  # the profiles' samples: none here
    monkeypatch.setattr(module, "base_samples", lambda timings, inputs: [])
    path = save_observations([obs(f"o{i}", latency_s=0.001 * (i + 1), start=i % 2, end=i % 2 + 1)
                              for i in range(12)], tmp_path / "o.jsonl")
    inputs = _Inputs(tmp_path, (), replace(SHIPPED_GNN, epochs=2))
    target = train_observed(path, inputs, tmp_path, trace_observed, progress=lambda s: None)
    assert target.name.startswith("observed-") and (target / "gnn").is_dir()
    loaded = load_observed(target)
    meta = (target / "meta.json").read_text()
    assert '"rows": 12' in meta and str(base) in meta and loaded.sha256
    assert train_observed(path, inputs, tmp_path, trace_observed, progress=lambda s: None) == target  # present
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(Exception, match="none of the 0 observations"):
        train_observed(tmp_path / "empty.jsonl", inputs, tmp_path, trace_observed)


def test_the_commands_bad_options_exit_2_and_an_unreachable_gmg_3(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_since("2026-12-04T18:00:00Z") == parse_since("2026-12-04T19:00:00+01:00") == 1796407200.0
    assert parse_since("yesterday") is None
    assert train_command(["--since", "2026-12-04T18:00:00Z"]) == 2
    assert train_command(["--from-gmg", "--since", "yesterday"]) == 2
    assert "not an ISO time" in capsys.readouterr().err
    monkeypatch.setenv("SLICESCHED_NEO4J_URI", "bolt://127.0.0.1:17598")  # nothing listens there
    monkeypatch.setenv("SLICESCHED_NEO4J_USER", "neo4j")
    monkeypatch.setenv("SLICESCHED_NEO4J_PASSWORD", "unused-password")
    assert train_command(["--from-gmg"]) == 3
    assert "cannot read the GMG" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        train_command(["--from-gmg", "--epochs", "3"])  # a trainer option that does not apply
    assert exit_.value.code == 2

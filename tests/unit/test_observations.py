"""Live slice observations as training rows: the traced operators of a slice's layers, the
observed latency as the target, the JSON-lines file, the refit of the default artifact's GNN,
and the command's bad options."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from learned.artifact import SHIPPED_GNN, TrainingInputs, default_cache_dir
from learned.observations import (
    ObservedSlice,
    choose_on_observations,
    load_observations,
    load_observed,
    observation_samples,
    observations_file,
    observed_repeats,
    save_observations,
    slice_op_ids,
    split_for_choice,
    train_observed,
)
from learned.rates import KindRates, RateCostModel, _work, fit_rates
from service.cli.cost_model import parse_since, train_command
from service.core.cost import Latency, OpFeatures, slice_of
from service.domain.cluster import Device
from service.domain.error import InvalidInputError
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
    assert "cpu" not in loaded.choice  # 3 held out of 12 is too few to choose on: the base's choice stays
    more = save_observations([obs(f"m{i}", latency_s=0.001 * (i % 5 + 1), start=i % 2, end=i % 2 + 1)
                              for i in range(40)], tmp_path / "more.jsonl")
    chosen = load_observed(train_observed(more, inputs, tmp_path, trace_observed, progress=lambda s: None))
    assert chosen.artifact is not None
    evidence = json.loads((chosen.artifact / "meta.json").read_text())["observed_choice"]["per_device_kind"]
    assert evidence["cpu"]["n"] == 10 and evidence["cpu"]["chosen"] in ("gnn", "table", "rates")
    assert chosen.choice["cpu"] == chosen.slice_choice["cpu"] == evidence["cpu"]["chosen"]
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


def test_the_latest_quarter_of_each_kind_is_held_out_to_choose_on() -> None:
    rows = [obs(f"c{i}", latency_s=0.001) for i in range(40)]
    rows = [replace(r, observed_wall=1000.0 + (7 * i) % 40) for i, r in enumerate(rows)]  # shuffled in time
    rows += [obs(f"a{i}", device_kind="A100-80GB") for i in range(12)]  # 3 would be held: too few
    fit, held = split_for_choice(rows)
    assert len(held) == 10 and {r.device_kind for r in held} == {"cpu"}
    assert min(r.observed_wall for r in held) > max(r.observed_wall for r in fit if r.device_kind == "cpu")
    assert len(fit) == 42
    assert sorted(r.uid for r in fit + held) == sorted(r.uid for r in rows)


class _Constant:
    """A cost model answering every slice with the same latency."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    @property
    def name(self) -> str:
        return f"constant-{self.seconds}"

    def predict(self, ops: Sequence[OpFeatures], device: Device) -> Latency:
        return Latency(self.seconds, self.seconds, self.seconds)


def test_each_observed_kind_gets_the_model_with_the_lower_held_out_error() -> None:
    held = [obs(f"h{i}", latency_s=0.004) for i in range(9)] + [obs(f"x{i}", device_kind="A100-80GB") for i in range(3)]
    evidence = choose_on_observations({"gnn": _Constant(0.0041), "table": _Constant(0.008)}, held, trace_observed)
    assert list(evidence) == ["cpu"]  # 3 A100 rows are too few to choose on
    assert evidence["cpu"]["chosen"] == "gnn" and evidence["cpu"]["n"] == 9
    assert evidence["cpu"]["gnn_mape_pct"] == pytest.approx(2.5) and evidence["cpu"]["table_mape_pct"] == pytest.approx(100.0)
    flipped = choose_on_observations({"gnn": _Constant(0.02), "table": _Constant(0.004)}, held, trace_observed)
    assert flipped["cpu"]["chosen"] == "table"


def test_observations_are_repeated_to_a_fifth_of_the_refit() -> None:
    assert observed_repeats(25_000, 25) == 250  # 6,250 of 31,250 samples
    assert observed_repeats(100, 1_000) == 1  # never dropped
    assert observed_repeats(100, 0) == 0


def test_rates_fitted_on_observations_recover_a_linear_device() -> None:
    truth = KindRates(20e-6, 1e-10, 2e-9, 1.0, 1.0, 0)
    rows = [obs(f"r{i}", start=i % 2, end=i % 2 + 1, phase="decode" if i % 3 == 0 else "prefill", context=8 + i)
            for i in range(24)]
    samples = observation_samples(rows, trace_observed)
    exact = [replace(s, target_ms=1e3 * truth.seconds(*_work(s.ops))) for s in samples]
    fitted = fit_rates(exact)
    assert fitted is not None and fitted.n == len(exact)
    model = RateCostModel({"cpu": fitted})
    for s in exact:
        assert model.predict(s.ops, s.device).p50_s * 1e3 == pytest.approx(s.target_ms, rel=1e-6)
    assert fit_rates(exact[:3]) is None  # too few rows
    block = exact[0].ops
    stacked = model.predict_stack(block[:2], block, 3, block[-1:], exact[0].device).p50_s
    assert stacked == pytest.approx(model.predict([*block[:2], *block * 3, *block[-1:]], exact[0].device).p50_s)
    assert RateCostModel.from_doc(model.to_doc()).kinds == model.kinds
    with pytest.raises(InvalidInputError, match="no fitted rates"):
        model.predict(block, replace(exact[0].device, kind="A100-80GB"))

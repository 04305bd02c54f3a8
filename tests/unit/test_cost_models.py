"""Cost models: readers on the real profiles, roofline, table, GNN training/quantiles/artifacts, profiler."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch

from executor.profiler import Sweep, profile_cpu
from learned.artifact import CPU_OVERHEADS, TrainingInputs
from learned.evaluate import (
    ATTENTION_CSV,
    VIDUR_ROOT,
    Case,
    held_out_cases,
    score,
    training_samples,
    vidur_split,
)
from learned.gnn import GnnConfig, GnnCostModel, artifact_dir, train_gnn
from learned.profile import (
    COLUMNS,
    LAYER_CHAIN,
    OpTiming,
    ProfileStore,
    layer_chains,
    read_splitwise,
    read_vidur_attention,
    read_vidur_compute,
    read_vidur_mlp,
    timing_features,
)
from learned.roofline import RooflineCostModel, device_of_kind
from learned.table import ProfileTableCostModel
from service.core.cost import CostModel, OpFeatures
from service.data import load_manifest
from tests.conftest import data_path, needs_data

torch.set_num_threads(1)

VIDUR = data_path("vidur-profiling/profiling")
needs_vidur = needs_data("vidur-profiling")


@pytest.fixture(scope="module")
def vidur_rows() -> list[OpTiming]:
    return read_vidur_compute(VIDUR / "compute")


# -- readers -----------------------------------------------------------------------------------

@pytest.mark.slow
@needs_vidur
def test_vidur_mlp_reader_row_counts_match_source(vidur_rows: list[OpTiming]) -> None:
    chains = layer_chains(vidur_rows)
    assert len(chains) == 20_091  # SOURCE.md: 20,091 rows in total
    emb = [t for t in vidur_rows if t.op == "emb"]
    assert len(emb) == 20_091
    # phi-2 lacks post_attention_layernorm: 3 GPUs x 261 rows have 8 chain ops, the rest 9
    assert sum(len(c) == 8 for c in chains) == 3 * 261
    assert {t.device_kind for t in vidur_rows} == {"A100-80GB", "H100-80GB", "A40"}


@needs_vidur
def test_vidur_dims_follow_the_model_columns() -> None:
    rows = read_vidur_mlp(VIDUR / "compute" / "h100" / "meta-llama" / "Llama-2-70b-hf" / "mlp.csv")
    tp2 = {t.op: t for t in rows if t.tp == 2 and t.tokens == 1}
    assert (tp2["attn_pre_proj"].dim_in, tp2["attn_pre_proj"].dim_out) == (8192, (64 + 16) * 128 // 2)
    assert (tp2["mlp_up_proj"].dim_in, tp2["mlp_up_proj"].dim_out) == (8192, 2 * 28672 // 2)
    assert (tp2["mlp_down_proj"].dim_in, tp2["mlp_down_proj"].dim_out) == (28672 // 2, 8192)
    assert tp2["mlp_act"].kind == "activation" and tp2["attn_rope"].kind == "elementwise"
    assert tp2["emb"].kind == "embedding" and tp2["input_layernorm"].kind == "norm"


def test_the_training_files_are_in_the_data_manifest() -> None:
    listed = {f.path for f in load_manifest().dataset("vidur-profiling").files}
    assert {ATTENTION_CSV.as_posix(), *(p.as_posix() for p in CPU_OVERHEADS.values())} <= listed
    assert sum(p.startswith(f"{VIDUR_ROOT.as_posix()}/compute/") and p.endswith("/mlp.csv") for p in listed) == 20


def test_the_artifact_key_hashes_the_profiles_bytes_not_their_folder(tmp_path: Path) -> None:
    mlp = VIDUR_ROOT / "compute" / "a100" / "org" / "m" / "mlp.csv"
    for folder in ("a", "b"):
        (tmp_path / folder / mlp).parent.mkdir(parents=True)
        (tmp_path / folder / mlp).write_text("time_stats.emb.min\n1\n")
    key = TrainingInputs(tmp_path / "a").key()
    assert TrainingInputs(tmp_path / "b").key() == key  # found in another folder: the same artifact
    (tmp_path / "b" / mlp).write_text("time_stats.emb.min\n2\n")
    assert TrainingInputs(tmp_path / "b").key() != key


@needs_data("vidur-profiling", "splitwise-perf")
def test_attention_and_splitwise_readers() -> None:
    att = read_vidur_attention(VIDUR / "legacy-a100" / "attention.csv")
    assert len(att) == 14_658
    assert sum(t.op == "attn_decode" for t in att) == 10_240
    assert all(t.kind == "attention" and t.dim_in == 4096 and t.dim_out == 512 for t in att)
    sw = read_splitwise(data_path("splitwise-perf/perf_model.csv"))
    assert len(sw) == 1_260
    assert {t.device_kind for t in sw} == {"A100-80GB", "H100-80GB"}
    assert sum(t.power_capped for t in sw) == 4 * 105


def test_profile_store_round_trip(tmp_path: Path) -> None:
    rows = [OpTiming("cpu", "tiny", "linear", "linear", 4, 192, 576, 0, 1, 1, 0.0123, 0.0125, 1e-4, 0.012, 0.013)]
    path = ProfileStore(tmp_path / "p.csv").save(rows)
    assert path.read_text().splitlines()[0].split(",") == list(COLUMNS)
    assert ProfileStore(path).load() == rows


# -- roofline ----------------------------------------------------------------------------------

def test_roofline_is_monotone_and_device_sensitive() -> None:
    model = RooflineCostModel()
    assert isinstance(model, CostModel)
    a100, h100 = device_of_kind("A100-80GB"), device_of_kind("H100-80GB")
    small = timing_features(OpTiming("x", "m", "l", "linear", 16, 4096, 4096, 0, 1, 1, 0, 0, 0, 0, 0))
    big = timing_features(OpTiming("x", "m", "l", "linear", 4096, 4096, 4096, 0, 1, 1, 0, 0, 0, 0, 0))
    assert model.predict([small], a100).p50_s < model.predict([big], a100).p50_s
    assert model.predict([big], h100).p50_s < model.predict([big], a100).p50_s
    lat = model.predict([small, big], a100)
    assert lat.p50_s <= lat.p90_s <= lat.p99_s
    # compute-bound GEMM: 2*4096^3 FLOPs at 70 % of 312 TFLOP/s plus the launch overhead
    assert model.predict([big], a100).p50_s == pytest.approx(2 * 4096**3 / (312e12 * 0.7) + 5e-6)
    custom = RooflineCostModel(launch_overhead_s=0.0)
    assert custom.predict([], a100).p50_s == 0.0


# -- table -------------------------------------------------------------------------------------

@pytest.mark.slow
@needs_vidur
def test_table_is_exact_on_a_profiled_point_and_interpolates(vidur_rows: list[OpTiming]) -> None:
    rows = [t for t in vidur_rows if t.model == "Llama-2-7b-hf" and t.device_kind == "H100-80GB"
            and t.op == "mlp_up_proj" and t.tp == 1]
    table = ProfileTableCostModel.from_timings(rows)
    dev = device_of_kind("H100-80GB")
    tokens = sorted({t.tokens for t in rows if sum(u.tokens == t.tokens for u in rows) == 1})
    a, b = next((x, y) for x, y in pairwise(tokens) if y - x >= 2)
    point = next(t for t in rows if t.tokens == b)
    assert table.predict([timing_features(point)], dev).p50_s == pytest.approx(point.p50_ms / 1e3, rel=1e-9)
    lo = next(t for t in rows if t.tokens == a)
    mid = timing_features(replace(point, tokens=(a + b) // 2))
    p = table.predict([mid], dev).p50_s * 1e3
    assert min(lo.p50_ms, point.p50_ms) <= p <= max(lo.p50_ms, point.p50_ms)
    lat = table.predict([timing_features(point)], dev)
    assert lat.p50_s <= lat.p90_s <= lat.p99_s
    # an unprofiled shape: the nearest one's fixed overhead kept, the rest scaled by the two shapes'
    # roofline work (FLOPs and bytes, each of its own layout); a kind with no data falls back
    wider = OpFeatures("linear", 0.0, 0.0, tokens=point.tokens, dim_in=point.dim_in, dim_out=2 * point.dim_out)
    roofline, fixed = RooflineCostModel(), min(point.p50_ms / 1e3, RooflineCostModel().launch_overhead_s)
    ratio = roofline.work_seconds(timing_features(replace(point, dim_out=2 * point.dim_out)), dev) \
        / roofline.work_seconds(timing_features(point), dev)
    assert 1.9 < ratio <= 2.0
    assert table.predict([wider], dev).p50_s == pytest.approx(fixed + (point.p50_ms / 1e3 - fixed) * ratio, rel=1e-9)
    soft = OpFeatures("softmax", 1e6, 1e6, tokens=8)
    assert table.predict([soft], dev) == RooflineCostModel().predict([soft], dev)


# -- GNN ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_split(vidur_rows: list[OpTiming]) -> tuple[list[OpTiming], list[OpTiming]]:
    rows = [t for t in vidur_rows if t.device_kind == "H100-80GB" and t.tp in (1, 2)
            and t.model in ("Llama-2-7b-hf", "Llama-2-70b-hf", "internlm-20b")]
    split = vidur_split("model", rows)
    return split.train, split.test


@pytest.fixture(scope="module")
def trained(small_split: tuple[list[OpTiming], list[OpTiming]]) -> GnnCostModel:
    train, _ = small_split
    samples = training_samples(train, seed=0)
    model, report = train_gnn(samples, GnnConfig(epochs=6, hidden=32, batch_graphs=128, seed=0))
    assert report.epochs[-1]["loss"] < report.epochs[0]["loss"]
    return model


@pytest.mark.slow
@needs_vidur
def test_gnn_beats_a_mean_predictor(trained: GnnCostModel,
                                    small_split: tuple[list[OpTiming], list[OpTiming]]) -> None:
    train, test = small_split
    cases = held_out_cases(test, chains=True)
    mean_ms = float(np.mean([sum(t.p50_ms for t in c) for c in layer_chains(train)]))
    obs = np.asarray([c.observed_ms for c in cases])
    trivial = float(np.mean(np.abs(mean_ms - obs) / obs)) * 100
    gnn = score(trained, cases)
    assert gnn["mape_pct"] < trivial / 3
    assert gnn["mape_pct"] < 30


@needs_vidur
def test_gnn_quantiles_are_monotone(trained: GnnCostModel, vidur_rows: list[OpTiming]) -> None:
    assert isinstance(trained, CostModel)
    rng = np.random.default_rng(1)
    chains = layer_chains(vidur_rows)
    for i in rng.choice(len(chains), 50, replace=False):
        chain = chains[int(i)]
        n = int(rng.integers(1, len(chain) + 1))
        lat = trained.predict([timing_features(t) for t in chain[:n]], device_of_kind(chain[0].device_kind))
        assert 0 < lat.p50_s <= lat.p90_s <= lat.p99_s


@needs_vidur
def test_gnn_artifact_round_trip_and_memo(trained: GnnCostModel, tmp_path: Path,
                                          small_split: tuple[list[OpTiming], list[OpTiming]]) -> None:
    target = artifact_dir(tmp_path, ["digest-a", "digest-b"], trained.config, extra="test")
    assert target == artifact_dir(tmp_path, ["digest-b", "digest-a"], trained.config, extra="test")
    assert target != artifact_dir(tmp_path, ["digest-a"], trained.config, extra="test")
    trained.save(target)
    loaded = GnnCostModel.load(target)
    cases = held_out_cases(small_split[1], chains=True)[:40]
    fresh = GnnCostModel.load(target)
    assert fresh.predict_many([(c.ops, c.device) for c in cases]) == \
        GnnCostModel.load(target).predict_many([(c.ops, c.device) for c in cases])
    for c in cases:  # the trained model may hold batched (float32-rounded) answers in its memo
        a, b = loaded.predict(c.ops, c.device), trained.predict(c.ops, c.device)
        assert a.p50_s == pytest.approx(b.p50_s, rel=1e-6) and a.p99_s == pytest.approx(b.p99_s, rel=1e-6)
    hits = loaded.memo_hits
    again = [loaded.predict(c.ops, c.device) for c in cases]
    assert loaded.memo_hits == hits + len(cases)
    assert again == loaded.predict_many([(c.ops, c.device) for c in cases])  # served from the memo


def test_gnn_trains_on_cpu_profile_rows() -> None:
    sweep = Sweep(("tiny",), (1, 16, 128), (64,), (1,), repeats=2, warmup=1, group_s=2e-4)
    rows = profile_cpu(sweep, threads=1, seed=0)
    assert rows and all(r.device_kind == "cpu" and r.p50_ms > 0 for r in rows)
    assert {r.kind for r in rows} >= {"linear", "attention", "norm", "activation", "elementwise"}
    model, _ = train_gnn(training_samples(rows, seed=0), GnnConfig(epochs=3, hidden=16, batch_graphs=16))
    got = score(model, [Case((timing_features(r, 4),), device_of_kind("cpu"), r.p50_ms) for r in rows[:5]])
    assert math.isfinite(got["mape_pct"])


def test_layer_chain_order() -> None:
    ops = [OpTiming("A40", "m", op, "norm", 8, 1, 1, 0, 1, 1, 1.0, 1.0, 0.0, 1.0, 1.0) for op in reversed(LAYER_CHAIN)]
    (chain,) = layer_chains(ops)
    assert tuple(t.op for t in chain) == LAYER_CHAIN

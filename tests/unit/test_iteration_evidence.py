"""The cost-model choice for whole iterations: held-out iterations of real shapes across batch sizes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from learned.evaluate import (
    MAX_DECODE_BATCH,
    MAX_PREFILL_TOKENS,
    VIDUR_ROOT,
    held_out_iterations,
    score_iterations,
)
from learned.profile import OpTiming, layer_chains, read_vidur_mlp
from learned.roofline import RooflineCostModel
from learned.slices import vidur_configs
from service.core.cost import Latency, OpFeatures, physical_floor_s
from service.domain.cluster import Device
from tests.conftest import data_path, needs_data

VIDUR = data_path(VIDUR_ROOT.as_posix())
INTERNLM_A100 = "compute/a100/internlm/internlm-20b/mlp.csv"


@pytest.fixture(scope="module")
def rows() -> list[OpTiming]:
    return read_vidur_mlp(VIDUR / INTERNLM_A100)


class Constant:
    """Prices every operator at ``ms`` milliseconds."""

    name = "constant"

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def predict(self, ops: Sequence[OpFeatures], device: Device) -> Latency:
        return Latency.exact(len(ops) * self.ms / 1e3)


@needs_data("vidur-profiling")
def test_held_out_iterations_are_decodes_and_prefills_at_the_measured_token_counts(rows: list[OpTiming]) -> None:
    configs = vidur_configs(VIDUR / "compute")
    cases = held_out_iterations(rows, configs)
    decodes = [c for c in cases if c.phase == "decode"]
    prefills = [c for c in cases if c.phase == "prefill"]
    measured = {t.tokens for t in rows if t.tp == 1}
    assert {c.tokens for c in decodes} == {t for t in measured if t <= MAX_DECODE_BATCH}
    assert {c.tokens for c in prefills} == {t for t in measured if t <= MAX_PREFILL_TOKENS}
    config = configs["internlm-20b"]
    for c in decodes:  # one query per sequence: the linears' rows are the sequences
        assert all(op.batch == c.tokens and op.tokens == c.tokens for op in c.layer)
    for c in prefills:
        assert all(op.batch == 1 and op.tokens == c.tokens for op in c.layer)
    # the simulator's layer: q, k, v and o apart, gate, up and down; no attention kernel
    one = decodes[0].layer
    assert sum(op.kind == "linear" for op in one) == 7 and not any(op.kind == "attention" for op in one)
    assert {(op.dim_in, op.dim_out) for op in one if op.kind == "linear"} >= {(config.d_model, config.d_ff)}
    # the target: the measured chain with its residual add twice
    chain = next(c for c in layer_chains(rows) if c[0].tp == 1 and c[0].tokens == 8)
    add = next(t.p50_ms for t in chain if t.op == "add")
    point = next(c for c in decodes if c.tokens == 8)  # the first chain measured at 8 tokens
    assert point.observed_ms == pytest.approx(math.fsum(t.p50_ms for t in chain) + add)


@needs_data("vidur-profiling")
def test_iteration_scores_weigh_decode_and_prefill_alike_and_price_through_the_floor(rows: list[OpTiming]) -> None:
    cases = held_out_iterations(rows, vidur_configs(VIDUR / "compute"))
    scores = score_iterations(RooflineCostModel(), cases)
    assert scores["decode"]["n"] == sum(c.phase == "decode" for c in cases) < scores["prefill"]["n"]
    assert scores["mape_pct"] == pytest.approx((scores["decode"]["mape_pct"] + scores["prefill"]["mape_pct"]) / 2)
    # a model that prices everything at nothing is scored at each layer's physical floor
    zero = score_iterations(Constant(0.0), cases)
    decodes = [c for c in cases if c.phase == "decode"]
    at_floor = np.asarray([physical_floor_s(c.layer, c.device) * 1e3 for c in decodes])
    observed = np.asarray([c.observed_ms for c in decodes])
    assert np.all((at_floor > 0) & (at_floor < observed))  # no measurement beats the floor
    assert zero["decode"]["median_error_pct"] == pytest.approx(100 * np.median((at_floor - observed) / observed))

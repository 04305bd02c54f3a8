"""The benchmarks' slice-price errors (benchmarks/_slice_prices.py): relative errors of a price
against a measurement, the same-shape noise floor, and a cost model's prices of live observations
as the what-if puts them."""

from __future__ import annotations

import pytest

from benchmarks._slice_prices import metrics, noise_floor, samples_by_group, score
from learned.observations import ObservedSlice
from learned.roofline import RooflineCostModel


def _row(uid: str, latency_s: float, *, batch: int = 1, phase: str = "prefill") -> ObservedSlice:
    return ObservedSlice(uid, "tiny", "cpu", 0, 2, batch, 16, latency_s, 100.0, phase, 0 if phase == "prefill" else 32)


def test_metrics_are_relative_errors_signed_by_the_price() -> None:
    m = metrics([10.0, 20.0, 40.0], [5.0, 20.0, 60.0])
    assert m["n"] == 3
    assert m["mape_pct"] == pytest.approx(100 * (0.5 + 0.0 + 0.5) / 3)
    assert m["median_ape_pct"] == pytest.approx(50.0) and m["median_error_pct"] == pytest.approx(0.0)
    assert metrics([], []) == {"mape_pct": None, "median_ape_pct": None, "median_error_pct": None, "n": 0}


def test_noise_floor_compares_each_shape_with_its_own_median_and_counts_a_shared_timing_once() -> None:
    rows = [_row("a", 0.010), _row("b", 0.012), _row("c", 0.014),  # one shape, three timings
            _row("d", 0.020, phase="decode"), _row("e", 0.020, phase="decode"),  # one timing, two rows
            _row("f", 0.050, batch=4)]  # a shape timed once: no floor from it
    floor = noise_floor(rows)
    assert floor["n"] == 3  # the decode timing is counted once and has no peer; the batch-4 shape none
    # 10, 12 and 14 ms against their median, 12: errors of 20%, 0 and 14.3% of each measurement
    assert floor["median_ape_pct"] == pytest.approx(100 * 2 / 14)
    assert floor["mape_pct"] == pytest.approx(100 * (2 / 10 + 0 + 2 / 14) / 3)


def test_score_prices_every_observation_the_model_can_price() -> None:
    rows = [_row("a", 0.010), _row("b", 0.020, phase="decode"), _row("x", 0.010)]
    rows[2] = ObservedSlice("x", "no-such-model", "cpu", 0, 2, 1, 16, 0.01, 100.0)  # left out, not a crash
    scored = score(RooflineCostModel(), samples_by_group(rows))
    assert scored["n"] == 2 and set(scored["by_phase"]) == {"prefill", "decode"}
    assert all(p > 0 for p in scored["points"]["predicted_ms"])
    assert scored["points"]["measured_ms"] == pytest.approx([20.0, 10.0])  # grouped by phase, decode first

"""Load scaling that keeps a workload's shape (service.replay.loadscale): at load 1 nothing
changes, thinning keeps a burst where it is, superposing adds copies, the same seed gives the
same workload, and a lower load's workload is a subset of a higher one's."""

from __future__ import annotations

import numpy as np
import pytest

from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec
from service.replay.loadscale import copies_for, keep_fraction, parse_load_scaling, scale_trace
from service.replay.mix import load_mix, sample_workload

HORIZON_S = 600.0


def bursty_trace() -> list[RequestSpec]:
    """A trace's file: one request every 2 s for an hour, and a burst of 400 in its minute 3
    (180-240 s), in arrival order."""
    times = sorted([*np.arange(0.0, 3600.0, 2.0), *np.linspace(180.0, 239.0, 400)])
    return [RequestSpec(f"f:{i}", "f", "tiny", float(t), 100, 20) for i, t in enumerate(times)]


def as_is(requests: list[RequestSpec]) -> list[RequestSpec]:
    """Every request as one tenant's, ids TENANT:INDEX (what dealing does)."""
    return [RequestSpec(f"t:{i}", "t", r.model, r.arrival_s, r.prompt_tokens, r.output_tokens)
            for i, r in enumerate(requests)]


def scaled(load: float, scaling: str = "thin", seed: int = 8) -> list[RequestSpec]:
    return scale_trace(bursty_trace(), offset_s=0.0, rate_scale=1.0, horizon_s=HORIZON_S, load=load,
                       scaling=parse_load_scaling(scaling), rng=np.random.default_rng(seed), arrange=as_is)


def per_minute(requests: list[RequestSpec]) -> np.ndarray:
    return np.bincount([int(r.arrival_s // 60) for r in requests], minlength=10)[:10]


def test_at_load_one_thinning_is_the_plain_workload() -> None:
    assert scaled(1.0, "thin") == scaled(1.0, "compress")
    mix = load_mix("synthetic-3")
    plain = sample_workload(mix, np.random.default_rng(8), duration_s=60, scaling="compress")[0]
    thin = sample_workload(mix, np.random.default_rng(8), duration_s=60, scaling="thin")[0]
    assert thin.requests == plain.requests and plain.num_requests > 50


def test_thinning_keeps_a_burst_where_it_is() -> None:
    base = per_minute(scaled(1.0))
    assert base[3] == 430  # 30 background requests and the burst
    half = per_minute(scaled(0.5))
    assert int(np.argmax(half)) == 3 and 180 <= half[3] <= 250  # binomial(430, 0.5): within 7 sd
    assert all(abs(h - b / 2) <= 5 * np.sqrt(b / 4) + 1 for h, b in zip(half, base, strict=True))
    # compressing instead stretches the file: the burst moves to minutes 6-7 of the window
    stretched = per_minute(scaled(0.5, "compress"))
    assert stretched[3] < 20 and stretched[6] + stretched[7] >= 400


def test_superposing_keeps_the_load_one_workload_and_adds_copies() -> None:
    one, two = scaled(1.0), scaled(2.0)
    assert {(r.arrival_s, r.prompt_tokens) for r in one} <= {(r.arrival_s, r.prompt_tokens) for r in two}
    # the copy is another whole window of the hour-long file: 300 background requests, no burst
    assert len(two) == len(one) + 300
    assert per_minute(two)[3] >= per_minute(one)[3]
    assert len({r.request_id for r in two}) == len(two)
    assert [r.arrival_s for r in two] == sorted(r.arrival_s for r in two)
    compressed = scaled(2.0, "compress")  # the file's first 20 minutes in the window: the burst in minute 1
    assert int(np.argmax(per_minute(compressed))) == 1


@pytest.mark.parametrize("loads", [(0.3, 0.7), (0.7, 1.0), (1.0, 1.6), (1.6, 2.9)])
def test_a_lower_load_is_a_subset_of_a_higher_one(loads: tuple[float, float]) -> None:
    mix = load_mix("synthetic-3")
    low, high = (sample_workload(mix, np.random.default_rng(11), duration_s=60, load_scale=x, scaling="thin")[0]
                 for x in loads)
    assert set(low.requests) <= set(high.requests)
    assert 0.6 < (low.num_requests / high.num_requests) / (loads[0] / loads[1]) < 1.4


def test_scaling_is_deterministic_for_a_seed() -> None:
    mix = load_mix("synthetic-3")
    a, b, c = (sample_workload(mix, np.random.default_rng(s), duration_s=60, load_scale=2.5, scaling="thin")[0]
               for s in (9, 9, 10))
    assert a.requests == b.requests and a.requests != c.requests
    assert scaled(2.5, seed=9) == scaled(2.5, seed=9) != scaled(2.5, seed=10)


def test_copies_and_fractions() -> None:
    assert [copies_for(x) for x in (0.2, 1.0, 1.01, 3.0)] == [1, 1, 2, 3]
    assert [keep_fraction(2.25, k) for k in range(3)] == [1.0, 1.0, 0.25]
    with pytest.raises(InvalidInputError, match="positive"):
        copies_for(0.0)
    with pytest.raises(InvalidInputError, match="thin, compress"):
        parse_load_scaling("stretch")

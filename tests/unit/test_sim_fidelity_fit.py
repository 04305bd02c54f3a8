"""sim_fidelity's overhead fit: non-negative least squares, exact for its few columns."""

from __future__ import annotations

import itertools

import numpy as np

from benchmarks.sim_fidelity import nonnegative_lstsq


def test_an_unconstrained_fit_that_is_non_negative_is_returned_as_is() -> None:
    rng = np.random.default_rng(0)
    x = np.column_stack([np.ones(50), rng.integers(0, 4, 50), rng.integers(0, 8, 50)]).astype(float)
    truth = np.array([0.5, 2.0, 0.25])
    assert np.allclose(nonnegative_lstsq(x, x @ truth), truth)


def test_a_negative_term_is_dropped_and_the_others_refitted() -> None:
    rng = np.random.default_rng(1)
    x = np.column_stack([np.ones(80), rng.integers(0, 4, 80), rng.integers(0, 8, 80)]).astype(float)
    y = x @ np.array([-0.3, 1.0, 0.2]) + rng.normal(0, 0.01, 80)
    coef = nonnegative_lstsq(x, y)
    assert np.all(coef >= 0) and coef[0] == 0.0
    # the others are the best fit without the constant term, not the clipped unconstrained fit
    refit, *_ = np.linalg.lstsq(x[:, 1:], y, rcond=None)
    assert np.allclose(coef[1:], refit)
    clipped = np.clip(np.linalg.lstsq(x, y, rcond=None)[0], 0, None)
    assert np.sum((x @ coef - y) ** 2) <= np.sum((x @ clipped - y) ** 2)


def test_no_non_negative_vector_on_a_grid_fits_better() -> None:
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 3, (40, 3))
    y = rng.normal(0, 1, 40)
    coef = nonnegative_lstsq(x, y)
    best = np.sum((x @ coef - y) ** 2)
    grid = np.linspace(0, 1, 11)
    assert all(np.sum((x @ np.array(c) - y) ** 2) >= best - 1e-9 for c in itertools.product(grid, repeat=3))

"""Upper quantiles that hold on conditions the GNN has not seen: split-conformal shifts of its p90 and p99.

The network's quantile head is fitted (pinball loss) to its own training residuals, which are
smaller than its errors on a new model or a new GPU. On operator chains (the profiles' own
sequences, with a target per operator) the trained p90 still covers 85-95 % of held-out rows;
on traced slices with their real edges (timed only as sums of fused kernels) it covered 82 %
of held-out models' slices and 74 % of held-out GPU's. So slices get a shift of their own:
a calibration set the network did not train on, from conditions as new as those it will meet
(whole models or device kinds held out of a companion network's training), gives the log
offsets that make the p90 and p99 cover 90 % and 99 % of that set (split conformal prediction,
with its finite-sample rank; cross-conformal: every group is held out once, in folds, and the
residuals are pooled). The offsets are then applied to the network trained on
everything (:meth:`learned.gnn.GnnCostModel.with_quantile_shift`, graphs only): that network
errs no more than its companion, so its upper quantiles are, if anything, conservative.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import numpy as np

from learned.gnn import GnnCostModel, GraphSample
from learned.profile import OpTiming

QUANTILE_LEVELS = (0.9, 0.99)


def conformal_shift(model: GnnCostModel, samples: Sequence[GraphSample]) -> tuple[float, float]:
    """Log offsets (>= 0) of p90 and p99 so that ``model`` (unshifted) covers at least
    :data:`QUANTILE_LEVELS` of ``samples``' targets (graphs with their real edges: the offsets
    apply to those only); (0, 0) for no samples."""
    return cross_conformal_shift([(model, samples)])


def cross_conformal_shift(folds: Sequence[tuple[GnnCostModel, Sequence[GraphSample]]]) -> tuple[float, float]:
    """:func:`conformal_shift` over the pooled residuals of each companion model on its own
    held-out samples; (0, 0) for no samples."""
    residuals: list[np.ndarray] = []
    for model, samples in folds:
        if not samples:
            continue
        preds = model.with_quantile_shift((0.0, 0.0)).predict_samples(samples)
        y = np.log(np.asarray([max(s.target_ms, 1e-6) for s in samples]) / 1e3)
        residuals.append(np.stack([y - np.log([p.p90_s for p in preds]), y - np.log([p.p99_s for p in preds])]))
    if not residuals:
        return 0.0, 0.0
    pooled = np.concatenate(residuals, axis=1)
    n = pooled.shape[1]
    # Only ever widened: folds whose held-out groups happen to be easier must not narrow the
    # trained bounds that SLA checks rely on.
    out = [max(0.0, float(np.quantile(r, min(1.0, math.ceil((n + 1) * level) / n), method="higher")))
           for level, r in zip(QUANTILE_LEVELS, pooled, strict=True)]
    return out[0], out[1]


def group_folds(rows: Sequence[OpTiming], by: str, groups: Collection[str], *, folds: int = 2,
                seed: int = 0) -> list[tuple[list[OpTiming], list[OpTiming]]]:
    """(fit, calibration) parts of ``rows`` for cross-conformal calibration: ``groups`` (values
    of the field ``by``, ``"model"`` or ``"device_kind"``, present in ``rows``) dealt in a seeded
    order into up to ``folds`` folds, each held out whole once; no folds with fewer than two groups."""
    present = sorted(set(groups) & {getattr(t, by) for t in rows})
    if len(present) < 2:
        return []
    order = [present[int(i)] for i in np.random.default_rng(seed).permutation(len(present))]
    out = []
    for k in range(min(folds, len(present))):
        held = set(order[k::folds])
        out.append(([t for t in rows if getattr(t, by) not in held], [t for t in rows if getattr(t, by) in held]))
    return out

"""Slice prices against what the executors measured: the shared part of ``online_adaptation`` and
``live_slices`` (errors of a cost model's slice price on live observations, and the noise floor of
the measurements themselves)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from learned.gnn import GraphSample
    from learned.observations import ObservedSlice
    from service.core.cost import CostModel


def samples_by_group(rows: Sequence[ObservedSlice]) -> dict[tuple[str, str], list[GraphSample]]:
    """The observations as training samples (their phase traced), grouped by (phase, family)."""
    from learned.observations import observation_samples
    from service.live.retraining import trace_observed

    groups: dict[tuple[str, str], list[GraphSample]] = {}
    for phase, family in sorted({(r.phase, r.family) for r in rows}):
        groups[(phase, family)] = observation_samples([r for r in rows if (r.phase, r.family) == (phase, family)],
                                                      trace_observed)
    return groups


def metrics(measured_ms: Sequence[float], predicted_ms: Sequence[float]) -> dict[str, Any]:
    """MAPE, median APE and median signed error (%; negative: predicted too fast) and ``n``."""
    if not measured_ms:
        return {"mape_pct": None, "median_ape_pct": None, "median_error_pct": None, "n": 0}
    errors = [(p - m) / m for m, p in zip(measured_ms, predicted_ms, strict=True)]
    return {"mape_pct": 100.0 * statistics.fmean(abs(e) for e in errors),
            "median_ape_pct": 100.0 * statistics.median(abs(e) for e in errors),
            "median_error_pct": 100.0 * statistics.median(errors), "n": len(errors)}


def shape(r: ObservedSlice) -> tuple[str, ...]:
    return (r.family, r.phase, str(r.layer_start), str(r.layer_end), str(r.batch), str(r.tokens), str(r.context))


def noise_floor(rows: Sequence[ObservedSlice]) -> dict[str, Any]:
    """Each measurement against the median of those of exactly its shape (shapes measured twice or
    more). A decode iteration is timed once for all the requests it timed first, so its rows
    repeat one measurement: each is counted once."""
    groups: dict[tuple[str, ...], list[float]] = defaultdict(list)
    for key, latency_s in sorted({(shape(r), r.latency_s) for r in rows}):
        groups[key].append(latency_s * 1e3)
    measured, predicted = [], []
    for values in groups.values():
        if len(values) >= 2:
            mid = statistics.median(values)
            measured.extend(values)
            predicted.extend([mid] * len(values))
    return metrics(measured, predicted)


def score(model: CostModel, groups: dict[tuple[str, str], list[GraphSample]]) -> dict[str, Any]:
    """``model``'s errors on the held-out samples, grouped by (phase, family): overall, per phase,
    per family, and the points for the plot."""
    from service.core.cost import chain_edges, predict_slice

    by: dict[str, dict[str, tuple[list[float], list[float]]]] = {"phase": defaultdict(lambda: ([], [])),
                                                                  "family": defaultdict(lambda: ([], []))}
    measured, predicted = [], []
    for (phase, family), samples in sorted(groups.items()):
        for s in samples:
            edges = s.edges if s.edges is not None else chain_edges(len(s.ops))
            p = predict_slice(model, s.ops, edges, s.device).p50_s * 1e3  # the what-if's slice price
            measured.append(s.target_ms)
            predicted.append(p)
            for key, name in (("phase", phase), ("family", family)):
                by[key][name][0].append(s.target_ms)
                by[key][name][1].append(p)
    out = metrics(measured, predicted)
    out["by_phase"] = {k: metrics(*v) for k, v in sorted(by["phase"].items())}
    out["by_family"] = {k: metrics(*v) for k, v in sorted(by["family"].items())}
    out["points"] = {"measured_ms": measured, "predicted_ms": predicted}
    return out

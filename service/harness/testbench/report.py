"""The testbench's report: measured against predicted, per policy and metric, and its plots.

Pure up to the plots (matplotlib, Agg). For every policy and metric (:data:`METRICS`): the
measured median over the repeats with its range and the repeats' spread (range / median: the
noise a difference between policies must beat); for each prediction (the simulator under a
named calibration) its figure, its ratio to the measured median (above 1: the simulator is
optimistic for throughput, pessimistic for a latency) and whether it falls inside the repeats'
range. Per metric: the policies' rank order measured and per prediction (best first; ties by
name), with Kendall's tau between them. One prediction is the headline: its ratio of median
completion latency per policy is ``prediction_ratio`` (target 0.8-1.25) and its Kendall's tau on
that metric ``kendall_tau`` (target >= 0.8); the other metrics' are beside them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from service.harness.testbench.metrics import METRICS, Outcome, RunMetrics


def rank(values: Mapping[str, float], higher_is_better: bool) -> list[str]:
    """Policies best first (NaN last, ties by name)."""
    def key(p: str) -> tuple[bool, float, str]:
        v = values[p]
        return (math.isnan(v), -v if higher_is_better else v, p)
    return sorted(values, key=key)


def kendall_tau(a: Sequence[str], b: Sequence[str]) -> float:
    """Kendall's tau between two orders of the same items (1: the same order, -1: reversed)."""
    if sorted(a) != sorted(b):
        raise ValueError("kendall_tau: the orders must hold the same items")
    n = len(a)
    if n < 2:
        return 1.0
    pos = {x: i for i, x in enumerate(b)}
    concordant = sum(1 if pos[a[i]] < pos[a[j]] else -1 for i in range(n) for j in range(i + 1, n))
    return concordant / (n * (n - 1) / 2)


#: The headline's metric: "the latency" a prediction must hold per policy.
HEADLINE_METRIC = "e2e_p50_s"
#: The targets for the headline prediction: its ratio per policy within this range, its tau at least this.
RATIO_TARGET, TAU_TARGET = (0.8, 1.25), 0.8
TARGETS: dict[str, Any] = {"prediction_ratio": list(RATIO_TARGET), "kendall_tau": f">= {TAU_TARGET}"}


def assemble(measured: Mapping[str, Sequence[RunMetrics]],
             predictions: Mapping[str, Mapping[str, RunMetrics]], *, headline: str | None = None) -> dict[str, Any]:
    """The comparison (see the module docstring): ``measured`` holds each policy's repeats,
    ``predictions`` each prediction's (by name) figures per policy; ``headline`` names the
    prediction the headline keys judge (None: the last)."""
    policies = list(measured)
    per_policy: dict[str, Any] = {}
    medians: dict[str, dict[str, float]] = {m: {} for m in METRICS}
    for p in policies:
        runs = measured[p]
        entry: dict[str, Any] = {"measured": {}, "repeat_spread": {}, "predicted": {},
                                 "ratio_predicted_over_measured": {}, "within_repeat_range": {}}
        for m in METRICS:
            values = [r.value(m) for r in runs]
            med = statistics.median(values)
            medians[m][p] = med
            entry["measured"][m] = {"median": med, "min": min(values), "max": max(values), "runs": values}
            entry["repeat_spread"][m] = (max(values) - min(values)) / med if med else math.nan
        for name, figures in predictions.items():
            pred = figures[p]
            entry["predicted"][name] = {m: pred.value(m) for m in METRICS}
            entry["ratio_predicted_over_measured"][name] = {
                m: pred.value(m) / medians[m][p] if medians[m][p] else math.nan for m in METRICS}
            entry["within_repeat_range"][name] = {
                m: entry["measured"][m]["min"] <= pred.value(m) <= entry["measured"][m]["max"] for m in METRICS}
        # the diagnostic: how much of a latency is waiting (live: for a lease and a KV slot)
        entry["queued_p50_s"] = {"measured": statistics.median(r.queued_p50_s for r in runs),
                                 **{name: figures[p].queued_p50_s for name, figures in predictions.items()}}
        entry["output_tokens"] = {"measured": [r.output_tokens for r in runs],
                                  **{name: figures[p].output_tokens for name, figures in predictions.items()}}
        entry["requests"] = {"measured": [r.requests for r in runs],
                             **{name: figures[p].requests for name, figures in predictions.items()}}
        per_policy[p] = entry
    ranks: dict[str, Any] = {"measured": {m: rank(medians[m], higher) for m, higher in METRICS.items()}}
    ratio_range: dict[str, Any] = {}
    for name, figures in predictions.items():
        ranks[name] = {}
        ratio_range[name] = {}
        for m, higher in METRICS.items():
            real = ranks["measured"][m]
            sim = rank({p: figures[p].value(m) for p in policies}, higher)
            ranks[name][m] = {"order": sim, "kendall_tau": kendall_tau(real, sim), "same_best": real[0] == sim[0]}
            ratios = {p: per_policy[p]["ratio_predicted_over_measured"][name][m] for p in policies}
            lo, hi = min(ratios, key=lambda p: ratios[p]), max(ratios, key=lambda p: ratios[p])
            ratio_range[name][m] = {"min": ratios[lo], "min_policy": lo, "max": ratios[hi], "max_policy": hi}
    tokens = {n for p in policies for n in per_policy[p]["output_tokens"]["measured"]}
    tokens |= {figures[p].output_tokens for figures in predictions.values() for p in policies}
    reproducibility = {
        "output_tokens_identical": len(tokens) == 1,  # every run, live and simulated, produced the same tokens
        "max_repeat_spread": {m: max(per_policy[p]["repeat_spread"][m] for p in policies) for m in METRICS},
        "policy_spread": {m: _spread(list(medians[m].values())) for m in METRICS},
    }
    head = headline if headline is not None else list(predictions)[-1]
    if head not in predictions:
        raise ValueError(f"assemble: no prediction named {head!r}")
    by_metric = {p: per_policy[p]["ratio_predicted_over_measured"][head] for p in policies}
    low, high = RATIO_TARGET
    report = {"policies": policies, "predictions": list(predictions),
              "headline": {"prediction": head, "metric": HEADLINE_METRIC},
              "prediction_ratio": {p: by_metric[p][HEADLINE_METRIC] for p in policies},
              "prediction_ratio_by_metric": by_metric,
              "prediction_ratio_within_target": all(low <= by_metric[p][HEADLINE_METRIC] <= high for p in policies),
              "kendall_tau": ranks[head][HEADLINE_METRIC]["kendall_tau"],
              "kendall_tau_by_metric": {m: ranks[head][m]["kendall_tau"] for m in METRICS},
              "targets": TARGETS,
              "per_policy": per_policy, "rank": ranks,
              "ratio_range": ratio_range, "reproducibility": reproducibility}
    report["notes"] = notes(report)
    return report


def _spread(values: Sequence[float]) -> float:
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else math.nan


def notes(report: Mapping[str, Any]) -> list[str]:
    """Plain sentences on where and how much the predictions depart from the measurement."""
    out = []
    if "headline" in report:
        head, m = report["headline"]["prediction"], report["headline"]["metric"]
        ratios = report["prediction_ratio"]
        lo, hi = min(ratios.values()), max(ratios.values())
        out.append(f"headline ({head}): {m} predicted / measured {lo:.2f}-{hi:.2f} over the policies "
                   f"(target {RATIO_TARGET[0]}-{RATIO_TARGET[1]}), Kendall tau "
                   f"{report['kendall_tau']:.2f} (target >= {TAU_TARGET})")
    for name in report["predictions"]:
        rr = report["ratio_range"][name]
        for m in METRICS:
            r = rr[m]
            out.append(f"{name}: {m} predicted / measured from {r['min']:.2f} ({r['min_policy']}) to "
                       f"{r['max']:.2f} ({r['max_policy']})")
        for m, r in report["rank"][name].items():
            best = "the same best policy" if r["same_best"] else \
                f"best measured {report['rank']['measured'][m][0]}, best predicted {r['order'][0]}"
            out.append(f"{name}: rank order by {m}: Kendall tau {r['kendall_tau']:.2f} ({best})")
    for p in report["policies"]:
        e = report["per_policy"][p]
        waits = ", ".join(f"{name} {e['queued_p50_s'][name]:.2f}" for name in report["predictions"])
        out.append(f"{p}: median wait before the prefill {e['queued_p50_s']['measured']:.2f}s measured "
                   f"(of a median completion of {e['measured']['e2e_p50_s']['median']:.2f}s), predicted {waits}")
    rep = report["reproducibility"]
    for m in METRICS:
        noise, between = rep["max_repeat_spread"][m], rep["policy_spread"][m]
        verdict = ("policies separate: they differ by more than twice what repeats do" if between > 2 * noise
                   else "policies barely separate: they differ by less than twice what repeats do" if between > noise
                   else "repeats differ as much as policies: this metric does not separate them here")
        out.append(f"measured {m}: repeats spread up to {noise:.0%}, policies' medians {between:.0%} ({verdict})")
    if "weighted" in report["policies"] and "fifo" in report["policies"]:
        w, f = report["per_policy"]["weighted"]["measured"], report["per_policy"]["fifo"]["measured"]
        gaps = ", ".join(f"{m} {w[m]['median'] / f[m]['median']:.2f}x" for m in METRICS if f[m]["median"])
        out.append("weighted orders like fifo here (fair share is across tenants within a queue, and each live "
                   f"queue holds one tenant's requests), so their measured ratio is noise alone: {gaps}")
    return out


# ---- plots -------------------------------------------------------------------------------------------
def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


LABELS = {"tokens_per_s": "throughput (output tok/s)", "ttft_p50_s": "TTFT median (s)", "ttft_p99_s": "TTFT P99 (s)",
          "e2e_p50_s": "completion latency median (s)", "e2e_p99_s": "completion latency P99 (s)"}


MARKERS = ("D", "o", "s", "^")
COLOURS = ("#dd8452", "#55a868", "#c44e52", "#8172b3")


def plot_metrics(path: Path, report: Mapping[str, Any], title: str) -> None:
    """One panel per metric: measured median (bar, repeats' range as whiskers) and each prediction (markers)."""
    plt = _plt()
    policies = report["policies"]
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4.2 * len(METRICS), 4.2))
    xs = list(range(len(policies)))
    for ax, m in zip(axes, METRICS, strict=True):
        meas = [report["per_policy"][p]["measured"][m] for p in policies]
        med = [v["median"] for v in meas]
        err = [[v["median"] - v["min"] for v in meas], [v["max"] - v["median"] for v in meas]]
        ax.bar(xs, med, 0.6, yerr=err, capsize=3, color="#4c72b0", label="measured (median, range)")
        for k, name in enumerate(report["predictions"]):
            ax.plot(xs, [report["per_policy"][p]["predicted"][name][m] for p in policies], MARKERS[k % 4],
                    color=COLOURS[k % 4], label=f"predicted: {name}")
        ax.set_xticks(xs, policies, rotation=45, ha="right")
        ax.set_title(LABELS[m])
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ratios(path: Path, report: Mapping[str, Any]) -> None:
    """Predicted / measured per policy and metric, one panel per prediction (log colour scale:
    white is 1, red the simulator above the measurement)."""
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    plt = _plt()
    policies = report["policies"]
    names = report["predictions"]
    grids = [np.array([[report["per_policy"][p]["ratio_predicted_over_measured"][name][m] for m in METRICS]
                       for p in policies]) for name in names]
    logs = [np.log2(np.where(g > 0, g, np.nan)) for g in grids]
    finite = [np.abs(x[np.isfinite(x)]) for x in logs]
    bound = min(4.0, max([float(f.max()) for f in finite if f.size] + [0.1]))  # beyond 16x: the darkest colour
    fig, axes = plt.subplots(1, len(names), figsize=(7 * len(names), 0.45 * len(policies) + 2.2), squeeze=False)
    for ax, name, grid, lg in zip(axes[0], names, grids, logs, strict=True):
        im = ax.imshow(lg, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -bound, bound), aspect="auto")
        for i in range(len(policies)):
            for j in range(len(METRICS)):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(METRICS)), [LABELS[m] for m in METRICS], rotation=20, ha="right", fontsize=8)
        ax.set_yticks(range(len(policies)), policies)
        ax.set_title(f"predicted ({name}) / measured")
        fig.colorbar(im, ax=ax, label="log2 of the ratio")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_cdfs(path: Path, measured: Mapping[str, Sequence[Sequence[Outcome]]],
              predictions: Mapping[str, Mapping[str, Sequence[Outcome]]]) -> None:
    """Completion-latency CDF per policy: every measured repeat (solid) and each prediction (dashed)."""
    plt = _plt()
    policies = list(measured)
    cols = min(4, len(policies))
    rows = math.ceil(len(policies) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False, sharex=True, sharey=True)
    for k, p in enumerate(policies):
        ax = axes[k // cols][k % cols]
        for i, run in enumerate(measured[p]):
            xs = sorted(o.e2e_s for o in run)
            ax.plot(xs, [(j + 1) / len(xs) for j in range(len(xs))], color="#4c72b0", alpha=0.8,
                    label="measured" if i == 0 else None)
        for c, (name, predicted) in enumerate(predictions.items()):
            xs = sorted(o.e2e_s for o in predicted[p])
            ax.plot(xs, [(j + 1) / len(xs) for j in range(len(xs))], "--", color=COLOURS[c % 4],
                    label=f"predicted: {name}")
        ax.set_title(p, fontsize=9)
    for k in range(len(policies), rows * cols):
        axes[k // cols][k % cols].axis("off")
    axes[0][0].legend(fontsize=7)
    fig.supxlabel("completion latency (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

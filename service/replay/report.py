"""What a replay reports per policy, and its plots.

Metrics are computed from the simulator's :class:`~service.sim.report.SimReport` (the simulation
computes none itself). Token throughput counts output tokens of requests finished within the
trace horizon, per second of horizon, so a policy cannot look better by finishing late; goodput
counts requests that finished within the horizon *and* met their SLA. A request unfinished when
the run is cut off counts as an SLA violation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.core.placement import describe
from service.core.scheduler import VERDICTS, Decision
from service.domain.request import Workload
from service.sim.report import SimReport


@dataclass
class PolicyResult:
    policy: str  # "queue/placement"
    load_scale: float
    horizon_s: float
    num_requests: int
    token_throughput_tps: float  # output tokens finished within the horizon / horizon
    goodput_rps: float  # requests finished within the horizon and within SLA / horizon
    sla_violation_rate: float  # late, dropped or unfinished requests / all requests
    sla_violation_rate_by_tenant: dict[str, float]
    sla_violation_rate_by_class: dict[str, float]  # by the requests' SLA class
    ttft_s: dict[str, float]  # p50, p99
    tbt_s: dict[str, float]  # p50, p99 of each request's mean time between tokens
    e2e_s: dict[str, float]  # p50, p99
    e2e_s_by_tenant: dict[str, dict[str, float]]
    max_wait_s_long: float  # starvation: worst queueing delay of a long request
    device_utilisation: dict[str, float]
    mean_utilisation: float
    idle_s_total: float  # device-seconds without work within the run
    peak_mem_bytes: dict[str, int]
    memory_violations: int
    preemptions: int = 0  # requests preempted for KV memory (paged KV), each recomputed
    recomputed_tokens: int = 0  # prefill tokens computed again because of preemptions
    num_guest_replicas: int = 0  # replicas the slice policy added
    num_whatifs: int = 0
    wall_s: float = 0.0
    horizon_tokens_per_s: float = 0.0  # output tokens produced before the horizon, per second (saturation)
    decisions: list[str] = field(default_factory=list)  # the placement's notes, first 100, with their times
    decision_reasons: list[dict[str, Any]] = field(default_factory=list)  # the same, in fields (DecisionReason.as_dict)
    step_status: dict[str, int] = field(default_factory=dict)  # the steps by status code (placed, no_backlog, ...)
    # Every what-if the placement ran, with its structured reason (WhatIfLog.summary): counts by
    # verdict over the run, and the first WhatIfLog.max_runs of them, each with its step's time.
    whatifs: dict[str, Any] = field(default_factory=dict)
    e2e_samples_s: list[float] = field(default_factory=list, repr=False)  # for CDF plots
    # p99 of each request's mean time between tokens, per tenant, over the requests its home replicas
    # served (the device owner's TPOT, guests beside it or not); empty when no home replicas were named
    tpot_p99_home_s_by_tenant: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("e2e_samples_s")
        return d


@dataclass
class WhatIfLog:
    """The what-ifs of a run's steps, as a report lists them: counts by verdict (every one), and
    the first ``max_runs`` with their step's time, plan, and reason's fields
    (:meth:`WhatIfReason.as_dict`); ``skipped``: plans a step's wall-time cap left unjudged."""

    max_runs: int = 200
    by_verdict: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VERDICTS, 0))
    runs: list[dict[str, Any]] = field(default_factory=list)
    num_runs: int = 0
    skipped: int = 0

    def add(self, t_s: float, decision: Decision) -> None:
        """Log the what-ifs of the step at ``t_s`` (a run without a reason counts as ``unjudged``:
        a policy that keeps no reasons)."""
        self.skipped += decision.whatifs_skipped
        for run in decision.whatifs:
            verdict = run.reason.verdict if run.reason is not None else "unjudged"
            self.by_verdict[verdict] = self.by_verdict.get(verdict, 0) + 1
            self.num_runs += 1
            if len(self.runs) < self.max_runs:
                entry: dict[str, Any] = {"t_s": round(t_s, 3), "model": run.change.model_uid,
                                         "plan": describe(run.change)}
                entry.update(run.reason.as_dict() if run.reason is not None else {"verdict": verdict})
                self.runs.append(entry)

    def summary(self) -> dict[str, Any]:
        return {"num_runs": self.num_runs, "by_verdict": dict(self.by_verdict), "skipped": self.skipped,
                "runs_kept": len(self.runs), "runs": list(self.runs)}


def _pcts(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"p50": math.nan, "p99": math.nan}
    arr = np.asarray(values)
    return {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99))}


def summarise(policy: str, load_scale: float, workload: Workload, report: SimReport, *,
              horizon_s: float, home_replica_ids: Mapping[str, str] | None = None) -> PolicyResult:
    """The run's figures; ``home_replica_ids`` (replica id -> its tenant: the tenants' home
    replicas) adds each tenant's TPOT p99 over the requests its home replicas served."""
    outcomes = {o.request_id: o for o in report.requests}
    homes = dict(home_replica_ids or {})
    tpot_home: dict[str, list[float]] = {}
    tenants = workload.tenants()
    late: dict[str, int] = dict.fromkeys(tenants, 0)
    total: dict[str, int] = dict.fromkeys(tenants, 0)
    classes = sorted({r.sla_class for r in workload.requests})
    late_by_class: dict[str, int] = dict.fromkeys(classes, 0)
    total_by_class: dict[str, int] = dict.fromkeys(classes, 0)
    tokens = 0
    good = 0
    ttft, tbt, e2e = [], [], []
    e2e_by_tenant: dict[str, list[float]] = {t: [] for t in tenants}
    for req in workload.requests:
        total[req.tenant_id] += 1
        total_by_class[req.sla_class] += 1
        o = outcomes.get(req.request_id)
        if o is None or o.dropped or math.isnan(o.finish_s) or not o.sla_met:
            late[req.tenant_id] += 1
            late_by_class[req.sla_class] += 1
        if o is None or o.dropped or math.isnan(o.finish_s):
            continue
        if o.finish_s <= horizon_s:
            tokens += o.num_output_tokens
            good += int(o.sla_met)
        ttft.append(o.ttft_s)
        tbt.append(o.tbt_mean_s)
        e2e.append(o.e2e_s)
        e2e_by_tenant[req.tenant_id].append(o.e2e_s)
        if homes.get(o.replica_id) == req.tenant_id and o.num_output_tokens > 1:
            tpot_home.setdefault(req.tenant_id, []).append(o.tbt_mean_s)
    makespan = max(report.makespan_s, 1e-9)
    util = {d: r.utilisation for d, r in report.devices.items()}
    idle = sum((1.0 - r.utilisation) * makespan for r in report.devices.values())
    n = workload.num_requests
    return PolicyResult(
        policy=policy, load_scale=load_scale, horizon_s=horizon_s, num_requests=n,
        token_throughput_tps=tokens / horizon_s, goodput_rps=good / horizon_s,
        sla_violation_rate=sum(late.values()) / max(1, n),
        sla_violation_rate_by_tenant={t: late[t] / max(1, total[t]) for t in tenants},
        sla_violation_rate_by_class={c: late_by_class[c] / max(1, total_by_class[c]) for c in classes},
        ttft_s=_pcts(ttft), tbt_s=_pcts(tbt), e2e_s=_pcts(e2e),
        e2e_s_by_tenant={t: _pcts(v) for t, v in e2e_by_tenant.items()},
        max_wait_s_long=report.max_wait_s_long, device_utilisation=util,
        mean_utilisation=float(np.mean(list(util.values()))) if util else 0.0, idle_s_total=idle,
        peak_mem_bytes={d: r.peak_mem_bytes for d, r in report.devices.items()},
        memory_violations=len(report.violations), preemptions=report.preemptions,
        recomputed_tokens=report.recomputed_tokens, e2e_samples_s=e2e,
        tpot_p99_home_s_by_tenant={t: _pcts(v)["p99"] for t, v in sorted(tpot_home.items())},
    )


# ---- plots ---------------------------------------------------------------------------------------
def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_timeline(path: Path, spans: Mapping[str, Sequence[tuple[float, float, str]]], *, title: str,
                  window_s: tuple[float, float] | None = None) -> None:
    """Device timeline: one row per device, owners' iterations as full-height bars coloured by
    tenant, operator-level guest slices (replica ids ``tenant/s<n>``) as thin bars of their
    tenant's colour drawn in the owners' gaps; blank is idle. Readable from seconds (slices
    outlined) to many minutes (thin bars stay visible over the owners' work)."""
    plt = _plt()
    devices = sorted(spans, key=_device_order)
    tenants = sorted({owner.split("/")[0] for d in devices for _, _, owner in spans[d]})
    colours = {t: plt.cm.tab10(i % 10) for i, t in enumerate(tenants)}
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(devices) + 1.6))
    lo, hi = window_s if window_s else (min((s for d in devices for s, _, _ in spans[d]), default=0.0),
                                        max((e for d in devices for _, e, _ in spans[d]), default=1.0))
    sliced = False
    for row, d in enumerate(devices):
        whole: dict[str, list[tuple[float, float]]] = {}
        thin: dict[str, list[tuple[float, float]]] = {}
        for s, e, owner in spans[d]:
            if e < lo or s > hi:
                continue
            tenant, _, rest = owner.partition("/")
            (thin if rest.startswith("s") else whole).setdefault(tenant, []).append((s, e - s))
        for tenant, xs in whole.items():
            ax.broken_barh(xs, (row - 0.4, 0.8), facecolors=colours[tenant], alpha=0.55, linewidth=0)
        for tenant, xs in thin.items():
            sliced = True
            outline = len(xs) <= 120  # few enough to see each slice's edges
            ax.broken_barh(xs, (row - 0.14, 0.28), facecolors=colours[tenant], edgecolors="black",
                           linewidth=0.4 if outline else 0)
    ax.set_yticks(range(len(devices)), devices)
    ax.set_ylim(-0.6, len(devices) - 0.4)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("simulated time (s)")
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[t], alpha=0.55) for t in tenants]
    labels = list(tenants)
    if sliced:
        handles.append(plt.Rectangle((0, 0), 1, 0.3, facecolor="grey", edgecolor="black"))
        labels.append("thin: guest slices")
    fig.legend(handles, labels, loc="lower center", fontsize="small", ncol=min(len(labels), 6), frameon=False)
    fig.tight_layout(rect=(0.0, 0.35 / fig.get_figheight(), 1.0, 1.0))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _device_order(device_id: str) -> tuple[str, int]:
    head, _, num = device_id.rpartition("gpu")
    return (head, int(num)) if num.isdigit() else (device_id, 0)


def plot_latency_cdfs(path: Path, results: Sequence[PolicyResult]) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        xs = np.sort(np.asarray(r.e2e_samples_s))
        if len(xs):
            ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=f"{r.policy} (x{r.load_scale:g})")
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency (s)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Latency CDF per policy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_load_sweep(path: Path, results: Sequence[PolicyResult], *, sla_target: float = 0.09) -> None:
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for policy in sorted({r.policy for r in results}):
        rs = sorted((r for r in results if r.policy == policy), key=lambda r: r.load_scale)
        loads = [r.load_scale for r in rs]
        a.plot(loads, [r.token_throughput_tps for r in rs], marker="o", label=policy)
        b.plot(loads, [100 * r.sla_violation_rate for r in rs], marker="o", label=policy)
    b.axhline(100 * sla_target, color="grey", linestyle="--", label=f"{sla_target:.0%} target")
    a.set_xlabel("offered load (x mix)")
    a.set_ylabel("token throughput (tokens/s)")
    b.set_xlabel("offered load (x mix)")
    b.set_ylabel("SLA violations (%)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Throughput and SLA violations against offered load")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

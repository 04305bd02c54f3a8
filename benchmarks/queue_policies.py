"""queue_policies: do aging shortest-first and a deadline-aware order cut the median *and* the P99
latency against FIFO, where requests really queue?

Three regimes (``REGIMES``), each at 0.8x, 1.0x and 1.2x of its own capacity, the same requests
for every policy:

``headline``
    today's regime: the ``a100-4tenants`` mix (ServeGen rate curves; Azure conv/code and
    Mooncake lengths) on 8xA100-nvlink, container replicas sized by offered work, the simulator's
    batching (``SIM_BATCHING``: vLLM's defaults, 256 sequences and a 2,048-token iteration).
``kv-long``
    KV-bound long contexts: two llama2-13b tenants on four A100-80GB, one with Mooncake's
    prompt/output pairs (long documents, clamped to the 4k context), one with a ServeGen
    ``reason/deepseek-r1`` client's own length PMFs and rate curve; at 0.8 MB of KV per token a
    replica holds about 60k tokens, some 15 sequences of 4k, far under the 256-sequence cap: the
    KV binds, not the sequence cap.
``hetero``
    heterogeneous replicas of llama2-7b: per tenant one A100-80GB, one A40 and one A100 MIG
    3g.40gb slice (the datasheets' numbers; see ``hetero_cluster``), least-loaded routing, two
    tenants with Azure code and Azure conv lengths (Poisson arrivals).

Capacity (1.0x) is measured, not assumed: a FIFO run at ``SATURATE`` times the regime's base
rates; each tenant's requests finished in the second half of the horizon (past the ramp-up of
an empty cluster) per second, over its offered rate at 1x; the smallest over tenants is the
regime's capacity scale.

Policies: ``fifo``; ``aging-spf`` (shortest prompt first with aging, its defaults: the policy
issue 40 measured); ``aging-sla`` and ``deadline`` (:mod:`service.core.queue`), their
parameters derived from the predictor's quantiles of predicted work per model (the
output-length estimator fitted on another seed of the regime, as the replay does, priced by the
regime's cost model: :func:`work_models`) and the SLA.

Latency is end-to-end per request (and time to first token, where the queueing shows when long
outputs make the end-to-end tail); a request unfinished at the cut-off (3x the horizon) counts
as lasting to it (a lower bound: a policy cannot improve its P99 by never finishing a request).

Results: ``results.queue_policies[regime]["x<load>"][policy]`` = ``{p50_s, p99_s,
p50_change_vs_fifo, p99_change_vs_fifo, ttft_p50_s, ttft_p99_s, ttft_p99_change_vs_fifo,
sla_violation, unfinished, after_first_token_p99_s}`` (FIFO's row also
``reorder_headroom_p99``: one minus the P99 of the time after the first token over the P99 of
end-to-end latency: about the most any order of the queue could cut, since each request's
end-to-end latency is at least its time after the first token, which an order moves only through
the batches it makes); ``results.plot`` the changes drawn per
regime and load; ``results.at_1_2x[policy]``
the medians over regimes of the two changes at 1.2x; ``results.targets``: issue 40's (aging at
1.2x: median <= -0.42 and P99 <= -0.16 against FIFO).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _record
from learned.choice import add_cost_model_argument

REGIMES = ("headline", "kv-long", "hetero")
LOADS = (0.8, 1.0, 1.2)
POLICIES = ("fifo", "aging-spf", "aging-sla", "deadline")
SATURATE = 4.0  # base rates times this saturate every regime's replicas (the capacity run)
CUTOFF = 3.0  # a run stops at horizon * CUTOFF; unfinished requests count as lasting to it

# SLA classes of the new regimes: the a100-4tenants mix's (its YAML states where they come from)
SLA = {"interactive": {"ttft_s": 0.5, "ttft_per_prompt_token_s": 0.0003, "tbt_s": 0.1, "e2e_s": 60},
       "standard": {"ttft_s": 1.0, "ttft_per_prompt_token_s": 0.001, "tbt_s": 0.2, "e2e_s": 300}}


def hetero_cluster() -> Any:
    """One host: per tenant an A100-80GB, an A40 and an A100 MIG 3g.40gb slice, NVLink-less
    (PCIe 4.0 x16, 32 GB/s each way, 256 Gbit/s). The slice: 3 of the A100's 7 compute slices
    and 4 of its 8 memory slices (NVIDIA's MIG user guide, profile 3g.40gb on A100-80GB):
    40 GiB, 3/7 of the dense FLOP/s and half the HBM bandwidth."""
    from service.domain.cluster import DEVICE_KINDS, GIB, ClusterSpec

    a100 = DEVICE_KINDS["A100-80GB"]
    devices = []
    for t in range(2):
        devices += [{"device_id": f"node0/a100-{t}", "kind": "A100-80GB"},
                    {"device_id": f"node0/a40-{t}", "kind": "A40"},
                    {"device_id": f"node0/mig-{t}", "kind": "A100-80GB", "mem_bytes": 40 * GIB,
                     "peak_flops": a100.peak_flops * 3 / 7, "mem_bw_bytes_per_s": a100.mem_bw_bytes_per_s / 2}]
    return ClusterSpec.from_dict({"name": "hetero-a100-a40-mig", "hosts": [
        {"host_id": "node0", "devices": devices, "intra_link": {"kind": "pcie", "gbps": 256, "latency_us": 5}}]})


def regime(name: str) -> tuple[Any, Any]:
    """(cluster spec, tenant mix) of a regime."""
    from service.cluster.spec import load_cluster_spec
    from service.domain.cluster import ClusterSpec
    from service.replay.mix import load_mix, parse_mix

    if name == "headline":
        return load_cluster_spec("8xA100-nvlink"), load_mix("a100-4tenants")
    if name == "kv-long":
        cluster = ClusterSpec.from_dict({"name": "4xA100-nvlink", "hosts": [
            {"host_id": "node0", "devices": {"kind": "A100-80GB", "count": 4},
             "intra_link": {"kind": "nvlink", "gbps": 2400, "latency_us": 2}}]})
        # Mooncake's arrivals are its own (retimed by the load); the ServeGen client its own curve
        return cluster, parse_mix({"name": "kv-long", "duration_s": 600, "sla_classes": SLA, "tenants": [
            {"tenant_id": "docs", "model": "llama2-13b", "sla_class": "standard",
             "arrivals": {"kind": "poisson", "rate_rps": 0.5}, "lengths": {"kind": "trace", "source": "mooncake"}},
            {"tenant_id": "reason", "model": "llama2-13b", "sla_class": "standard",
             "arrivals": {"kind": "servegen", "source": "reason/deepseek-r1", "client": 30, "start_s": 68400,
                          "rate_scale": 1.0},
             "lengths": {"kind": "servegen"}}]}, "kv-long")
    if name == "hetero":
        return hetero_cluster(), parse_mix({"name": "hetero", "duration_s": 600, "sla_classes": SLA, "tenants": [
            {"tenant_id": "coder", "model": "llama2-7b", "sla_class": "interactive",
             "arrivals": {"kind": "poisson", "rate_rps": 2.0}, "lengths": {"kind": "trace", "source": "azure-code"}},
            {"tenant_id": "chat", "model": "llama2-7b", "sla_class": "standard",
             "arrivals": {"kind": "poisson", "rate_rps": 2.0}, "lengths": {"kind": "trace", "source": "azure-conv"}}]},
            "hetero")
    raise ValueError(f"unknown regime {name!r}")


def replicas(name: str, config: Any, workload: Any) -> list[Any]:
    """Container replicas sized by offered work, or (hetero) one per device, three per tenant."""
    from service.core.batching import SIM_BATCHING
    from service.replay.runner import chunk_tokens, home_replicas
    from service.sim.cluster import ReplicaSpec

    if name != "hetero":
        return home_replicas(config, workload)
    out = []
    for i, t in enumerate(config.mix.tenants):
        for d in config.cluster.devices[3 * i: 3 * i + 3]:
            out.append(ReplicaSpec(f"{t.tenant_id}/{d.device_id.rpartition('/')[2]}", t.model, (d.device_id,),
                                   chunk_tokens(config, t.model, t.sla_class, 1), SIM_BATCHING.max_num_seqs,
                                   tenant_id=t.tenant_id))
    return out


def work_models(config: Any, model: str) -> tuple[Any, Any]:
    """Two pricings of ``model``'s predicted work (:class:`~service.core.queue.WorkModel`) on
    the cluster's first device, from the cost model: seconds per prefilled token (a
    2,048-token chunk) and per output token as *device time* (an iteration of 32 sequences of
    1k context over its 32 sequences: the order of work) and as *latency* (that whole
    iteration: a deadline's latest start)."""
    from service.core.queue import WorkModel
    from service.domain.model_config import MODEL_CONFIGS
    from service.sim.iteration import BatchFeatures, IterationCostTable

    table = IterationCostTable(MODEL_CONFIGS[model], config.cost_model, config.cluster.devices[0])
    prefill = table.exact_s(BatchFeatures.of([(2048, 0)], [])) / 2048
    iteration = table.exact_s(BatchFeatures.of([], [1024] * 32))
    return WorkModel(prefill, iteration / 32), WorkModel(prefill, iteration)


def derived_policies(config: Any, estimator: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The policies, aging-sla and deadline from the estimator's predicted work quantiles per
    model on a history sample (another seed) and the work models; and what they came from."""
    import numpy as np

    from service.core.queue import AgingSlaPolicy, DeadlinePolicy, QueuedRequest, make_queue_policy
    from service.replay.mix import build_workload

    history = build_workload(config.mix, np.random.default_rng(config.seed + 20_011), duration_s=config.horizon_s)
    by_device: dict[str, Any] = {}
    by_latency: dict[str, Any] = {}
    for model in sorted({r.model for r in history.requests}):
        device, latency = work_models(config, model)
        queued = [QueuedRequest(r.request_id, r.tenant_id, r.model, 0.0, r.prompt_tokens, estimator.estimate(r))
                  for r in history.requests if r.model == model]

        def quantiles(work: Any, queued: list[Any] = queued) -> dict[float, float]:
            predicted = np.array([work.work_s(q) for q in queued])
            return {q: float(np.quantile(predicted, q)) for q in (0.5, 0.9, 0.99)}

        by_device[model] = (quantiles(device), device)
        by_latency[model] = (quantiles(latency), latency)
    policies = {"fifo": make_queue_policy("fifo"), "aging-spf": make_queue_policy("aging-spf"),
                "aging-sla": AgingSlaPolicy.derive(by_device), "deadline": DeadlinePolicy.derive(by_latency)}
    return policies, {m: {"work_quantiles_device_s": by_device[m][0], "work_quantiles_latency_s": by_latency[m][0],
                          "prefill_s_per_token": by_device[m][1].prefill_s_per_token,
                          "decode_device_s_per_token": by_device[m][1].decode_s_per_token,
                          "decode_latency_s_per_token": by_latency[m][1].decode_s_per_token} for m in by_device}


def run_one(config: Any, workload: Any, homes: list[Any], policy: Any, estimator: Any) -> dict[str, Any]:
    """One replay to the cut-off: latency percentiles with unfinished requests at the cut-off."""
    import math

    import numpy as np

    from service.sim.cluster import SimulatedCluster

    horizon = config.horizon_s
    cutoff = horizon * CUTOFF
    if estimator is not None:
        estimator.reset_calibration()  # every run starts from the fitted estimator, not the last run's calibration
    cluster = SimulatedCluster(
        config.cluster, homes, config.cost_model, rng=np.random.default_rng(config.seed),
        sla_classes=config.mix.sla_classes, config=config.sim,
        queue_policy=None if policy.name == "fifo" else policy,
        estimator=estimator if policy.needs_estimate else None,
        tenant_priority={t.tenant_id: t.priority for t in config.mix.tenants},
        tenant_weight={t.tenant_id: t.weight for t in config.mix.tenants})
    cluster.submit(workload)
    cluster.run(until=cutoff)
    outcomes = {o.request_id: o for o in cluster.report().requests}
    lat, ttft, after_first, late, unfinished = [], [], [], 0, 0
    done_by_tenant: dict[str, int] = {}
    for r in workload.requests:
        o = outcomes.get(r.request_id)
        if o is None or o.dropped or math.isnan(o.finish_s):
            lat.append(cutoff - r.arrival_s)
            ttft.append(cutoff - r.arrival_s)
            late += 1
            unfinished += 1
            continue
        lat.append(o.e2e_s)
        ttft.append(o.ttft_s)
        after_first.append(o.e2e_s - o.ttft_s)
        late += int(not o.sla_met)
        if horizon / 2 < o.finish_s <= horizon:  # the second half: past the ramp-up of an empty cluster
            done_by_tenant[r.tenant_id] = done_by_tenant.get(r.tenant_id, 0) + 1
    arr = np.array(lat) if lat else np.zeros(1)
    first = np.array(ttft) if ttft else np.zeros(1)
    decode = np.array(after_first) if after_first else np.zeros(1)
    return {"p50_s": float(np.percentile(arr, 50)), "p99_s": float(np.percentile(arr, 99)),
            "ttft_p50_s": float(np.percentile(first, 50)), "ttft_p99_s": float(np.percentile(first, 99)),
            "after_first_token_p99_s": float(np.percentile(decode, 99)),
            "sla_violation": late / max(1, workload.num_requests), "unfinished": unfinished,
            "num_requests": workload.num_requests, "done_by_tenant": done_by_tenant}


def main() -> int:
    p = _record.parser("queue_policies", __doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--duration", type=float, help="seconds of arrivals per run (default 600; quick 120)")
    p.add_argument("--regimes", default=",".join(REGIMES), help="comma-separated regimes")
    add_cost_model_argument(p)
    args = p.parse_args()
    import numpy as np

    from learned.artifact import load_cost_model
    from service.replay.mix import sample_workload
    from service.replay.runner import ReplayConfig, fitted_estimator

    duration = args.duration or (120.0 if args.quick else 600.0)
    regimes = [r for r in args.regimes.split(",") if r]
    unknown = [r for r in regimes if r not in REGIMES]
    if unknown:
        print(f"unknown regime(s) {unknown}; known: {', '.join(REGIMES)}", file=sys.stderr)
        return 2
    cost = load_cost_model(args.cost_model)
    started = time.perf_counter()
    table: dict[str, Any] = {}
    derived: dict[str, Any] = {}
    capacity: dict[str, Any] = {}
    for name in regimes:
        cluster, mix = regime(name)
        config = ReplayConfig(cluster, mix, cost.model, seed=args.seed, duration_s=duration)

        def workload_at(scale: float, mix: Any = mix) -> Any:
            return sample_workload(mix, np.random.default_rng(args.seed), duration_s=duration, load_scale=scale)[0]

        estimator = fitted_estimator(config)
        base = workload_at(1.0)
        # capacity: each tenant's finished requests per second when saturated, over its offered rate at 1x
        sat = workload_at(SATURATE)
        policies, derived[name] = derived_policies(config, estimator)
        fifo_sat = run_one(config, sat, replicas(name, config, sat), policies["fifo"], estimator)
        # offered at 1x per half horizon (finished counts the second half only)
        offered = {t.tenant_id: sum(r.tenant_id == t.tenant_id for r in base.requests) / 2 for t in mix.tenants}
        per_tenant = {t: fifo_sat["done_by_tenant"].get(t, 0) / n for t, n in offered.items() if n}
        scale = min(per_tenant.values())
        capacity[name] = {"scale_of_base_rates": round(scale, 4), "per_tenant": per_tenant}
        print(f"{name}: capacity {scale:.3f}x base rates ({time.perf_counter() - started:.0f} s)", file=sys.stderr,
              flush=True)
        table[name] = {}
        for load in LOADS:
            w = workload_at(scale * load)
            homes = replicas(name, config, w)
            row = {pol: run_one(config, w, homes, policies[pol], estimator) for pol in POLICIES}
            fifo = row["fifo"]
            # the part of FIFO's P99 an order of the queue can reach: e2e >= the time after the
            # first token, request by request, so P99(e2e) >= P99(after the first token)
            fifo["reorder_headroom_p99"] = round(1.0 - fifo["after_first_token_p99_s"] / fifo["p99_s"], 4)
            for r in row.values():
                r.pop("done_by_tenant")
                r["p50_change_vs_fifo"] = round(r["p50_s"] / fifo["p50_s"] - 1.0, 4)
                r["p99_change_vs_fifo"] = round(r["p99_s"] / fifo["p99_s"] - 1.0, 4)
                r["ttft_p99_change_vs_fifo"] = round(r["ttft_p99_s"] / max(1e-9, fifo["ttft_p99_s"]) - 1.0, 4)
            table[name][f"x{load:g}"] = row
            print(f"{name} x{load:g} ({w.num_requests} req): " + ", ".join(
                f"{k} p50 {v['p50_s']:.1f}s ({v['p50_change_vs_fifo']:+.0%}) p99 {v['p99_s']:.1f}s "
                f"({v['p99_change_vs_fifo']:+.0%})" for k, v in row.items()) +
                f" ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    at_12 = {pol: {"p50_change_vs_fifo": statistics.median(table[r]["x1.2"][pol]["p50_change_vs_fifo"]
                                                             for r in regimes),
                   "p99_change_vs_fifo": statistics.median(table[r]["x1.2"][pol]["p99_change_vs_fifo"]
                                                             for r in regimes)} for pol in POLICIES}
    targets = {f"{pol}_{r}": {"p50_le_-0.42": table[r]["x1.2"][pol]["p50_change_vs_fifo"] <= -0.42,
                              "p99_le_-0.16": table[r]["x1.2"][pol]["p99_change_vs_fifo"] <= -0.16}
               for pol in ("aging-spf", "aging-sla", "deadline") for r in regimes}
    plot = _plot(args.out, table, regimes)
    _record.write("queue_policies", args, {
        "regimes": regimes, "loads": list(LOADS), "policies": list(POLICIES), "duration_s": duration,
        "saturate": SATURATE, "cutoff_factor": CUTOFF, "cost_model": cost.kind, "derived": derived,
    }, {"queue_policies": table, "at_1_2x": at_12, "capacity": capacity, "targets": targets,
        "plot": plot, "wall_s": round(time.perf_counter() - started, 1)})
    return 0


def _plot(out: Path, table: dict[str, Any], regimes: list[str]) -> str:
    """Median and P99 change against FIFO per policy and load, one panel per regime; the dotted
    line under the P99 bars is FIFO's reorder headroom (the most any order could cut)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    others = [p for p in POLICIES if p != "fifo"]
    fig, axes = plt.subplots(2, len(regimes), figsize=(5 * len(regimes), 6.5), squeeze=False, sharey="row")
    for col, regime in enumerate(regimes):
        loads = list(table[regime])
        for row, (key, label) in enumerate((("p50_change_vs_fifo", "median"), ("p99_change_vs_fifo", "P99"))):
            ax = axes[row][col]
            width = 0.8 / len(others)
            for i, pol in enumerate(others):
                xs = [j + (i - (len(others) - 1) / 2) * width for j in range(len(loads))]
                ax.bar(xs, [table[regime][ld][pol][key] * 100 for ld in loads], width, label=pol)
            if row == 1:
                for j, ld in enumerate(loads):
                    floor = -table[regime][ld]["fifo"]["reorder_headroom_p99"] * 100
                    ax.hlines(floor, j - 0.45, j + 0.45, colors="grey", linestyles=":",
                              label="about the most an order can cut" if j == 0 else None)
                ax.axhline(-16, color="red", linewidth=0.8, linestyle="--", label="target -16%")
            else:
                ax.axhline(-42, color="red", linewidth=0.8, linestyle="--", label="target -42%")
            ax.axhline(0, color="black", linewidth=0.6)
            ax.set_xticks(range(len(loads)), [f"{ld[1:]}x" for ld in loads])
            ax.set_title(f"{regime}: {label} latency vs FIFO")
            ax.set_xlabel("offered load (x measured capacity)")
            if col == 0:
                ax.set_ylabel(f"{label} change (%)")
            if col == len(regimes) - 1:
                ax.legend(fontsize=7)
    folder = out / "queue_policies"  # plots beside the records live in a folder of their own
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "queue_policies.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.relative_to(out).as_posix()


if __name__ == "__main__":
    sys.exit(main())

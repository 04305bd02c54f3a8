"""Does slicesched's simulator agree with a published peer simulator on the peer's own setup?

The setup is Vidur's (Agrawal et al., MLSys 2024) public vLLM configuration: the Azure LLM
inference 2023 conversation trace (full hour, 19,366 requests), Llama-2-7B on 4 A100-80GB
replicas with tensor parallelism 1, round-robin routing, FCFS queues, vLLM v0's scheduler
(prefill-first, whole prompts, no chunking, up to 128 sequences and 4,096 batched tokens),
paged KV (16-token blocks), prompt plus output clipped to 4,096 tokens. The peer's figures for
it are fixed below (``PEER``); every figure is compared as a relative difference
``(ours - peer) / peer`` (key ``results.per_figure``), the largest absolute one as
``results.max_rel_diff``. Target: every figure within 10%.

``--cost-model`` chooses how iterations are costed: the project's default ``learned`` (per
device kind the model most accurate on held-out profiles, with host overheads; for A100 the GNN),
``gnn``, ``table`` (the profile table alone, as the peer's own simulator prices operators) or
``roofline``; the learned kinds need ``slicesched cost-model train`` once.
``--quick`` replays the first 2,000 requests of the same trace (figures then differ from the
peer's full-hour ones by the load; the relative differences are still reported).
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._record import parser, write
from learned.artifact import load_cost_model
from learned.choice import add_cost_model_argument
from service.core.cost import NO_OVERHEAD
from service.data import resolve
from service.domain.cluster import DEVICE_KINDS, ClusterSpec, Device, Link
from service.domain.request import RequestSpec
from service.replay.context import fit_context
from service.sim.cluster import ReplicaSpec, SimulatedCluster
from service.sim.config import SimConfig
from service.workload.readers import read_azure

NAME = "peer_agreement"
TRACE = "azure-llm-2023/AzureLLMInferenceTrace_conv.csv"  # in the data folders (service.data)
MODEL = "llama2-7b"
REPLICAS = 4
MAX_NUM_SEQS = 128
MAX_BATCHED_TOKENS = 4096
# Vidur's figures for this setup (seconds; throughput in requests and output tokens per second).
PEER: dict[str, float] = {
    "e2e_p50_s": 1.74, "e2e_p90_s": 5.67, "e2e_p99_s": 8.15,
    "ttft_p50_s": 0.083, "ttft_p90_s": 0.238, "ttft_p99_s": 0.36,
    "tbt_p50_s": 0.0111, "tbt_p90_s": 0.0123, "tbt_p99_s": 0.047,
    "tpot_p50_s": 0.0121, "tpot_p99_s": 0.0221,
    "throughput_rps": 5.525, "output_tps": 1166.0,
}
TARGET = 0.10


def a100_cluster(n: int) -> ClusterSpec:
    """``n`` A100-80GB on one host, NVLink between every pair (unused at TP1)."""
    k = DEVICE_KINDS["A100-80GB"]
    devices = [Device(f"node0/gpu{i}", "node0", k.name, k.mem_bytes, k.peak_flops, k.mem_bw_bytes_per_s)
               for i in range(n)]
    links = [Link(a.device_id, b.device_id, "nvlink", 300.0, 2.0) for a in devices for b in devices if a != b]
    return ClusterSpec("4xA100-80GB", ["node0"], devices, links)


def round_robin() -> Any:
    turn = itertools.count()

    def choose(req: RequestSpec, ids: Sequence[str], cluster: object) -> str:
        return ids[next(turn) % len(ids)]

    return choose


def weighted_percentile(samples: list[tuple[float, int]], q: float) -> float:
    values = np.array([s for s, _ in samples])
    weights = np.array([n for _, n in samples], dtype=float)
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, q / 100.0 * cum[-1])])


def main() -> None:
    p = parser(NAME, __doc__.splitlines()[0])
    add_cost_model_argument(p)
    p.add_argument("--no-host-overhead", action="store_true",
                   help="price iterations by the operator model alone, without the learned artifact's host "
                        "overhead per iteration (a diagnostic: how much of a difference the overhead makes)")
    args = p.parse_args()
    read = read_azure(resolve(TRACE), tenant_id="azure-conv", model=MODEL, limit=2000 if args.quick else None)
    fitted, counts = fit_context(read.requests, "clamp")
    spec = a100_cluster(REPLICAS)
    replicas = [ReplicaSpec(f"r{i}", MODEL, (d.device_id,), max_num_seqs=MAX_NUM_SEQS,
                            max_batched_tokens=MAX_BATCHED_TOKENS, prefill_first=True)
                for i, d in enumerate(spec.devices)]
    started = time.perf_counter()
    cost = load_cost_model(args.cost_model)
    print(f"[{NAME}] {len(fitted)} requests ({counts.clamped} clamped to 4,096 tokens), cost model "
          f"{cost.kind} loaded in {time.perf_counter() - started:.1f}s", flush=True)
    overheads = {MODEL: NO_OVERHEAD} if args.no_host_overhead else None  # given ones replace the model's
    cluster = SimulatedCluster(spec, replicas, cost.model, rng=np.random.default_rng(args.seed), router=round_robin(),
                               overheads=overheads,
                               config=SimConfig(kv="paged", kv_block_tokens=16, record_token_gaps=True))
    cluster.submit(sorted(fitted, key=lambda r: r.arrival_s))
    horizon = max(r.arrival_s for r in fitted)
    wall0 = time.perf_counter()
    for tenth in range(1, 11):
        cluster.run(until=horizon * tenth / 10)
        print(f"[{NAME}] {tenth * 10:3d}% simulated {cluster.now_s:7.1f}s / {horizon:.1f}s, "
              f"wall {time.perf_counter() - wall0:5.1f}s", flush=True)
    cluster.run()
    report = cluster.report()
    done = [o for o in report.requests if not o.dropped]
    ours = {
        **{f"e2e_p{q}_s": float(np.percentile([o.e2e_s for o in done], q)) for q in (50, 90, 99)},
        **{f"ttft_p{q}_s": float(np.percentile([o.ttft_s for o in done], q)) for q in (50, 90, 99)},
        **{f"tbt_p{q}_s": weighted_percentile(cluster.token_gaps, q) for q in (50, 90, 99)},
        **{f"tpot_p{q}_s": float(np.percentile([o.tbt_mean_s for o in done if o.num_output_tokens > 1], q))
           for q in (50, 99)},
        "throughput_rps": len(done) / report.makespan_s,
        "output_tps": sum(o.num_output_tokens for o in done) / report.makespan_s,
    }
    per_figure = {k: {"ours": ours[k], "peer": PEER[k], "rel_diff": (ours[k] - PEER[k]) / PEER[k]} for k in PEER}
    worst = max(per_figure, key=lambda k: abs(per_figure[k]["rel_diff"]))
    print(f"{'figure':<16}{'ours':>10}{'peer':>10}{'diff':>9}")
    for k, v in per_figure.items():
        flag = "" if abs(v["rel_diff"]) <= TARGET else "  > 10%"
        print(f"{k:<16}{v['ours']:>10.4f}{v['peer']:>10.4f}{v['rel_diff']:>+9.1%}{flag}")
    results = {
        "per_figure": per_figure,
        "max_rel_diff": abs(per_figure[worst]["rel_diff"]),
        "worst_figure": worst,
        "within_target": sum(abs(v["rel_diff"]) <= TARGET for v in per_figure.values()),
        "num_figures": len(per_figure),
        "num_requests": len(fitted),
        "num_done": len(done),
        "clamped": counts.clamped,
        "preemptions": report.preemptions,
        "memory_violations": len(report.violations),
        "wall_s": time.perf_counter() - wall0,
    }
    config = {"trace": PurePosixPath(TRACE).name, "model": MODEL, "replicas": REPLICAS, "tp": 1, "routing": "round-robin",
              "queue": "fcfs", "batching": "prefill-first (vLLM v0)", "max_num_seqs": MAX_NUM_SEQS,
              "max_batched_tokens": MAX_BATCHED_TOKENS, "kv": "paged/16", "context": "clamp 4096",
              "cost_model": cost.describe(), "host_overhead": not args.no_host_overhead, "target_rel_diff": TARGET, "peer": "Vidur (MLSys 2024)"}
    write(NAME, args, config, results)


if __name__ == "__main__":
    main()

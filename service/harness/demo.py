"""``slicesched demo``: the built-in default end to end, with nothing to configure.

Starts the managed local Neo4j, registers the ``local-cpu-2`` cluster, traces three tenants'
models into the Global Mapping Graph (one of them through the ``torch.compile`` backend while
it really generates tokens on the CPU), and prints what Cypher inspection shows.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from service.harness.console import print_table


def _step(message: str) -> None:
    print(f"\n== {message}", flush=True)


def run_demo(args: argparse.Namespace) -> int:
    import torch

    from service.cluster.spec import load_cluster_spec
    from service.domain.model_config import model_config
    from service.graph.catalog import QueryCatalog
    from service.graph.connection import Neo4jSettings, open_driver
    from service.graph.repository import GraphRepository
    from service.models.family import build_model
    from service.models.trace import GraphRecorder, trace_phase

    started = time.perf_counter()
    settings = Neo4jSettings.from_env()
    _step("Neo4j" + (" (managed local server)" if settings.managed else f" at {settings.uri}"))
    driver = open_driver(settings)
    repo = GraphRepository(driver, QueryCatalog.load(), database=settings.database)
    print(f"connected: {driver.get_server_info().agent} at {driver.get_server_info().address}")
    print(f"schema: {repo.apply_schema()} constraint/index statements applied (idempotent)")

    _step("cluster: local-cpu-2")
    spec = load_cluster_spec("local-cpu-2")
    repo.cluster.apply_cluster(spec)
    print_table(["device", "host", "kind", "mem_bytes", "peak_flops"],
                [[d.device_id, d.host_id, d.kind, d.mem_bytes, d.peak_flops] for d in spec.devices])

    _step("tenants' models traced with torch.fx into the GMG")
    rows = []
    for tenant, model_id, name, device in (("acme", "chat", "tiny", "cpu:0"),
                                           ("initech", "assist", "gpt2-small", "cpu:1")):
        config = model_config(name)
        for phase in ("prefill", "decode"):
            graph = trace_phase(config, phase, batch=4, tokens=64, context=256)
            stats = repo.models.import_model(tenant, model_id, graph, device_id=device)
            rows.append([tenant, model_id, name, phase, stats.operators, stats.edges, graph.total_flops,
                         f"{stats.seconds:.2f}s"])
    print_table(["tenant", "model", "config", "phase", "operators", "edges", "flops", "write"], rows)

    _step("tenant globex: tiny-llama compiled with the GMG recorder backend, generating for real")
    config = model_config("tiny-llama")
    model = build_model(config, seed=7)
    recorder = GraphRecorder(model_name=config.name, phase="prefill", shape={"batch": 1, "tokens": 16},
                             config=config.to_dict())
    compiled = torch.compile(model, backend=recorder, dynamic=False)
    prompt = torch.tensor([list(b"operator-level s")])  # byte-level tokens
    with torch.inference_mode():
        logits, kv = compiled(prompt, torch.arange(prompt.shape[1])[None])
        eager_logits, _ = model(prompt, torch.arange(prompt.shape[1])[None])
        tokens = [int(logits[0, -1].argmax())]
        for step in range(7):  # greedy decode, eager, with the KV cache
            pos = torch.tensor([[prompt.shape[1] + step]])
            out, new_kv = model(torch.tensor([[tokens[-1]]]), pos, kv_cache=kv)
            kv = torch.cat([kv, new_kv], dim=4)
            tokens.append(int(out[0, -1].argmax()))
    same = torch.allclose(logits, eager_logits, atol=1e-5)
    graph = recorder.graphs[-1]
    stats = repo.models.import_model("globex", "bot", graph, device_id="cpu:1")
    print(f"compiled run matches eager: {same}; generated token ids {tokens}")
    print(f"recorded graph: {stats.operators} operators, {graph.total_flops:,} FLOPs -> {stats.model_uid} in Neo4j")

    _step("Cypher inspection (slicesched cypher --named NAME)")
    for name, params in (("tenant_models", {}), ("devices_headroom", {}), ("shared_devices", {}),
                         ("heaviest_operators", {"tenant_id": "initech", "model_id": "assist", "limit": 5})):
        table = repo.inspection.run_named(name, params)
        print_table(table.columns, table.rows, title=name)
    chain = repo.inspection.run_named("dependency_chain", {"tenant_id": "acme", "model_id": "chat", "phase": "prefill",
                                                "op_id": "8"})
    print_table(chain.columns, chain.rows, title="dependency_chain of acme/chat prefill operator #8")
    counts = repo.cluster.count_labels()
    print("GMG nodes: " + ", ".join(f"{k} {v:,}" for k, v in counts.items() if v))
    driver.close()

    if not getattr(args, "skip_live", False):
        from learned.artifact import ensure_cost_model

        _step("cost model: the learned default the live what-ifs and the replay use")
        ensure_cost_model()
        live_and_replay(args, settings)

    if settings.managed and getattr(args, "stop", False):
        from service.graph.local_server import LocalNeo4j

        LocalNeo4j(settings.state_dir).stop()
        print("stopped the managed Neo4j")
    elif settings.managed:
        print("\nThe managed Neo4j keeps running: try  slicesched cypher --list  or "
              "slicesched cypher 'MATCH (d:Device) RETURN d.device_id, d.kind'; stop it with  slicesched neo4j stop")
        from service.live.settings import state_dir

        print("The web console: run  slicesched serve  and  slicesched console --api http://127.0.0.1:8000 , "
              f"open http://127.0.0.1:8080 and sign in with the admin key in {state_dir() / 'admin.key'}")
    print(f"demo finished in {time.perf_counter() - started:.1f}s")
    return 0


def live_and_replay(args: argparse.Namespace, settings: Any) -> None:
    """The live service serving three tenants (container, replica, then slice placement), the
    governance step, then the replay with the three placements (container, replica, operator-level
    slice)."""
    from pathlib import Path

    from service.harness.capacity import calibrate
    from service.harness.governance_demo import TENANT, governance_demo
    from service.harness.live_run import DEMO_TENANTS, compare_placements, demo_workload
    from service.harness.live_tenants import reset_tenants

    out = Path(getattr(args, "out", None) or "demo-output")
    duration = float(getattr(args, "live_duration", 60.0))
    # The comparison is of the three demo tenants alone: the live service serves every model in
    # the graph, and the governance step's tenant, left there by an earlier demo, got a home of
    # its own (a fresh clone's demo then had acme share its executor with globex under both
    # placements). That step runs after the comparison and leaves its tenant for the console.
    reset_tenants(settings.resolved(), [TENANT])
    _step("live: what this machine serves (a capacity probe per tenant's model, container placement)")
    offered, calibration = calibrate(DEMO_TENANTS, duration, neo4j=settings.resolved(), progress=_progress)
    print()
    print_calibration(calibration)
    _step(f"live: slicesched serve + 2 executor daemons (cpu:0,cpu:1 each), three tenants, {duration:.0f}s per placement")
    workload = demo_workload(getattr(args, "seed", 0), duration, offered)
    record = compare_placements(workload, out, neo4j=settings.resolved(), progress=_progress, calibration=calibration,
                                placements=("container", "replica", "slice"))
    print()
    from service.harness.capacity import SPEED_DRIFT, machine_busy, machine_speed, speed_drift

    after = machine_busy()  # other work that started during the comparison shows here
    after["speed"] = round(machine_speed(), 1)
    drift = speed_drift(calibration["machine"].get("speed"), after["speed"])
    runs = record["runs"]
    rows = []
    for placement, run in runs.items():
        for t in run["tenants"]:
            rows.append([placement, t["tenant_id"], t["requests"], t["output_tokens"],
                         f"{t['sla_violations']}/{t['requests']}", f"{t['ttft_p50_s']:.2f}", f"{t['ttft_p99_s']:.2f}",
                         f"{t['e2e_p50_s']:.2f}", f"{t['e2e_p99_s']:.2f}"])
    print_table(["placement", "tenant", "requests", "tokens", "SLA missed", "TTFT p50", "TTFT p99", "e2e p50", "e2e p99"],
                rows, title="per tenant (seconds)")
    print_table(["placement", "tokens/s", "within SLA tokens/s", "SLA violations", "guest replicas", "sliced guests",
                 "GMG write lag p50/p99 (s)"],
                [[p, f"{r['tokens_per_s']:.1f}", f"{r['good_tokens_per_s']:.1f}", f"{100 * r['sla_violation_rate']:.1f}%",
                  r["guest_replicas"], r["sliced_guests"],
                  f"{r['gmg_write_lag_s']['p50'] or 0:.3f} / {r['gmg_write_lag_s']['p99'] or 0:.3f}"]
                 for p, r in runs.items()], title="summary")
    base = runs["container"]["good_tokens_per_s"] or float("nan")
    print("tokens/s within SLA over container: "
          + ", ".join(f"{p} {r['good_tokens_per_s'] / base:.2f}x" for p, r in runs.items() if p != "container"))
    sliced = [n for n in runs["slice"]["decisions"] if n.startswith("sliced: ")]
    print("live slices placed:" if sliced else "live slices placed: none (the what-if judged a whole guest, or "
          "nothing, better on this run)")
    for note in sliced[:6]:
        print(f"  {note[len('sliced: '):]}")
    device_rows = [[p, dev, d["owner"] or "-", f"{100 * d['held_share']:.0f}%", f"{100 * d['guest_share']:.0f}%",
                    ", ".join(d["guests"]) or "-"] for p, r in runs.items() for dev, d in r.get("devices", {}).items()]
    if device_rows:
        print_table(["placement", "device", "owner", "held by a lease", "held by a guest's lease", "guests"],
                    device_rows, title=f"devices over each run, from the GMG's live Slices ({out}/live_timeline.png)")
    for placement, run in runs.items():
        if run.get("cpu_cores"):
            print(f"cores busy under {placement} (of {os.cpu_count()}): "
                  + ", ".join(f"{part} {cores:.2f}" for part, cores in run["cpu_cores"].items()))
    print_busy_verdict(calibration, runs)
    if after["busy"] and not calibration["machine"]["busy"]:
        print(f"  warning: other work kept {100 * (after['busy_share'] or 0):.0f}% of the cores busy right after the "
              "comparison: the capacity probe saw a quieter machine, so both placements were offered too much; "
              "rerun on a quiet machine")
    if drift is not None:
        during = ", ".join(f"{run['machine_speed']:.0f} before {p}'s arrivals"
                           + (f" (arrival rates x{run['load_scale']:.2f})" if run["load_scale"] != 1.0 else "")
                           for p, run in runs.items() if run.get("machine_speed"))
        print(f"machine speed (256x256 matrix products/s): {calibration['machine']['speed']:.0f} at the probe, "
              f"{during + ', ' if during else ''}{after['speed']:.0f} after the comparison ({100 * drift:+.0f}%)")
        if any(run.get("load_scale", 1.0) != 1.0 for run in runs.values()):
            print(f"  the machine ran more than {100 * SPEED_DRIFT:.0f}% off the probe's speed before the first run, so "
                  "both placements were offered the same requests at that speed's pace")
        elif abs(drift) > SPEED_DRIFT:
            print(f"  warning: the machine ran {'faster' if drift > 0 else 'slower'} after the comparison than at "
                  "the probe (a shared host's speed drifts), so the load offered was not the calibrated one: "
                  f"{'lighter' if drift > 0 else 'heavier'} for what the machine then served; rerun for a fair one")
    for placement in ("replica", "slice"):
        for note in runs[placement]["decisions"][:8]:
            print(f"  scheduler ({placement}): {note}")

    _step("governance: a newcomer's onboarding, a platform admin's approval, the first key and request, "
          "the web console; then its first workflow, a code-generation fan-out")
    governance_demo(settings.resolved(), out)

    _step("replay: container, replica and operator-level slice placement on a simulated 8xA100 cluster "
          "(four tenants from Azure and Mooncake lengths)")
    from service.cli.replay import add_parser as add_replay

    replay = argparse.ArgumentParser(prog="slicesched")
    add_replay(replay.add_subparsers())
    args = replay.parse_args(["replay", "--tenants", "a100-4tenants", "--cluster", "8xA100-nvlink", "--duration",
                              "60", "--policy", "fifo/container", "--policy", "fifo/replica", "--policy", "fifo/slice", "--out",
                              str(out / "replay")])
    args.func(args)
    print(f"\nplots and JSON: {out}/live_latency.png, {out}/live_timeline.png, {out}/live.json, {out}/replay/*.png "
          f"(the slice timeline: {out}/replay/timeline-fifo-slice-10s.png, thin bars are operator-level guest slices)")


def print_busy_verdict(calibration: dict[str, Any], runs: dict[str, Any]) -> None:
    """Whether the saturated tenant is within its SLA (at least :data:`SLA_SHARE` of its requests
    met it, the probe's criterion) under each placement, and a note when the load kept more than
    :data:`~service.harness.capacity.CORES_FULL` of the cores busy under container placement."""
    from service.harness.capacity import CORES_FULL, SLA_SHARE

    busy = [t for t, o in calibration["offered"].items() if o["role"] == "saturated"]
    for tenant in busy:
        parts = []
        for placement, run in runs.items():
            row = next((t for t in run["tenants"] if t["tenant_id"] == tenant), None)
            if row is None or not row["requests"]:
                continue
            met = 1.0 - row["sla_violations"] / row["requests"]
            parts.append(f"{placement} {100 * met:.0f}% of its requests met the SLA "
                         f"({'within' if met >= SLA_SHARE else 'not within'} its SLA)")
        print(f"the saturated tenant {tenant} (within its SLA: at least {100 * SLA_SHARE:.0f}% of its requests "
              f"meet it): " + "; ".join(parts))
    cores = os.cpu_count() or 1
    busy_cores = runs.get("container", {}).get("cpu_cores", {}).get("machine")
    fit = calibration.get("machine_fit") or {}
    if busy_cores is not None and busy_cores > CORES_FULL * cores:
        print(f"  note: the load kept {busy_cores:.2f} of {cores} cores busy under container placement, past "
              f"{100 * CORES_FULL:.0f}%: little idle time was left for a guest replica to use, so replica placement "
              "had little to gain here" + (f" (the probe projected {fit['projected_cores']:.2f} before the light loads "
                                            f"were scaled by {fit['light_scale']:.2f})"
                                            if fit.get("projected_cores") is not None else ""))


def print_calibration(calibration: dict[str, Any]) -> None:
    """The measured capacity and the load offered from it; a warning when the machine is busy."""
    rows = []
    for tenant, cap in calibration["capacity"].items():
        offered = calibration["offered"][tenant]
        best = max(cap["levels"], key=lambda lv: lv["tokens_per_s"])
        rows.append([tenant, cap["model"], cap["sla_class"],
                     f"{cap['requests_per_s']:.2f}" + ("" if cap["sla_alone"] else " (SLA missed at every level)")
                     + (" beside the others' loads" if cap.get("background_rps") else ""),
                     f"{best['tokens_per_s']:.0f}", offered["role"],
                     f"{offered['rate_rps']:.2f} ({offered['multiple_of_capacity'] * offered.get('scaled_by', 1.0):.2g}x)"])
    print_table(["tenant", "model", "SLA", "capacity req/s within SLA", "peak tok/s", "role", "offered req/s"],
                rows, title="capacity on this machine (container placement) and the load offered")
    fit = calibration.get("machine_fit") or {}
    if fit.get("projected_cores") is not None:
        line = (f"the probe projects these loads to keep {fit['projected_cores']:.2f} of {fit['cores']} cores busy "
                f"under container placement (budget {fit['budget_cores']:.2f}: idle time is what a guest uses)")
        if fit["light_scale"] < 1.0:
            line += (f"; past it, so the light tenants' loads are scaled by {fit['light_scale']:.2f} "
                     "(the busy tenant keeps its multiple)")
        print(line)
    m = calibration["machine"]
    share = "n/a" if m["busy_share"] is None else f"{100 * m['busy_share']:.0f}%"
    print(f"machine: {m['cores']} cores, load average {m['load_avg_1m']}, cores busy with other work: {share}")
    if m["busy"]:
        print("  warning: other work keeps this machine's cores busy: the placements below compete with it, so the "
              "comparison is not a fair one; rerun on a quiet machine")


def _progress(message: str) -> None:
    print(f"\r  {message:<78}", end="", flush=True)

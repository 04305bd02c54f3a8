"""``slicesched predictors record|train|calibration``: the distributional predictors of workflow
calls (:mod:`learned.distributional`), their training records recorded by agentic replays
(:func:`service.replay.agentic.record_runs`) and read back (:mod:`learned.records`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from learned.distributional import DistributionalPredictor, calibration, fit
from learned.records import read_records, write_records
from service.core.tail import QUANTILES


def predictors_main(argv: Sequence[str]) -> int:
    """``slicesched predictors record|train|calibration`` (see ``--help``)."""
    p = argparse.ArgumentParser(prog="slicesched predictors",
                                description="distributional predictors of workflow calls (learned/distributional.py)")
    sub = p.add_subparsers(dest="action", required=True)
    rec = sub.add_parser("record", help="replay the three workflow shapes (least-loaded and round-robin routing) and write predictor records (JSONL)")
    rec.add_argument("--out", type=Path, required=True, help="the records file to write")
    rec.add_argument("--loads", default="0.5,1.5,3", help="loads (multiples of the base rates), comma-separated")
    rec.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals per load")
    rec.add_argument("--seed", type=int, default=100, help="workload seed (keep it apart from evaluation seeds)")
    rec.add_argument("--cluster", default="8xA100-nvlink")
    rec.add_argument("--cost-model", default=None, help="learned|gnn|table|roofline (default $SLICESCHED_COST_MODEL)")
    tr = sub.add_parser("train", help="train the call and tool quantile models from records")
    tr.add_argument("records", type=Path, nargs="+", help="JSONL records (`predictors record`, or a live export)")
    tr.add_argument("--out", type=Path, required=True, help="folder for the trained predictor")
    tr.add_argument("--epochs", type=int, default=30)
    tr.add_argument("--seed", type=int, default=0)
    ca = sub.add_parser("calibration", help="coverage of each quantile on held-out records")
    ca.add_argument("records", type=Path, nargs="+")
    ca.add_argument("--model", type=Path, required=True, help="a folder written by `predictors train`")
    ca.add_argument("--json", action="store_true")
    args = p.parse_args(list(argv))

    if args.action == "record":
        from learned.artifact import load_cost_model
        from service.replay.agentic import AgenticConfig, record_runs
        from service.workload.workflows import trace_lengths

        config = AgenticConfig.on(args.cluster, load_cost_model(args.cost_model).model, seed=args.seed)
        calls, tools = record_runs(config, trace_lengths(), duration_s=args.duration, seed=args.seed,
                                   loads=[float(x) for x in args.loads.split(",")])
        n = write_records(args.out, calls, tools)
        print(f"{n} records ({len(calls)} calls, {len(tools)} tools) -> {args.out}")
        return 0
    calls, tools = [], []
    for path in args.records:
        c, t = read_records(path)
        calls += c
        tools += t
    if args.action == "train":
        pred = fit(calls, tools, seed=args.seed, epochs=args.epochs)
        pred.save(args.out)
        print(f"trained on {len(calls)} calls and {len(tools)} tools -> {args.out}")
        return 0
    report = calibration(DistributionalPredictor.load(args.model), calls, tools)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"coverage on {report['num_calls']} calls, {report['num_tools']} tools (a calibrated q covers q)")
    print("target            " + "  ".join(f"p{round(100 * q):<4d}" for q in QUANTILES))
    for key in ("output_tokens", "latency_s", "tool_duration_s"):
        if key in report:
            print(f"{key:<17s} " + "  ".join(f"{v:5.3f}" for v in report[key]))
    return 0

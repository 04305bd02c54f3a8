"""The distributional predictor's training records as files: one JSON object per line, a model
call's features with its output length and latency, or a tool call's features with its duration
(recorded by agentic replays, ``slicesched predictors record``, or exported by the live service)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from service.core.tail import CallFeatures, ToolFeatures
from service.domain.error import InvalidInputError
from service.sim.workflow import CallRecord, ToolRecord


def write_records(path: Path, calls: Iterable[CallRecord], tools: Iterable[ToolRecord]) -> int:
    """One JSON object per line: ``{"kind": "call", "features": {...}, "output_tokens", "latency_s"}``
    or ``{"kind": "tool", "features": {...}, "duration_s"}``; returns the lines written."""
    n = 0
    with path.open("w") as f:
        for c in calls:
            f.write(json.dumps({"kind": "call", "features": asdict(c.features), "output_tokens": c.output_tokens,
                                "latency_s": c.latency_s}) + "\n")
            n += 1
        for t in tools:
            f.write(json.dumps({"kind": "tool", "features": asdict(t.features), "duration_s": t.duration_s}) + "\n")
            n += 1
    return n


def read_records(path: Path) -> tuple[list[CallRecord], list[ToolRecord]]:
    """The records :func:`write_records` wrote; ``InvalidInputError`` naming the line otherwise."""
    calls: list[CallRecord] = []
    tools: list[ToolRecord] = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            if doc["kind"] == "call":
                calls.append(CallRecord(CallFeatures(**doc["features"]), int(doc["output_tokens"]),
                                        float(doc["latency_s"])))
            elif doc["kind"] == "tool":
                tools.append(ToolRecord(ToolFeatures(**doc["features"]), float(doc["duration_s"])))
            else:
                raise ValueError(f"unknown kind {doc['kind']!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidInputError(f"{path}:{i}: not a predictor record: {exc}", culprit=f"{path}:{i}") from None
    return calls, tools

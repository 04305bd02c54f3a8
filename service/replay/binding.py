"""Trace files bound to tenants: the ``--trace`` syntax, reading in place, and dealing.

A binding ``FILE:TENANT[@OFFSET][*SCALE]`` gives one tenant exactly that file's requests, in
order, with the file's own time origin (its first request at ``OFFSET`` seconds, default 0) and
its arrival rate multiplied by ``SCALE`` (default 1). ``FILE`` is a path or a named public trace
(``azure-code``, ``azure-conv``, ``mooncake``: read in place from the data folders). A file
without ``:TENANT`` is dealt to every tenant of the mix: ``session`` keeps a session in one
tenant (Mooncake: requests sharing their first 512-token prefix block, i.e. one conversation or
shared document, sessions dealt in order of first arrival), ``round-robin`` deals requests in
turn.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any, Literal

from service.data import resolve
from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec
from service.workload.readers import ReadResult, read_trace

DealMode = Literal["round-robin", "session"]
DEAL_MODES: tuple[DealMode, ...] = ("session", "round-robin")
TRACE_FILES = {
    "azure-code": "azure-llm-2023/AzureLLMInferenceTrace_code.csv",
    "azure-conv": "azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
    "mooncake": "mooncake-synthetic/synthetic_trace.jsonl",
}
_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?"
_TAIL_RE = re.compile(rf"^(?P<tenant>[A-Za-z0-9_.-]+)(?:@(?P<offset>{_NUMBER}))?(?:\*(?P<scale>{_NUMBER}))?$")
SYNTAX = "FILE[:TENANT[@OFFSET_S][*RATE_SCALE]]"


def resolve_source(source: str) -> Path:
    """A named public trace or a path; a relative path is relative to the data folders
    (:func:`service.data.resolve`: ``$SLICESCHED_DATA``, then ``../shared/data``). A missing
    public trace is a :class:`~service.data.DataMissingError` naming the fetch command."""
    path = Path(source)
    return path if path.is_absolute() else resolve(TRACE_FILES.get(source, source))


@dataclass(frozen=True)
class TraceBinding:
    """One ``--trace`` argument. ``source`` is a named trace or an absolute path;
    ``tenant_id`` None means the file is dealt to all tenants."""

    source: str
    tenant_id: str | None = None
    offset_s: float = 0.0
    rate_scale: float = 1.0

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "offset_s": self.offset_s, "rate_scale": self.rate_scale}


def parse_binding(text: str) -> TraceBinding:
    """Parse ``FILE[:TENANT[@OFFSET_S][*RATE_SCALE]]``; a relative FILE is taken from the
    working directory (a named trace from the data folder)."""
    file, sep, tail = text.rpartition(":")
    if not sep or "/" in tail or tail.endswith((".csv", ".jsonl", ".json")):
        file, sep, tail = text, "", ""
    if not file or (sep and not tail):
        raise InvalidInputError(f"--trace {text!r}: expected {SYNTAX}")
    source = file if file in TRACE_FILES else str(Path(file).resolve())
    if file not in TRACE_FILES and not Path(source).is_file():
        raise InvalidInputError(f"--trace {text!r}: no file {file} (expected {SYNTAX}; named traces: "
                                f"{', '.join(TRACE_FILES)})")
    if not tail:
        return TraceBinding(source)
    m = _TAIL_RE.match(tail)
    if m is None:
        raise InvalidInputError(f"--trace {text!r}: {tail!r} is not TENANT[@OFFSET_S][*RATE_SCALE] "
                                f"(e.g. {file}:acme@30*2)")
    offset = float(m["offset"] or 0.0)
    scale = float(m["scale"] or 1.0)
    if not (scale > 0 and math.isfinite(scale) and math.isfinite(offset)):
        raise InvalidInputError(f"--trace {text!r}: the rate scale must be positive and the offset finite")
    return TraceBinding(source, m["tenant"], offset, scale)


@cache
def read_source(source: str, skip_bad: bool = False) -> ReadResult:
    """A trace file's requests (format by extension), read once per process."""
    path = resolve_source(source)
    if not path.is_file():
        raise InvalidInputError(f"trace {source!r} not found at {path}")
    return read_trace(str(path), "auto", skip_bad=skip_bad)


def session_key(request: RequestSpec) -> int:
    """The session a request belongs to: its first prefix block (requests sharing any prefix
    share it, so no conversation is split)."""
    return request.prefix_hashes[0]


def deal(requests: Sequence[RequestSpec], tenants: Sequence[Any], mode: DealMode, *, source: str) -> list[RequestSpec]:
    """One trace's requests dealt to ``tenants`` (each keeps its model and SLA class), in order."""
    if mode not in DEAL_MODES:
        raise InvalidInputError(f"--deal must be one of {', '.join(DEAL_MODES)}, got {mode!r}")
    if mode == "session" and any(not r.prefix_hashes for r in requests):
        raise InvalidInputError(f"{source}: the format has no session key (only Mooncake traces carry prefix "
                                "hash ids): bind it to one tenant (FILE:TENANT) or use --deal round-robin")
    owner: dict[int, int] = {}
    out = []
    for i, r in enumerate(requests):
        k = owner.setdefault(session_key(r), len(owner)) if mode == "session" else i
        t = tenants[k % len(tenants)]
        out.append(RequestSpec(f"{t.tenant_id}:{i}", t.tenant_id, t.model, r.arrival_s, r.prompt_tokens,
                               r.output_tokens, t.sla_class, r.prefix_hashes))
    return out


def retime(requests: Sequence[RequestSpec], *, offset_s: float, rate_scale: float,
           horizon_s: float) -> list[RequestSpec]:
    """A file's requests on the replay's clock: time origin at the first request, moved to
    ``offset_s`` and sped up by ``rate_scale``; those arriving before ``horizon_s``."""
    if not requests:
        return []
    origin = requests[0].arrival_s
    out = []
    for r in requests:
        at = offset_s + (r.arrival_s - origin) / rate_scale
        if at >= horizon_s:
            break
        out.append(replace(r, arrival_s=at))
    return out


def tenant_requests(requests: Sequence[RequestSpec], tenant: Any, *, offset_s: float, rate_scale: float,
                    horizon_s: float) -> list[RequestSpec]:
    """A file's requests as one tenant's (its model and SLA class), retimed as :func:`retime`."""
    return [RequestSpec(f"{tenant.tenant_id}:{i}", tenant.tenant_id, tenant.model, r.arrival_s, r.prompt_tokens,
                        r.output_tokens, tenant.sla_class, r.prefix_hashes)
            for i, r in enumerate(retime(requests, offset_s=offset_s, rate_scale=rate_scale, horizon_s=horizon_s))]

"""Requests that fit their model's context window: clamp them or reject them.

Serving engines with a ``max_model_len`` never prefill past it. ``clamp`` does what a client of
such an engine does: the prompt is cut from the front (the most recent tokens are kept) so that
it leaves room for the output, up to a quarter of the context, and the output is capped so that
prompt plus output fits. ``reject`` drops a request that does not fit. Requests that fit pass
unchanged; every request returned satisfies ``prompt_tokens + output_tokens <= max_seq_len``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec

ContextMode = Literal["clamp", "reject"]
CONTEXT_MODES: tuple[ContextMode, ...] = ("clamp", "reject")


@dataclass
class ContextCounts:
    """How many requests were clamped or rejected, in all and per tenant."""

    mode: ContextMode
    num_requests: int = 0  # requests checked
    clamped: int = 0
    rejected: int = 0
    per_tenant: dict[str, dict[str, int]] = field(default_factory=dict)  # tenant -> requests, clamped, rejected

    def summary(self) -> dict[str, Any]:
        return {"mode": self.mode, "requests": self.num_requests, "clamped": self.clamped,
                "rejected": self.rejected, "per_tenant": self.per_tenant}


def clamp_to_context(prompt_tokens: int, output_tokens: int, max_seq_len: int) -> tuple[int, int]:
    """(prompt, output) cut to fit ``max_seq_len``; unchanged if they already fit."""
    if prompt_tokens + output_tokens <= max_seq_len:
        return prompt_tokens, output_tokens
    prompt = min(prompt_tokens, max_seq_len - min(output_tokens, max_seq_len // 4))
    return prompt, min(output_tokens, max_seq_len - prompt)


def fit_context(requests: Iterable[RequestSpec], mode: ContextMode) -> tuple[list[RequestSpec], ContextCounts]:
    """The requests fitted to their models' context (order kept), and the counts."""
    from service.domain.model_config import MODEL_CONFIGS  # torch: not at CLI start-up

    if mode not in CONTEXT_MODES:
        raise InvalidInputError(f"context mode must be one of {', '.join(CONTEXT_MODES)}, got {mode!r}")
    counts = ContextCounts(mode)
    out: list[RequestSpec] = []
    for r in requests:
        tenant = counts.per_tenant.setdefault(r.tenant_id, {"requests": 0, "clamped": 0, "rejected": 0})
        tenant["requests"] += 1
        counts.num_requests += 1
        max_seq_len = MODEL_CONFIGS[r.model].max_seq_len
        if r.prompt_tokens + r.output_tokens <= max_seq_len:
            out.append(r)
        elif mode == "reject":
            tenant["rejected"] += 1
            counts.rejected += 1
        else:
            prompt, output = clamp_to_context(r.prompt_tokens, r.output_tokens, max_seq_len)
            # a prompt cut from the front loses its leading blocks, and with them the shared prefix
            hashes = r.prefix_hashes if prompt == r.prompt_tokens else ()
            out.append(replace(r, prompt_tokens=prompt, output_tokens=output, prefix_hashes=hashes))
            tenant["clamped"] += 1
            counts.clamped += 1
    return out, counts

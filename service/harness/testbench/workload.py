"""The testbench's workload: one seeded list of requests that every policy and every repeat gets.

Pure: every draw comes from one ``numpy.random.Generator`` seeded by the caller, in a fixed order
(arrivals and lengths as :func:`service.workload.synthetic.synthetic_workload` draws them, then
per request its priority, its SLO tier and its prompt's token ids), so the same seed and shape
give the same bytes, which :meth:`BenchWorkload.digest` shows.

What a request carries is what the queue policies order by: its arrival, its prompt length
(``aging-spf``), its output length (``max_tokens``: the built-in models have no stop ids, so every
request produces exactly that many tokens; ``sjf`` and ``slack`` read the token budget, the
oracle the true length), its own priority (``priority``, ``aging``: the ``x-priority`` header) and
its own SLO targets (``slack``'s deadline: the ``x-slo-ttft-ms`` and ``x-slo-tpot-ms`` headers). One
tenant: the live queues are per model, so ``weighted`` (fair share across tenants in one queue)
orders like ``fifo`` here, and the report says so.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace

import numpy as np

from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec, Workload
from service.sim.sla import SLA_CLASSES, SlaClass
from service.workload.synthetic import TenantLoad, synthetic_workload

TENANT = "bench"  # the testbench's tenant (its graph objects are deleted before a run)


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """How the testbench's requests are drawn. Lengths are lognormal (median, sigma of the log,
    clamped to the max), arrivals a gamma renewal process with the given CV (bursty above 1)."""

    model: str = "tiny"  # a built-in family the executors run
    rate_rps: float = 4.0  # mean arrival rate
    duration_s: float = 12.0  # arrivals in [0, duration_s)
    burstiness_cv: float = 2.0
    prompt_median_tokens: float = 24.0
    prompt_sigma: float = 0.7
    prompt_max_tokens: int = 160
    output_median_tokens: float = 24.0
    output_sigma: float = 0.8
    output_max_tokens: int = 160
    sla_class: str = "standard"  # the tenant's class: the targets of a request without its own
    high_priority_share: float = 0.25  # requests sent with x-priority 1 (the others 0)
    tight_share: float = 0.3  # requests sent with their own, tighter targets
    tight_ttft_s: float = 1.0
    tight_tpot_s: float = 0.1

    def __post_init__(self) -> None:
        if self.sla_class not in SLA_CLASSES:
            raise InvalidInputError(f"testbench: unknown SLA class {self.sla_class!r}", culprit=self.sla_class)
        for name in ("high_priority_share", "tight_share"):
            if not (0.0 <= getattr(self, name) <= 1.0):
                raise InvalidInputError(f"testbench: {name} must be in [0, 1], got {getattr(self, name)}")
        if not (self.tight_ttft_s > 0 and self.tight_tpot_s > 0):
            raise InvalidInputError("testbench: tight_ttft_s and tight_tpot_s must be > 0")
        if not (0.0 < self.rate_rps < math.inf and 0.0 < self.duration_s < math.inf):
            raise InvalidInputError(f"testbench: rate_rps and duration_s must be finite and > 0, got "
                                    f"{self.rate_rps} and {self.duration_s}")

    def mean_output_tokens(self) -> float:
        """The expected output length (the lognormal's mean; the clamp is ignored)."""
        return self.output_median_tokens * math.exp(self.output_sigma ** 2 / 2)


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request as the live client sends it and as the simulator replays it."""

    spec: RequestSpec  # arrival, lengths, priority; ``sla_class`` names its targets (own or the tenant's)
    prompt: tuple[int, ...]  # the prompt's token ids (len == spec.prompt_tokens)
    slo_ttft_s: float | None = None  # its own TTFT target (x-slo-ttft-ms); None: the tenant's class
    slo_tpot_s: float | None = None  # its own TPOT target (x-slo-tpot-ms)

    @property
    def priority(self) -> int:
        return self.spec.priority or 0

    def headers(self) -> dict[str, str]:
        """The request's own priority and targets as the API takes them."""
        out = {"x-priority": str(self.priority)}
        if self.slo_ttft_s is not None:
            out["x-slo-ttft-ms"] = f"{1e3 * self.slo_ttft_s:g}"
        if self.slo_tpot_s is not None:
            out["x-slo-tpot-ms"] = f"{1e3 * self.slo_tpot_s:g}"
        return out


@dataclass(frozen=True)
class BenchWorkload:
    shape: WorkloadShape
    seed: int
    requests: tuple[BenchRequest, ...]  # by arrival

    @property
    def tenant_id(self) -> str:
        return TENANT

    def workload(self) -> Workload:
        """The requests as the simulator takes them."""
        return Workload(f"testbench-{self.seed}", [r.spec for r in self.requests], self.shape.duration_s)

    def offered_at(self, output_tokens_per_s: float) -> BenchWorkload:
        """The same requests with arrivals stretched or squeezed so that they offer this many output
        tokens per second over the arrival window (the drawn rate is only the expected one)."""
        factor = self.output_tokens / self.shape.duration_s / output_tokens_per_s  # > 1 stretches
        if not (0.0 < factor < math.inf):
            raise InvalidInputError(f"testbench: cannot offer {output_tokens_per_s} output tokens per second")
        shape = replace(self.shape, rate_rps=self.shape.rate_rps / factor, duration_s=self.shape.duration_s * factor)
        requests = tuple(replace(r, spec=replace(r.spec, arrival_s=r.spec.arrival_s * factor)) for r in self.requests)
        return BenchWorkload(shape, self.seed, requests)

    def sla_classes(self) -> dict[str, SlaClass]:
        """Every class the requests name (the tenant's, and its variants with a request's own
        targets, named as the live service names them: :meth:`SlaClass.with_targets`)."""
        out = dict(SLA_CLASSES)
        base = SLA_CLASSES[self.shape.sla_class]
        for r in self.requests:
            sla = base.with_targets(r.slo_ttft_s, r.slo_tpot_s)
            out[sla.name] = sla
        return out

    @property
    def output_tokens(self) -> int:
        return sum(r.spec.output_tokens for r in self.requests)

    def digest(self) -> str:
        """sha256 of everything a run is given (arrivals, prompts, lengths, priorities, targets)."""
        rows = [[r.spec.arrival_s, list(r.prompt), r.spec.output_tokens, r.priority, r.slo_ttft_s, r.slo_tpot_s,
                 r.spec.sla_class] for r in self.requests]
        return hashlib.sha256(json.dumps([self.shape.model, rows]).encode()).hexdigest()

    def summary(self) -> dict[str, object]:
        n = len(self.requests)
        return {"seed": self.seed, "requests": n, "output_tokens": self.output_tokens,
                "prompt_tokens": sum(r.spec.prompt_tokens for r in self.requests),
                "offered_output_tokens_per_s": self.output_tokens / self.shape.duration_s,
                "high_priority": sum(r.priority > 0 for r in self.requests),
                "own_targets": sum(r.slo_ttft_s is not None for r in self.requests), "digest": self.digest()}


def bench_workload(shape: WorkloadShape, seed: int, *, vocab_size: int = 256) -> BenchWorkload:
    """The testbench's requests for ``shape`` and ``seed`` (prompt ids in ``[1, vocab_size)``)."""
    rng = np.random.default_rng(seed)
    load = TenantLoad(TENANT, shape.model, shape.rate_rps, shape.sla_class, "gamma", shape.burstiness_cv,
                      shape.prompt_median_tokens, shape.prompt_sigma, shape.prompt_max_tokens,
                      shape.output_median_tokens, shape.output_sigma, shape.output_max_tokens)
    drawn = synthetic_workload(rng, tenants=[load], duration_s=shape.duration_s)
    base = SLA_CLASSES[shape.sla_class]
    out = []
    for i, r in enumerate(drawn.requests):
        priority = int(rng.random() < shape.high_priority_share)
        tight = bool(rng.random() < shape.tight_share)
        prompt = tuple(int(x) for x in rng.integers(1, vocab_size, size=r.prompt_tokens))
        ttft, tpot = (shape.tight_ttft_s, shape.tight_tpot_s) if tight else (None, None)
        spec = RequestSpec(f"{TENANT}:{i}", TENANT, shape.model, r.arrival_s, r.prompt_tokens, r.output_tokens,
                           base.with_targets(ttft, tpot).name, priority=priority)
        out.append(BenchRequest(spec, prompt, ttft, tpot))
    return BenchWorkload(shape, seed, tuple(out))

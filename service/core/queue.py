"""Request-level queue policies: which waiting request a replica admits next.

Pure: no I/O, no wall clock, no randomness.

One interface, :class:`QueuePolicy`: a policy gives every queued request a **static key**
(smaller goes first; it must not change while the request waits), and may ask for
**fair-share** selection across tenants: pick the backlogged tenant with the fewest served
tokens per unit of weight, then the smallest key inside that tenant. Static keys let
:class:`RequestQueue` keep a heap (O(log n) per push and pop, queues of thousands); fair share
adds a scan over the backlogged tenants (few). Ties between equal keys go to the request pushed
first, so the order is deterministic and ``fifo`` is exactly arrival order.

Aging without changing keys: a policy whose score grows linearly with waiting time,
``score(now) = base + (now - arrival_s) / scale``, orders requests at any instant like the static
``arrival_s - base * scale`` (the ``now`` term is common to all), so aging is a static key too.

Policies (the names are interfaces):

========================  ===============================================================
``fifo``                  arrival order
``priority``              tenant priority (higher first), then arrival
``weighted``              token-weighted fair share across tenants, arrival order within one
``sjf``                   shortest estimated remaining work first (``prompt_weight`` x prompt
                          tokens + estimated remaining output tokens), a waited second worth
                          ``aging_tokens_per_s`` tokens, the advantage capped at
                          ``max_delay_s``: a request is served before anything arriving later
                          than ``arrival_s + min(work / aging_tokens_per_s, max_delay_s)``
``aging``                 priority plus one level per ``aging_s`` seconds waited
``aging-spf``             shortest prompt first, the same aging and cap on prompt tokens:
                          a request is served before anything arriving later than
                          ``arrival_s + min(prompt_tokens / aging_tokens_per_s, max_delay_s)``
``oracle-remaining``      true remaining output tokens (a reference, not deployable)
``slack``                 least slack first: the latest start time of the request's workflow
                          (``deadline - predicted p99 remaining work``, as its ``latest_start``
                          callable answers when the request is queued: :mod:`service.sim.workflow`),
                          else the request's own deadline (``deadline_s``, from its SLA) minus
                          its predicted remaining work (``token_s`` seconds per estimated
                          remaining output token); arrival order without either
``aging-sla``             shortest predicted work first with aging, a request deferred at most
                          by its SLA slack (capped), most at the predictor's p90 work and not
                          at all from its p99 work on (the tail keeps arrival order):
                          :class:`AgingSlaPolicy`
``deadline``              latest start first: the request's deadline minus its predicted
                          remaining work (prefill and decode, at a predictor quantile):
                          :class:`DeadlinePolicy`
========================  ===============================================================
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from service.domain.error import InvalidInputError

__all__ = [
    "QUEUE_POLICIES", "AgingPolicy", "AgingSlaPolicy", "AgingSpfPolicy", "DeadlinePolicy", "FifoPolicy", "FifoQueue", "OracleRemainingPolicy",
    "PriorityPolicy", "QueuePolicy", "QueuedRequest", "RequestQueue", "SjfPolicy", "SlackPolicy", "WaitingQueue",
    "WeightedPolicy", "WorkModel",
    "make_queue_policy", "make_waiting_queue", "select_index",
]

Key = tuple[float, ...]


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """What a queue policy may know about a waiting request."""

    request_id: str
    tenant_id: str
    model: str
    arrival_s: float
    prompt_tokens: int
    estimated_output_tokens: int  # the token budget given at arrival (0: no estimate)
    generated_tokens: int = 0  # output already produced (a preempted request; 0 when never run)
    priority: int = 0  # the tenant's priority; higher goes first
    weight: float = 1.0  # the tenant's fair-share weight (> 0)
    true_output_tokens: int | None = None  # only for oracle policies; None otherwise
    # when it should be finished, on the arrival clock: arrival_s + its SLA's finish-by target for its
    # estimated length (SlaClass.deadline_s); inf: no deadline
    deadline_s: float = math.inf


class QueuePolicy(Protocol):
    """The order of a queue. See the module docstring for the contract of ``key``."""

    @property
    def name(self) -> str: ...

    @property
    def fair_share(self) -> bool:
        """True: select the tenant with the least served tokens / weight first."""
        ...

    @property
    def needs_estimate(self) -> bool:
        """True: ``key`` reads ``estimated_output_tokens`` (an estimator must supply it)."""
        ...

    @property
    def needs_truth(self) -> bool:
        """True: ``key`` reads ``true_output_tokens`` (an oracle; not deployable)."""
        ...

    def key(self, req: QueuedRequest) -> Key:
        """Static order key, smaller first; must not depend on time or on other requests."""
        ...


@dataclass(frozen=True, slots=True)
class FifoPolicy:
    name: ClassVar[str] = "fifo"
    fair_share: ClassVar[bool] = False
    needs_estimate: ClassVar[bool] = False
    needs_truth: ClassVar[bool] = False

    def key(self, req: QueuedRequest) -> Key:
        return (req.arrival_s,)


@dataclass(frozen=True, slots=True)
class PriorityPolicy:
    name: ClassVar[str] = "priority"
    fair_share: ClassVar[bool] = False
    needs_estimate: ClassVar[bool] = False
    needs_truth: ClassVar[bool] = False

    def key(self, req: QueuedRequest) -> Key:
        return (-req.priority, req.arrival_s)


@dataclass(frozen=True, slots=True)
class WeightedPolicy:
    """Token-weighted fair share: served tokens are counted by the caller (the simulator counts
    prompt tokens at admission and each output token as it is produced). A tenant that was idle
    keeps its count: it is not credited for the time it had nothing queued."""

    name: ClassVar[str] = "weighted"
    fair_share: ClassVar[bool] = True
    needs_estimate: ClassVar[bool] = False
    needs_truth: ClassVar[bool] = False

    def key(self, req: QueuedRequest) -> Key:
        return (req.arrival_s,)


def _check_aging(name: str, aging_tokens_per_s: float, max_delay_s: float) -> None:
    if not (0.0 < aging_tokens_per_s < float("inf")):
        raise InvalidInputError(f"{name}: aging_tokens_per_s must be finite and > 0, got {aging_tokens_per_s}")
    if not (0.0 <= max_delay_s < float("inf")):
        raise InvalidInputError(f"{name}: max_delay_s must be finite and >= 0, got {max_delay_s}")


@dataclass(frozen=True, slots=True)
class SjfPolicy:
    """Shortest estimated remaining output first (the issue's definition), starvation-safe. A
    request's size is ``prompt_weight * prompt_tokens + remaining``, ``remaining`` its estimated
    output not yet produced (``prompt_weight`` is 0 by default: output only); effective size
    ``size - aging_tokens_per_s * waited_s``, smallest first, where a request's size counts for
    at most ``max_delay_s`` seconds of waiting. As a static key:
    ``arrival_s + min(size / aging_tokens_per_s, max_delay_s)``.

    ``prompt_weight=1`` orders by estimated remaining *work* (prompt and output tokens are the
    same currency in an iteration's token budget and in the KV reservation). On the headline mix
    the queue forms on a prefill-bound tenant (~2,000-token prompts, tens of output tokens), so
    the output estimate alone reorders almost nothing (median and P99 within a few percent of
    ``fifo``), while counting the prompt cuts the median by 35-41% at 1.2x load (seeds 0 and 1,
    with ``aging_tokens_per_s=150``), like ``aging-spf``.

    Guarantee: a request is served before every request that arrives more than
    ``min(size / aging_tokens_per_s, max_delay_s)`` seconds after it, so nothing is passed by
    later arrivals for more than ``max_delay_s`` seconds, whatever its estimate (estimates can
    be wildly wrong). Within the bound the order is shortest first. Defaults: a waited second is
    worth 20 output tokens, and the bound is 30 s (half the interactive end-to-end target).
    Unbounded SJF (the textbook policy) is the limit of a large ``max_delay_s`` and a small
    ``aging_tokens_per_s``; it starves long requests under sustained overload.
    """

    aging_tokens_per_s: float = 20.0  # tokens of size one second of waiting makes up for
    max_delay_s: float = 30.0  # the most a request can be passed by later arrivals for
    prompt_weight: float = 0.0  # a prompt token's worth in output tokens (0: output only)
    name: ClassVar[str] = "sjf"
    fair_share: ClassVar[bool] = False
    needs_estimate: ClassVar[bool] = True
    needs_truth: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_aging("sjf", self.aging_tokens_per_s, self.max_delay_s)
        if not (0.0 <= self.prompt_weight < float("inf")):
            raise InvalidInputError(f"sjf: prompt_weight must be finite and >= 0, got {self.prompt_weight}")

    def key(self, req: QueuedRequest) -> Key:
        work = self.prompt_weight * req.prompt_tokens + max(0, req.estimated_output_tokens - req.generated_tokens)
        return (req.arrival_s + min(work / self.aging_tokens_per_s, self.max_delay_s), req.arrival_s)


@dataclass(frozen=True, slots=True)
class AgingPolicy:
    """Effective priority ``priority + waited_s / aging_s``, highest first, then arrival."""

    aging_s: float = 10.0  # seconds of waiting worth one priority level
    name: ClassVar[str] = "aging"
    fair_share: ClassVar[bool] = False
    needs_estimate: ClassVar[bool] = False
    needs_truth: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not (0.0 < self.aging_s < float("inf")):
            raise InvalidInputError(f"aging: aging_s must be finite and > 0, got {self.aging_s}")

    def key(self, req: QueuedRequest) -> Key:
        return (req.arrival_s - req.priority * self.aging_s, req.arrival_s)


@dataclass(frozen=True, slots=True)
class AgingSpfPolicy:
    """Shortest prompt first with aging: effective size ``prompt_tokens - aging_tokens_per_s *
    waited_s``, smallest first, a prompt counting for at most ``max_delay_s`` seconds of waiting
    (static key ``arrival_s + min(prompt_tokens / aging_tokens_per_s, max_delay_s)``): a request
    is served before every request arriving more than that much later. Defaults tuned on the
    headline mix (``benchmarks/replay_headline.py``; 1000 tokens/s gave about a third of the
    median gain): 150 prompt tokens per waited second (a 2,000-token prompt yields to arrivals of
    the next ~13 s), at most 30 s."""

    aging_tokens_per_s: float = 150.0  # prompt tokens one second of waiting makes up for
    max_delay_s: float = 30.0  # the most a request can be passed by later arrivals for
    name: ClassVar[str] = "aging-spf"
    fair_share: ClassVar[bool] = False
    needs_estimate: ClassVar[bool] = False
    needs_truth: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_aging("aging-spf", self.aging_tokens_per_s, self.max_delay_s)

    def key(self, req: QueuedRequest) -> Key:
        return (req.arrival_s + min(req.prompt_tokens / self.aging_tokens_per_s, self.max_delay_s), req.arrival_s)


@dataclass(frozen=True, slots=True)
class OracleRemainingPolicy:
    name: ClassVar[str] = "oracle-remaining"
    fair_share: ClassVar[bool] = False
    needs_estimate: ClassVar[bool] = False
    needs_truth: ClassVar[bool] = True

    def key(self, req: QueuedRequest) -> Key:
        if req.true_output_tokens is None:
            raise InvalidInputError(f"oracle-remaining: request {req.request_id} has no true_output_tokens",
                                    culprit=req.request_id)
        return (float(req.true_output_tokens - req.generated_tokens), req.arrival_s)


@dataclass(frozen=True, slots=True)
class SlackPolicy:
    """Least slack first (least laxity). The key is an absolute latest start time, so ordering
    by it at any instant is ordering by slack (the key minus ``now``, common to all requests):

    - a workflow's step: ``latest_start(req)``, the workflow's deadline minus the predicted p99
      of the work left on its critical path from this step on, answered once, when the request
      is queued;
    - otherwise (no ``latest_start``, or it answers ``None``: a request of no workflow) the
      request's own ``deadline_s`` (from its SLA) minus ``token_s`` seconds per estimated
      output token it has yet to produce (the token budget);
    - a request with neither (no deadline: ``inf``) goes after every one with a deadline, in
      arrival order.

    Not starvation-safe by itself: a request with a far deadline waits while tighter ones keep
    arriving, until its slack is the smallest.
    """

    token_s: float = 0.02  # predicted seconds of work per remaining output token
    latest_start: Callable[[QueuedRequest], float | None] | None = None
    name: ClassVar[str] = "slack"
    fair_share: ClassVar[bool] = False
    needs_truth: ClassVar[bool] = False

    @property
    def needs_estimate(self) -> bool:
        """A token budget for the remaining work, unless a workflow's latest start decides."""
        return self.latest_start is None

    def __post_init__(self) -> None:
        if not (0.0 <= self.token_s < math.inf):
            raise InvalidInputError(f"slack: token_s must be finite and >= 0, got {self.token_s}")

    def key(self, req: QueuedRequest) -> Key:
        at = None if self.latest_start is None else self.latest_start(req)
        if at is not None:
            return (at, req.arrival_s)
        remaining = max(0, req.estimated_output_tokens - req.generated_tokens)
        return (req.deadline_s - self.token_s * remaining, req.arrival_s)


_PREFILL_S_PER_TOKEN = 1e-4
_DECODE_S_PER_TOKEN = 0.025 / 32
_DECODE_ITERATION_S = 0.025


@dataclass(frozen=True, slots=True)
class WorkModel:
    """Predicted seconds of a queued request: ``prefill_s_per_token`` per prompt token plus
    ``decode_s_per_token`` per estimated output token not yet produced. What an output token
    costs depends on the question: as *device time* (the order of work: an iteration of a
    typical batch over its sequences, :class:`AgingSlaPolicy`) or as *latency* (one iteration
    per token: a deadline's latest start, :class:`DeadlinePolicy`). Defaults: llama2-7b on one
    A100-80GB, the device-time pricing (about 0.1 ms per prefilled token; 25 ms per iteration of
    a 32-sequence batch, 0.8 ms per sequence); a benchmark derives its own from its cost model."""

    prefill_s_per_token: float = _PREFILL_S_PER_TOKEN
    decode_s_per_token: float = _DECODE_S_PER_TOKEN

    def __post_init__(self) -> None:
        for name in ("prefill_s_per_token", "decode_s_per_token"):
            v = getattr(self, name)
            if not (0.0 <= v < math.inf):
                raise InvalidInputError(f"work model: {name} must be finite and >= 0, got {v}")

    def work_s(self, req: QueuedRequest) -> float:
        remaining = max(0, req.estimated_output_tokens - req.generated_tokens)
        return self.prefill_s_per_token * req.prompt_tokens + self.decode_s_per_token * remaining


def _work_model(prefill_s_per_token: float, decode_s_per_token: float) -> WorkModel:
    return WorkModel(prefill_s_per_token, decode_s_per_token)


@dataclass(frozen=True, slots=True)
class AgingSlaPolicy:
    """Shortest predicted work first with aging, its rate set by the predictor's work
    quantiles and the SLA, and the predicted tail never deferred.

    A request's predicted work ``w`` is :class:`WorkModel` seconds (its prompt and its estimated
    remaining output, priced as device time). Later arrivals may pass it for

        ``delay = min(slack, max_delay_s) * shape(w)``

    - ``slack``: its SLA's finish-by target for its length less its work (``deadline_s -
      arrival_s - w``; no deadline: no limit from it), so aging never pushes a request past
      its own deadline by itself;
    - ``shape(w)`` rises linearly from 0 to 1 at the predictor's p90 work (``work_p90_s``):
      shortest first, a request of p90 work deferred by its whole allowance, smaller ones
      proportionally less (the aging rate is ``work_p90_s / min(slack, max_delay_s)`` seconds
      of work per waited second);
    - and falls back to 0 at the p99 work (``work_p99_s``): the longest requests, which make
      the latency tail, keep their arrival order, so the median falls without the P99 growing
      from deferring them.

    Static key ``(arrival_s + delay, arrival_s)``, smallest first.

    Bounded starvation (stated; ``tests/unit/test_queue_tail.py`` holds it as a property): a
    request is served before every request arriving more than ``delay <= max_delay_s`` after
    it. So on a work-conserving server taking one request at a time, a request waits at most
    ``delay + V(arrival_s + delay)``, where ``V(t)`` is the work unfinished at ``t`` (what FIFO
    would make a request arriving at ``t`` wait): at most ``max_delay_s`` more than FIFO gives a
    request arriving ``delay`` later. Plain shortest-first has no such bound.

    Each model has its own work distribution and pricing (a queue holds one model's requests):
    ``by_model`` maps a model to ``(prefill_s_per_token, decode_s_per_token, work_p90_s,
    work_p99_s)``; a model not in it takes the fields'.

    :meth:`derive` builds it from the predictor's work quantiles and a cap.
    """

    work_p90_s: float = 0.5  # the predictor's p90 of predicted work: the most deferred
    work_p99_s: float = 2.0  # its p99: never deferred (nor anything longer)
    max_delay_s: float = 30.0  # the most a request can be passed by later arrivals for
    prefill_s_per_token: float = _PREFILL_S_PER_TOKEN
    decode_s_per_token: float = _DECODE_S_PER_TOKEN
    by_model: Mapping[str, tuple[float, float, float, float]] = field(default_factory=dict)
    name: ClassVar[str] = "aging-sla"
    fair_share: ClassVar[bool] = False
    needs_estimate: ClassVar[bool] = True
    needs_truth: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not (0.0 <= self.max_delay_s < math.inf):
            raise InvalidInputError(f"aging-sla: max_delay_s must be finite and >= 0, got {self.max_delay_s}")
        for model, (prefill, decode, p90, p99) in [("", self._defaults()), *self.by_model.items()]:
            where = f" of {model!r}" if model else ""
            if not (0.0 < p90 < math.inf):
                raise InvalidInputError(f"aging-sla: work_p90_s{where} must be finite and > 0, got {p90}")
            if not (p90 <= p99 < math.inf):
                raise InvalidInputError(f"aging-sla: work_p99_s{where} must be finite and >= work_p90_s, got {p99}")
            _work_model(prefill, decode)

    def _defaults(self) -> tuple[float, float, float, float]:
        return self.prefill_s_per_token, self.decode_s_per_token, self.work_p90_s, self.work_p99_s

    @staticmethod
    def derive(work_quantiles_s: Mapping[str, tuple[Mapping[float, float], WorkModel]], *,
               max_delay_s: float = 30.0) -> AgingSlaPolicy:
        """From the predictor's quantiles of predicted work per model (seconds by level; 0.9 and
        0.99 needed), each with the work model that priced it."""
        by_model = {}
        for model, (q, work) in work_quantiles_s.items():
            if 0.9 not in q or 0.99 not in q:
                raise InvalidInputError(f"aging-sla: work quantiles of {model!r} need 0.9 and 0.99, got {sorted(q)}")
            p90 = max(1e-9, float(q[0.9]))
            by_model[model] = (work.prefill_s_per_token, work.decode_s_per_token, p90, max(p90, float(q[0.99])))
        return AgingSlaPolicy(max_delay_s=max_delay_s, by_model=by_model)

    def delay_s(self, req: QueuedRequest) -> float:
        """How long later arrivals may pass the request for (``<= max_delay_s``)."""
        prefill, decode, p90, p99 = self.by_model.get(req.model) or self._defaults()
        w = _work_model(prefill, decode).work_s(req)
        allowance = max(0.0, min(req.deadline_s - req.arrival_s - w, self.max_delay_s))  # inf deadline: the cap
        if w <= p90:
            shape = w / p90
        elif w >= p99:
            shape = 0.0
        else:
            shape = (p99 - w) / (p99 - p90)
        return allowance * shape

    def key(self, req: QueuedRequest) -> Key:
        return (req.arrival_s + self.delay_s(req), req.arrival_s)


@dataclass(frozen=True, slots=True)
class DeadlinePolicy:
    """Latest start first: ``deadline_s - margin * w``, ``w`` the request's predicted remaining
    work (:class:`WorkModel` seconds: its prompt's prefill and its estimated output not yet
    produced), ``margin`` the predictor's ratio of a high quantile to the median of work
    (so the start is late enough for the work's quantile, not its median). Ties by arrival;
    a request without a deadline goes after every one with a deadline, in arrival order.

    Against :class:`SlackPolicy` (decode only, a point estimate) it counts the prefill, which is
    most of the work of long-prompt traffic. Not starvation-safe by itself beyond the SLA: the
    key is at most the deadline, so a request is passed only by requests whose deadlines come
    before its own.
    """

    margin: float = 1.0  # predicted work quantile over its median (>= 1 is cautious)
    prefill_s_per_token: float = _PREFILL_S_PER_TOKEN
    decode_s_per_token: float = _DECODE_ITERATION_S
    # model -> (margin, prefill_s_per_token, decode_s_per_token); a model not in it: the fields'
    by_model: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)
    name: ClassVar[str] = "deadline"
    fair_share: ClassVar[bool] = False
    needs_estimate: ClassVar[bool] = True
    needs_truth: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for model, (margin, prefill, decode) in [("", (self.margin, self.prefill_s_per_token,
                                                        self.decode_s_per_token)), *self.by_model.items()]:
            if not (0.0 <= margin < math.inf):
                raise InvalidInputError(f"deadline: margin{f' of {model!r}' if model else ''} must be finite and >= 0, "
                                        f"got {margin}")
            _work_model(prefill, decode)

    @staticmethod
    def derive(work_quantiles_s: Mapping[str, tuple[Mapping[float, float], WorkModel]], *,
               level: float = 0.9) -> DeadlinePolicy:
        """Per model: ``margin`` = the work quantile at ``level`` over its median (both levels
        needed); its work model prices an output token as latency (one iteration each)."""
        by_model = {}
        for model, (q, work) in work_quantiles_s.items():
            if level not in q or 0.5 not in q:
                raise InvalidInputError(f"deadline: work quantiles of {model!r} need 0.5 and {level}, got {sorted(q)}")
            median = float(q[0.5])
            margin = max(1.0, float(q[level]) / median if median > 0 else 1.0)
            by_model[model] = (margin, work.prefill_s_per_token, work.decode_s_per_token)
        return DeadlinePolicy(by_model=by_model)

    def key(self, req: QueuedRequest) -> Key:
        margin, prefill, decode = self.by_model.get(req.model) or (self.margin, self.prefill_s_per_token,
                                                                    self.decode_s_per_token)
        w = _work_model(prefill, decode).work_s(req)
        return (req.deadline_s - margin * w, req.arrival_s)


QUEUE_POLICIES: dict[str, Callable[..., QueuePolicy]] = {
    p.name: p for p in (FifoPolicy, PriorityPolicy, WeightedPolicy, SjfPolicy, AgingPolicy, AgingSpfPolicy,
                        OracleRemainingPolicy, SlackPolicy, AgingSlaPolicy, DeadlinePolicy)
}


def make_queue_policy(name: str, **params: Any) -> QueuePolicy:
    """The policy registered as ``name`` built with ``params``; ``InvalidInputError`` on an unknown
    name (listing the known ones) or parameters the policy does not take."""
    factory = QUEUE_POLICIES.get(name)
    if factory is None:
        raise InvalidInputError(f"unknown queue policy {name!r}; known: {', '.join(sorted(QUEUE_POLICIES))}",
                                culprit=name)
    try:
        return factory(**params)
    except TypeError as exc:
        raise InvalidInputError(f"queue policy {name!r}: bad parameters {sorted(params)}: {exc}", culprit=name) from None


def _share(tenant_id: str, weight: float, served: Mapping[str, float]) -> float:
    return served.get(tenant_id, 0.0) / weight


def select_index(policy: QueuePolicy, waiting: Sequence[QueuedRequest], served: Mapping[str, float]) -> int:
    """Index in ``waiting`` (listed in push order) of the request ``policy`` admits next: the
    reference semantics, by linear scan. ``InvalidInputError`` if ``waiting`` is empty."""
    if not waiting:
        raise InvalidInputError("select_index: empty queue")
    if policy.fair_share:
        def rank(i: int) -> tuple[float, Key, int]:
            q = waiting[i]
            return _share(q.tenant_id, q.weight, served), policy.key(q), i
    else:
        def rank(i: int) -> tuple[float, Key, int]:
            return 0.0, policy.key(waiting[i]), i
    # Within a tenant the key decides; across tenants the share decides, then the best key.
    return min(range(len(waiting)), key=rank)


T = TypeVar("T")


class RequestQueue(Generic[T]):
    """A waiting queue ordered by ``policy``, holding caller items (e.g. simulator state) next to
    their :class:`QueuedRequest`. Same order as :func:`select_index`, in O(log n) per operation
    (plus a scan over backlogged tenants for fair-share policies).

    ``served`` (tokens per tenant) is read at :meth:`peek` / :meth:`pop`; the caller keeps it.
    """

    __slots__ = ("_groups", "_policy", "_seq", "_size", "_weights")

    def __init__(self, policy: QueuePolicy) -> None:
        self._policy = policy
        self._seq = itertools.count()
        # one heap for everything, or one per tenant under fair share
        self._groups: dict[str, list[tuple[Key, int, QueuedRequest, T]]] = {}
        self._weights: dict[str, float] = {}
        self._size = 0

    @property
    def policy(self) -> QueuePolicy:
        return self._policy

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[T]:
        """The items, in no particular order."""
        for heap in self._groups.values():
            for entry in heap:
                yield entry[3]

    def requests(self) -> Iterator[QueuedRequest]:
        for heap in self._groups.values():
            for entry in heap:
                yield entry[2]

    def push(self, req: QueuedRequest, item: T) -> None:
        group = req.tenant_id if self._policy.fair_share else ""
        if not (req.weight > 0.0):
            raise InvalidInputError(f"request {req.request_id}: weight must be > 0, got {req.weight}",
                                    culprit=req.request_id)
        heap = self._groups.get(group)
        if heap is None:
            heap = self._groups[group] = []
        self._weights[group] = req.weight
        heapq.heappush(heap, (self._policy.key(req), next(self._seq), req, item))
        self._size += 1

    def _heap(self, served: Mapping[str, float]) -> list[tuple[Key, int, QueuedRequest, T]]:
        if not self._size:
            raise InvalidInputError("RequestQueue: empty queue")
        if not self._policy.fair_share:
            return self._groups[""]
        best: list[tuple[Key, int, QueuedRequest, T]] | None = None
        best_rank: tuple[float, Key, int] | None = None
        for tenant, heap in self._groups.items():
            if not heap:
                continue
            head = heap[0]
            rank = (_share(tenant, self._weights[tenant], served), head[0], head[1])
            if best_rank is None or rank < best_rank:
                best, best_rank = heap, rank
        assert best is not None
        return best

    def peek(self, served: Mapping[str, float]) -> T:
        """The item admitted next (``InvalidInputError`` when empty)."""
        return self._heap(served)[0][3]

    def peek_request(self, served: Mapping[str, float]) -> QueuedRequest:
        return self._heap(served)[0][2]

    def pop(self, served: Mapping[str, float]) -> T:
        """Remove and return the item :meth:`peek` gives for the same ``served``."""
        item = heapq.heappop(self._heap(served))[3]
        self._size -= 1
        return item

    def take(self, n: int, served: Mapping[str, float]) -> list[T]:
        """Remove up to ``n`` items for another queue, in the order :meth:`pop` gives them."""
        out: list[T] = []
        while self._size and len(out) < n:
            out.append(self.pop(served))
        return out

    def copy(self, convert: Callable[[T], T]) -> RequestQueue[T]:
        """A queue in the same state, with every item passed through ``convert``."""
        other: RequestQueue[T] = RequestQueue(self._policy)
        other._groups = {g: [(k, s, q, convert(x)) for k, s, q, x in heap] for g, heap in self._groups.items()}
        other._weights = dict(self._weights)
        other._size = self._size
        # continue the counter past every sequence number in use so ties keep their order
        start = 1 + max((s for heap in self._groups.values() for _, s, _, _ in heap), default=-1)
        seen = next(self._seq)  # advances this queue's counter too; harmless, numbers stay increasing
        other._seq = itertools.count(max(start, seen))
        return other


class WaitingQueue(Protocol[T]):
    """A replica's waiting queue: :class:`RequestQueue` (any policy, a heap) or
    :class:`FifoQueue` (arrival order, a deque: the fast path). ``served`` is read by fair-share
    policies only."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[T]: ...

    def push(self, req: QueuedRequest, item: T) -> None: ...

    def peek(self, served: Mapping[str, float]) -> T: ...

    def pop(self, served: Mapping[str, float]) -> T: ...

    def take(self, n: int, served: Mapping[str, float]) -> list[T]:
        """Remove up to ``n`` items to hand to another queue (see each implementation's order)."""
        ...

    def copy(self, convert: Callable[[T], T]) -> WaitingQueue[T]: ...


class FifoQueue(Generic[T]):
    """First in, first out in push order (arrival order when requests are pushed as they arrive),
    without keys or a heap: the ``fifo`` policy's queue. :meth:`take` removes from the back
    (newest first), leaving the head of the queue where it is."""

    __slots__ = ("_items",)

    policy: ClassVar[QueuePolicy] = FifoPolicy()

    def __init__(self) -> None:
        self._items: deque[T] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        """The items, oldest first."""
        return iter(self._items)

    def push(self, req: QueuedRequest, item: T) -> None:
        self._items.append(item)

    def peek(self, served: Mapping[str, float]) -> T:
        """The oldest item (``InvalidInputError`` when empty)."""
        try:
            return self._items[0]
        except IndexError:
            raise InvalidInputError("FifoQueue: empty queue") from None

    def pop(self, served: Mapping[str, float]) -> T:
        try:
            return self._items.popleft()
        except IndexError:
            raise InvalidInputError("FifoQueue: empty queue") from None

    def take(self, n: int, served: Mapping[str, float]) -> list[T]:
        """Remove up to ``n`` of the newest items, newest first."""
        out: list[T] = []
        items = self._items
        while items and len(out) < n:
            out.append(items.pop())
        return out

    def copy(self, convert: Callable[[T], T]) -> FifoQueue[T]:
        other: FifoQueue[T] = FifoQueue()
        other._items = deque(convert(x) for x in self._items)
        return other


def make_waiting_queue(policy: QueuePolicy | None) -> WaitingQueue[T]:
    """The queue for ``policy``: a :class:`FifoQueue` for ``None`` or ``fifo`` (same order as a
    ``RequestQueue`` of the ``fifo`` policy when pushed in arrival order, without the heap),
    otherwise a :class:`RequestQueue`."""
    if policy is None or isinstance(policy, FifoPolicy):
        return FifoQueue()
    return RequestQueue(policy)

"""The live service's records: tenants, models, devices, executors, replicas, requests and leases.

Plain mutable dataclasses owned by the event loop of the API process (no locks): the
:class:`~service.live.registry.Registry` and the :class:`~service.live.lease_book.LeaseBook` hold
and change them; :class:`Write` is the row a change hands the GMG writer.
"""

from __future__ import annotations

import time
from dataclasses import InitVar, dataclass, field
from typing import Any

from service.domain.model_config import MODEL_CONFIGS, ModelConfig
from service.domain.request import TERMINAL_STATUSES, RequestStatus
from service.domain.sampling import GREEDY, Sampling
from service.domain.tokenizer import BYTES, Tokenizer
from service.sim.iteration import weight_bytes
from service.sim.sla import SLA_CLASSES, SlaClass

LIVE_FAMILIES = tuple(name for name, c in MODEL_CONFIGS.items() if not c.shape_only)
TERMINAL = TERMINAL_STATUSES
#: A request's status values, as the API lists them: queued, leased, then the terminal ones sorted.
STATUSES = tuple(s.value for s in (RequestStatus.QUEUED, RequestStatus.LEASED, *sorted(TERMINAL)))


@dataclass
class LiveTenant:
    tenant_id: str
    sla_class: str
    weight: float
    priority: int
    key_hash: str | None  # SHA-256 hex of the tenant's key; None: revoked


@dataclass
class LiveModel:
    """A served model: a built-in ``family`` built from ``seed``, or the model directory ``path``
    (its ``family`` is its config's name, ``hf:<path>``; ``loaded`` is that config)."""

    tenant_id: str
    model_id: str
    family: str  # the config's name: what the scheduler sizes and costs the model by
    seed: int
    replicas: int  # home replicas wanted (container: whole devices)
    tokenizer: Tokenizer = field(default=BYTES, repr=False, compare=False)
    path: str | None = None
    created_at: float = field(default_factory=time.time)  # epoch seconds of its registration
    loaded: InitVar[ModelConfig | None] = None
    config: ModelConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self, loaded: ModelConfig | None) -> None:
        self.config = loaded if loaded is not None else MODEL_CONFIGS[self.family]

    @property
    def uid(self) -> str:
        return f"{self.tenant_id}/{self.model_id}"

    @property
    def weight_bytes(self) -> int:
        return weight_bytes(self.config)


@dataclass
class LiveDevice:
    device_id: str  # "<executor_id>/<local device>", unique in the service
    local: str  # the executor's name for it ("cpu:0", "cuda:1")
    executor_id: str
    host_id: str
    kind: str
    mem_bytes: int


@dataclass
class LiveExecutor:
    executor_id: str
    host_id: str
    device_ids: list[str]
    last_seen: float
    leases: set[str] = field(default_factory=set)
    busy_s: float = 0.0  # sum of reported busy seconds (utilisation)
    stage_url: str | None = None  # its stage server: layers of replicas led from other executors


@dataclass
class LiveReplica:
    replica_id: str
    model_uid: str
    device_ids: tuple[str, ...]
    guest: bool
    max_batch: int
    leases: set[str] = field(default_factory=set)
    draining: bool = False
    last_active: float = 0.0
    pinned: bool = False  # placed by an admin: the home planner leaves it alone
    # A sliced guest (placement ``slice``): ``(device_id, start, end)`` per slice in execution
    # order, layers ``[start, end)``, a device possibly more than once; empty: layers split evenly
    # over ``device_ids``. ``yields``: its slices run in its devices' owners' gaps (owner
    # priority); else it takes turns with them as a whole guest does.
    plan: tuple[tuple[str, int, int], ...] = ()
    yields: bool = False


@dataclass
class LiveRequest:
    request_id: str
    tenant_id: str
    model_id: str
    prompt: list[int]
    max_tokens: int
    sla_class: str
    token_budget: int
    arrival: float  # wall clock (epoch seconds)
    status: RequestStatus = RequestStatus.QUEUED
    attempts: int = 0
    lease_id: str | None = None
    output_tokens: list[int] = field(default_factory=list)
    queued_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    finished_at: float | None = None
    error: str | None = None
    idempotency_key: str | None = None  # the client's key: a retry with it returns this request
    body_sha: str | None = None  # digest of what was submitted under that key
    finishing: bool = False  # its end (completion or cancel) is being written: nothing else may end it
    temperature: float = 0.0  # sampling (service.domain.sampling): 0 is greedy
    top_p: float = 1.0
    seed: int | None = None  # the sampling seed (chosen at intake when sampled and not given)
    slo_ttft_s: float | None = None  # the request's own TTFT target (x-slo-ttft-ms); None: its class's
    slo_tpot_s: float | None = None  # its own time-per-output-token target (x-slo-tpot-ms)
    priority: int | None = None  # its own queue priority (x-priority); None: its tenant's
    project_id: str = "default"  # the tenant's project it belongs to (its quota and usage)

    @property
    def model_uid(self) -> str:
        return f"{self.tenant_id}/{self.model_id}"

    @property
    def sampling(self) -> Sampling:
        if self.temperature == 0.0:
            return GREEDY  # top_p and seed change nothing
        return Sampling(self.temperature, self.top_p, self.seed or 0)

    @property
    def sla(self) -> SlaClass:
        """The targets it is held to: its SLA class's, with its own TTFT and TPOT targets first."""
        return SLA_CLASSES[self.sla_class].with_targets(self.slo_ttft_s, self.slo_tpot_s)

    def public(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "tenant_id": self.tenant_id, "model_id": self.model_id,
                "status": self.status.value, "prompt_tokens": len(self.prompt), "max_tokens": self.max_tokens,
                "sla_class": self.sla_class, "slo_ttft_s": self.slo_ttft_s, "slo_tpot_s": self.slo_tpot_s,
                "priority": self.priority, "project_id": self.project_id, "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
                "token_budget": self.token_budget, "attempts": self.attempts,
                "output_tokens": list(self.output_tokens), "queued_s": self.queued_s, "ttft_s": self.ttft_s,
                "e2e_s": self.e2e_s, "arrival": self.arrival, "finished_at": self.finished_at, "error": self.error}

    def update_row(self) -> dict[str, Any]:
        """What changes after acceptance (the GMG writer's batched update)."""
        return {"uid": self.request_id, "status": self.status.value, "attempts": self.attempts,
                "output_tokens": self.output_tokens, "queued_s": self.queued_s, "ttft_s": self.ttft_s,
                "e2e_s": self.e2e_s, "finished_at": self.finished_at, "error": self.error}

    def row(self) -> dict[str, Any]:
        """Its GMG properties (the prompt included, so a restart can run it)."""
        return {"uid": self.request_id, "tenant_id": self.tenant_id, "model_uid": self.model_uid,
                "model_id": self.model_id, "prompt": self.prompt, "max_tokens": self.max_tokens,
                "sla_class": self.sla_class, "token_budget": self.token_budget, "arrival": self.arrival,
                "status": self.status.value, "attempts": self.attempts, "output_tokens": self.output_tokens,
                "queued_s": self.queued_s, "ttft_s": self.ttft_s, "e2e_s": self.e2e_s,
                "finished_at": self.finished_at, "error": self.error,
                "idempotency_key": self.idempotency_key, "body_sha": self.body_sha,
                "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
                "slo_ttft_s": self.slo_ttft_s, "slo_tpot_s": self.slo_tpot_s, "priority": self.priority,
                "project_id": self.project_id}


@dataclass
class Lease:
    lease_id: str
    request_id: str
    replica_id: str
    executor_id: str
    granted_at: float  # monotonic
    expires_at: float  # monotonic
    granted_wall: float  # epoch seconds
    expected_end_wall: float  # epoch seconds: the end of its busy window until it ends (LeaseBook.expected_run_s)


@dataclass(frozen=True)
class Write:
    """A row for the GMG writer: ``kind`` names the batched query it joins."""

    kind: str  # "request" (a request's update) | "slice_new" (a granted lease) | "slice_end" (its end)
    #            | "workflow" (a workflow's progress: ``{"uid", "snapshot"}``)
    #            | "observation" (a slice the executor timed: ``record_slice_observations``)
    row: dict[str, Any]


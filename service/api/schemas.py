"""Request bodies and the error answer of the HTTP API (pydantic): bounds here are the first line of
bad-input defence. Values the service checks itself (a family, an SLA class) are documented as enums.

Bodies are strict: a JSON ``true`` is not the integer 1 and ``"3"`` is not 3; as in JSON Schema,
``2.0`` is the integer 2 and a float field takes an integer (``"weight": 2``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from service.domain.sampling import MAX_SEED, MAX_TEMPERATURE
from service.live.names import QUEUE_POLICY_NAMES, SLA_CLASS_NAMES
from service.live.records import LIVE_FAMILIES

ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
DEVICE = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,31}$"


def _whole(value: Any) -> Any:
    """JSON Schema's integer: a float with no fraction is one (the strict check then refuses bools and text)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _whole_items(value: Any) -> Any:
    # one pass over the list in the common case (token ids arrive as ints), not a call per item
    if isinstance(value, list) and any(type(x) is float for x in value):
        return [_whole(x) for x in value]
    return value


Int = Annotated[int, BeforeValidator(_whole)]
IntList = Annotated[list[int], BeforeValidator(_whole_items)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TenantIn(Body):
    tenant_id: str = Field(pattern=ID)
    sla_class: str = Field("standard", json_schema_extra={"enum": list(SLA_CLASS_NAMES)})
    weight: float = Field(1.0, gt=0, le=1000)
    priority: Int = Field(0, ge=-100, le=100)


class ModelIn(Body):
    """Exactly one of ``family`` and ``path``."""

    model_id: str = Field(pattern=ID)
    family: str | None = Field(None, max_length=64, json_schema_extra={"enum": [*LIVE_FAMILIES, None]},
                               description=f"a runnable built-in model: {', '.join(LIVE_FAMILIES)}")
    path: str | None = Field(None, min_length=1, max_length=4096,
                             description="admin keys only: the absolute path of a Hugging Face model directory "
                                         "(config.json, *.safetensors, tokenizer files; model_type llama or gpt2) "
                                         "present on the executors' nodes and readable by the service")
    seed: Annotated[int, Field(ge=0, lt=2**31), BeforeValidator(_whole)] | None = Field(
        None, description="weight seed (default: derived from tenant and model)")
    replicas: Int = Field(1, ge=1, le=8)
    tenant_id: str | None = Field(None, pattern=ID, description="admin keys only: the owning tenant")


class RequestIn(Body):
    model_id: str = Field(pattern=ID)
    prompt: str | None = Field(None, min_length=1, max_length=100_000, description="text (byte-level tokens)")
    prompt_tokens: IntList | None = Field(None, min_length=1, max_length=100_000)
    max_tokens: Int = Field(ge=1, le=1_000_000)
    sla_class: str | None = Field(None, max_length=32, json_schema_extra={"enum": [*SLA_CLASS_NAMES, None]},
                                  description="default: the tenant's")
    tenant_id: str | None = Field(None, pattern=ID, description="admin keys only")
    temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE, description="0 (default): greedy")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus mass (default 1: every token)")
    seed: Annotated[int, Field(ge=0, le=MAX_SEED), BeforeValidator(_whole)] | None = Field(
        None, description="the sampling seed (default: a random one, kept with the request)")
    project_id: str | None = Field(None, pattern=ID, description="the tenant's project it belongs to (default: "
                                                                  "x-project, the key's one project, else 'default')")


class RequestBatchIn(Body):
    requests: list[RequestIn] = Field(min_length=1, max_length=1000)


class DeviceIn(Body):
    device_id: str = Field(pattern=DEVICE, description="the executor's name for it, e.g. cpu:0")
    kind: str = Field("cpu", max_length=64)
    mem_bytes: Int = Field(gt=0, le=2**50)


class ExecutorIn(Body):
    executor_id: str = Field(pattern=ID)
    host_id: str = Field(pattern=ID)
    devices: list[DeviceIn] = Field(min_length=1, max_length=64)
    stage_url: str | None = Field(None, pattern=r"^https?://[A-Za-z0-9.\-\[\]:]+$", max_length=200,
                                  description="this node's stage server (layers run here for leases held elsewhere)")


class ReplicaIn(Body):
    tenant_id: str = Field(pattern=ID)
    model_id: str = Field(pattern=ID)
    device_ids: list[str] = Field(min_length=1, max_length=8,
                                  description="devices in layer order; they may belong to different executors")


class HeartbeatIn(Body):
    running: list[str] = Field(default_factory=list, max_length=4096)
    busy_s: float = Field(0.0, ge=0, le=1e12, description="seconds the executor's devices have been busy, in total")


class PollIn(Body):
    executor_id: str = Field(pattern=ID)
    max_leases: Int = Field(1, ge=0, le=256)
    wait_s: float = Field(0.0, ge=0, le=30)
    ready: list[Annotated[str, Field(max_length=256)]] | None = Field(
        None, max_length=4096, description="the replicas this executor has built (model loaded, KV pool "
        "allocated); one not among them is leased one request at a time until it is (omitted: no limit)")


class CompletionIn(Body):
    lease_id: str = Field(max_length=64)
    output_tokens: IntList = Field(max_length=1_000_000)
    queued_s: float = Field(0.0, ge=0, le=1e6)
    ttft_s: float = Field(ge=0, le=1e6)
    e2e_s: float = Field(ge=0, le=1e6)
    iterations: Int = Field(0, ge=0, le=10**9)
    busy_s: float = Field(0.0, ge=0, le=1e9)
    peak_bytes: Int = Field(0, ge=0, le=2**50)  # bounds below 2**53: a JSON number is a double
    prefill_stage_s: list[Annotated[float, Field(ge=0, le=1e6)] | None] = Field(
        default_factory=list, max_length=256, description="its prefill's seconds per stage of the lease, in "
        "the lease's stage order (null: a stage not timed there): recorded as slice observations in the GMG")
    decode_stage_s: list[Annotated[float, Field(ge=0, le=1e6)] | None] = Field(
        default_factory=list, max_length=256, description="one decode iteration the request took part in, its "
        "seconds per stage likewise (empty: none timed): recorded as slice observations in the GMG")
    decode_batch: Int = Field(0, ge=0, le=1_000_000, description="that decode iteration's sequences")
    decode_context: Int = Field(0, ge=0, le=10**7, description="the longest context that decode iteration attended")


class ProgressUpdateIn(Body):
    lease_id: str = Field(max_length=64)
    offset: Int = Field(ge=0, le=1_000_000, description="the position of the first token in the output")
    tokens: IntList = Field(max_length=1_000_000)


class ProgressIn(Body):
    executor_id: str = Field(pattern=ID)
    updates: list[ProgressUpdateIn] = Field(max_length=4096)


class CompleteIn(Body):
    executor_id: str = Field(pattern=ID)
    results: list[CompletionIn] = Field(max_length=1024)


class FailIn(Body):
    reason: str = Field("", max_length=2000)
    executor_id: str | None = Field(None, pattern=ID)


class WhatIfIn(Body):
    tenant_id: str | None = Field(None, pattern=ID)
    model_id: str | None = Field(None, pattern=ID)
    device_ids: list[str] | None = Field(None, min_length=1, max_length=8,
                                         description="a candidate placement: a replica of the model on these devices")
    placement: Literal["replica"] | None = Field(None, description="or: what the replica policy would do now")
    horizon_s: float = Field(20.0, gt=0, le=600)


class QueuePolicyIn(Body):
    queue: str = Field(max_length=64, json_schema_extra={"enum": list(QUEUE_POLICY_NAMES)})
    params: dict[str, float] = Field(default_factory=dict, max_length=8,
                                     description="the policy's parameters (e.g. slack's token_s, sjf's "
                                                 "aging_tokens_per_s); none: its defaults")


class InspectIn(Body):
    query: str | None = Field(None, min_length=1, max_length=20_000, description="read-only Cypher (admin keys)")
    name: str | None = Field(None, max_length=64, description="a named inspection query")
    params: dict[str, Any] = Field(default_factory=dict)


# ---- responses -------------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    kind: str = Field(description="unauthorized, forbidden, read_only, not_found, conflict, invalid_input, http, "
                                  "overloaded, unavailable or internal")
    message: str = Field(description="what was wrong, in one line")


class ErrorOut(BaseModel):
    """Every error the API answers: ``{"error": {"kind", "message"}}``."""

    error: ErrorDetail


# ---- governance: keys, projects, quotas, access requests ------------------------------------------
class QuotaIn(Body):
    """Limits; a field left out or null is no limit."""

    tokens_per_s: float | None = Field(None, gt=0, le=1e9, description="prompt + max_tokens admitted per second "
                                                                        "(a token bucket holding 10 s of it)")
    device_s_per_hour: float | None = Field(None, gt=0, le=1e9, description="device-seconds over the last hour")
    mem_bytes: Annotated[int, Field(gt=0, le=2**50), BeforeValidator(_whole)] | None = Field(
        None, description="bytes of weights its models may hold")


class ApiKeyIn(Body):
    key_id: str = Field(pattern=ID)
    name: str = Field(min_length=1, max_length=200, description="the person or service it belongs to")
    role: str = Field(json_schema_extra={"enum": ["tenant_admin", "member", "viewer"]})
    projects: list[Annotated[str, Field(pattern=ID)]] = Field(
        default_factory=list, max_length=100, description="the projects it acts in (member, viewer); empty: all")
    expires_in_s: float | None = Field(None, gt=0, le=10 * 365 * 86400.0, description="null: never expires")


class AuditorKeyIn(Body):
    key_id: str = Field(pattern=ID)
    name: str = Field(min_length=1, max_length=200)
    expires_in_s: float | None = Field(None, gt=0, le=10 * 365 * 86400.0)


class ProjectIn(Body):
    project_id: str = Field(pattern=ID)
    description: str = Field("", max_length=1000)
    quota: QuotaIn | None = None


class OnboardingModelIn(Body):
    model_id: str = Field(pattern=ID)
    family: str = Field(max_length=64, json_schema_extra={"enum": list(LIVE_FAMILIES)})


class OnboardingIn(Body):
    """A prospective tenant's request: no key needed."""

    tenant_id: str = Field(pattern=ID, description="the tenant id it asks for")
    organisation: str = Field(min_length=1, max_length=200)
    contact: str = Field(min_length=3, max_length=200, description="who to answer (an e-mail address, say)")
    sla_class: str = Field("standard", json_schema_extra={"enum": list(SLA_CLASS_NAMES)})
    models: list[OnboardingModelIn] = Field(default_factory=list, max_length=16)
    quota: QuotaIn = Field(default_factory=lambda: QuotaIn(tokens_per_s=None, device_s_per_hour=None, mem_bytes=None))
    note: str = Field("", max_length=2000)


class ClaimIn(Body):
    claim_token: str = Field(min_length=1, max_length=200)


class AccessChangeIn(Body):
    """A tenant's request for a change: ``quota`` (with ``quota``, for the tenant or one
    ``project_id``), ``model`` (``model_id`` and ``family``) or ``sla_class``."""

    kind: Literal["quota", "model", "sla_class"]
    tenant_id: str | None = Field(None, pattern=ID, description="admin keys only")
    project_id: str | None = Field(None, pattern=ID, description="quota: the project's (default: the tenant's)")
    quota: QuotaIn | None = None
    model_id: str | None = Field(None, pattern=ID)
    family: str | None = Field(None, max_length=64, json_schema_extra={"enum": [*LIVE_FAMILIES, None]})
    sla_class: str | None = Field(None, json_schema_extra={"enum": [*SLA_CLASS_NAMES, None]})
    note: str = Field("", max_length=2000)


class DecisionIn(Body):
    reason: str = Field(min_length=1, max_length=2000, description="why: kept in the request's history")

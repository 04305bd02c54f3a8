"""What the HTTP API answers on success (pydantic): the response model of every route, so the OpenAPI
document has a schema for each answer and a handler cannot leak a key it does not declare.

Models list the keys in the order they are answered; ``None`` is answered as ``null`` (keys are
never left out), except a stage's ``url``, present only for a stage on another executor. Errors
are :class:`service.api.schemas.ErrorOut`. Open-ended parts (a Cypher row, per-name counters)
are typed as mappings or ``Any`` and nothing else.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.domain.request import RequestStatus


class Out(BaseModel):
    """An answer: no keys but the declared ones (a key a handler adds without declaring it is a 500
    in the tests, not a silent drop)."""

    model_config = ConfigDict(extra="forbid")


# ---- ops -------------------------------------------------------------------------------------------
class HealthOut(Out):
    status: Literal["ok", "degraded"] = Field(description="degraded: not ready (see /readyz)")
    ready: bool
    neo4j: Literal["up", "down"]
    placement: str = Field(description="the placement policy: container or replica")
    queue: str = Field(description="the queue policy")


class LoopOut(Out):
    """A background loop's health."""

    last_ok_s_ago: float | None = Field(description="seconds since its last successful tick; null: none yet")
    ticks: int
    failures: int
    last_error: str | None
    running: bool
    stuck: bool


class Neo4jStatusOut(Out):
    reachable: bool
    uri: str | None = Field(description="the server it last connected to; null: none yet")
    error: str | None = Field(description="why it is unreachable; null while it answers")


class AuditWriterOut(Out):
    """The audit log's writer."""

    enabled: bool = Field(description="false: SLICESCHED_AUDIT=0, nothing is recorded")
    pending: int = Field(description="entries waiting to be written")
    written: int = Field(description="entries written by this process")
    dropped: int = Field(description="entries lost past the queue's bound during an outage")
    failed_batches: int
    head_seq: int = Field(description="seq of the chain's last written entry")


class LeasePathOut(Out):
    failing: bool = Field(description="the last submissions' and completions' writes all "
                                      "ended in a 503 past their bound while Neo4j answered its pings: not ready")
    failures_in_a_row: int
    last_failure_s_ago: float | None = Field(description="seconds; null: none yet")
    last_error: str | None


class LeadershipOut(Out):
    role: str = Field(description="leader | standby | renewing (its term not renewed in time) | deposed")
    holder: str = Field(description="this process's name as a contender")
    epoch: int | None = Field(description="the term it holds (the fencing token); null: none")
    leader: str | None = Field(description="the holder the last ask found")
    leader_epoch: int | None
    term_s: float


class ReadinessOut(Out):
    ready: bool
    neo4j: Neo4jStatusOut
    lease_path: LeasePathOut
    loops: dict[str, LoopOut] = Field(description="by loop name")
    stuck_loops: list[str]
    gmg_pending_writes: int
    gmg_dropped_writes: int
    unplaced_models: int = Field(description="models the last re-plan found no home for (names: /v1/stats)")
    audit: AuditWriterOut
    leadership: LeadershipOut | None = Field(None, description="with leader election on (SLICESCHED_LEADER_ELECTION)")


class WriteLagOut(Out):
    p50: float | None = Field(description="seconds; null before the first write")
    p99: float | None
    rows: int = Field(description="rows written")
    pending: int = Field(description="rows waiting")


class SliceStatOut(Out):
    device: str
    layers: list[int] = Field(description="[start, end): the layers this slice runs")


class ReplicaStatOut(Out):
    replica_id: str
    model: str = Field(description="the model's uid, tenant_id/model_id")
    devices: list[str]
    guest: bool
    draining: bool
    leases: int
    slices: list[SliceStatOut] | None = Field(None, description="a sliced guest's cut (placement slice), in "
                                                                 "execution order; absent: layers split evenly")
    yields: bool | None = Field(None, description="a sliced guest runs in its devices' owners' gaps (owner "
                                                  "priority); false: it takes turns with them; absent: not sliced")


class DecisionReasonOut(Out):
    """A decision's reason in fields, with its line."""

    code: str = Field(description="add, slice, drain_idle, drain_owner_pressed, drain_owner_memory, "
                                  "whatifs_unjudged or sliced")
    tenant: str | None = None
    model: str | None = Field(None, description="the model's uid, tenant_id/model_id")
    replica: str | None = Field(None, description="the replica it drains, or the sliced guest placed")
    devices: list[str] | None = Field(None, description="the compute units it concerns")
    figures: dict[str, Any] = Field(description="the numbers behind it: tokens gained, requests late without "
                                                "and with, waiting requests, idle seconds, ...")
    text: str = Field(description="the reason in a line (the note)")


class StepStatusOut(Out):
    """What a scheduler step's placement came to."""

    code: str = Field(description="placed, static, no_backlog, no_candidates, no_fit_memory, tenant_worse, "
                                  "no_gain or whatif_budget_spent")
    text: str
    tenant: str | None = Field(None, description="tenant_worse: the tenant made worse")
    figures: dict[str, Any] | None = None


class StatsOut(Out):
    counters: dict[str, int]
    gmg_write_lag_s: WriteLagOut
    replicas: list[ReplicaStatOut]
    decisions: list[str] = Field(description="the scheduler's last 50 decisions, oldest first")
    decision_reasons: list[DecisionReasonOut] = Field(description="the same decisions' reasons in fields, "
                                                                  "oldest first")
    step_status: StepStatusOut | None = Field(description="the scheduler's last step: placed, or nothing "
                                                          "placed and why; null: no step yet")
    iteration_s: dict[str, float] = Field(description="measured mean iteration time per model family")
    queue_policy: str = Field(description="the queue policy in force (--queue, or the last PUT /v1/queue-policy)")
    unplaced_models: dict[str, str] = Field(description="model uid -> why the last re-plan found it no home")
    loops: dict[str, LoopOut]
    scheduler_steps: int
    scheduler_step_s_total: float
    token_budget_mae: float | None = Field(description="mean absolute error of the token budget; null: none yet")


# ---- tenants, models, keys -------------------------------------------------------------------------
class TenantOut(Out):
    tenant_id: str
    sla_class: str
    weight: float
    priority: int
    models: list[str] = Field(description="its model ids, sorted")
    key: Literal["active", "revoked"] = Field(description="the tenant's own key (a tenant admin's, all projects): "
                                                          "rotate or revoke it at /v1/tenants/{tenant_id}/keys/...")


class TenantCreatedOut(TenantOut):
    api_key: str = Field(description="the tenant's key, shown once")


class TenantKeyOut(Out):
    tenant_id: str
    api_key: str = Field(description="the new key, shown once")


class TenantKeyRevokedOut(Out):
    tenant_id: str
    revoked: bool


class ModelOut(Out):
    tenant_id: str
    model_id: str
    family: str
    seed: int
    replicas: int = Field(description="home replicas wanted")
    num_params: int
    weight_bytes: int
    max_context: int = Field(description="tokens, prompt and output together")
    vocab_size: int
    path: str | None = Field(None, description="the model directory it is served from; null: a built-in family")


class ExecutorPoolOut(Out):
    pool_id: str
    allowed_kinds: list[str]
    max_devices: int
    max_mem_bytes: int
    key: Literal["active", "revoked"]
    executors: list[str] = Field(description="live executors it registered")


class ExecutorPoolCreatedOut(ExecutorPoolOut):
    api_key: str = Field(description="the pool's key, shown once")


class PoolKeyOut(Out):
    pool_id: str
    api_key: str = Field(description="the new key, shown once")


class PoolKeyRevokedOut(Out):
    pool_id: str
    revoked: bool
    executors_dropped: list[str]


# ---- devices, executors, replicas, leases ----------------------------------------------------------
class DeviceOut(Out):
    device_id: str = Field(description="global: executor_id/local name")
    executor_id: str
    host_id: str
    kind: str
    mem_bytes: int
    free_bytes: int
    replicas: list[str] = Field(description="replicas with weights on it")


class ExecutorRegisteredOut(Out):
    executor_id: str
    lease_ttl_s: float
    heartbeat_s: float
    devices: dict[str, str] = Field(description="the executor's device name -> the global device id")


class HeartbeatOut(Out):
    renewed: list[str] = Field(description="lease ids renewed")
    cancel: list[str] = Field(description="lease ids to stop: their requests ended")
    drain: bool


class ExecutorRemovedOut(Out):
    executor_id: str
    removed: bool


class StageOut(Out):
    device_id: str = Field(description="the executor's own name for the device")
    global_device_id: str
    layers: list[int] = Field(min_length=2, max_length=2, description="[first, end): the layers it runs")
    url: str | None = Field(None, description="only for a stage on another executor: its stage server (null: none)")


class PinnedReplicaOut(Out):
    replica_id: str
    device_ids: list[str]
    stages: list[StageOut]


class LeaseOut(Out):
    lease_id: str
    request_id: str
    tenant_id: str
    model_id: str
    family: str
    seed: int
    replica_id: str
    stages: list[StageOut]
    prompt_tokens: list[int]
    max_tokens: int
    expires_in_s: float
    model_path: str | None = Field(None, description="the model directory to load; null: build family from seed")
    temperature: float = Field(0.0, description="0 (absent): greedy; the sampling fields only when sampled")
    top_p: float = 1.0
    sampling_seed: int = Field(0, description="the request's generator seed (the model's weights have `seed`)")
    stop_ids: list[int] = Field(default_factory=list, description="producing one ends the request (absent: none)")
    stream: bool = Field(False, description="report the tokens as they come (POST /v1/leases/progress); "
                                            "only when true")
    guest: bool = Field(False, description="its replica is a guest on these devices: the executor gives its "
                                           "iterations a smaller share of its time than the owners'; only when true")
    tpot_s: float = Field(0.0, description="the request's time-per-output-token target, seconds: its replica's "
                                           "claim on the executor's time grows with 1 / tpot_s (absent: none given)")
    yields: bool = Field(False, description="a sliced guest under owner priority (placement slice): its iterations "
                                            "run only while no owner's is due, and its stages on other nodes wait "
                                            "for those nodes' owners' iteration in progress; only when true")


class PollOut(Out):
    leases: list[LeaseOut] = Field(description="empty: no work came within wait_s")


class LeaseRenewedOut(Out):
    lease_id: str
    expires_in_s: float


class RejectedOut(Out):
    lease_id: str
    reason: str


class CompleteOut(Out):
    accepted: list[str] = Field(description="lease ids whose results are durable")
    rejected: list[RejectedOut]


class ProgressOut(Out):
    cancel: list[str] = Field(description="the executor's lease ids to stop: their requests ended")


class LeaseFailedOut(Out):
    lease_id: str
    failed: bool


# ---- requests --------------------------------------------------------------------------------------
class AcceptedOut(Out):
    request_id: str
    status: RequestStatus
    token_budget: int
    prompt_tokens: int = Field(description="the prompt's length in tokens")


class AcceptedBatchOut(Out):
    accepted: list[AcceptedOut] = Field(description="in the order submitted")


class RequestOut(Out):
    request_id: str
    tenant_id: str
    model_id: str
    status: RequestStatus
    prompt_tokens: int = Field(description="the prompt's length in tokens")
    max_tokens: int
    sla_class: str
    slo_ttft_s: float | None = Field(description="its own TTFT target (x-slo-ttft-ms); null: its class's")
    slo_tpot_s: float | None = Field(description="its own time-per-output-token target (x-slo-tpot-ms); null: its class's")
    priority: int | None = Field(description="its own queue priority (x-priority); null: its tenant's")
    project_id: str = Field(description="the tenant's project it belongs to (its quota and usage)")
    temperature: float = Field(description="0: greedy")
    top_p: float
    seed: int | None = Field(description="the sampling seed; null: greedy with none given")
    token_budget: int
    attempts: int
    output_tokens: list[int]
    queued_s: float | None
    ttft_s: float | None
    e2e_s: float | None
    arrival: float = Field(description="epoch seconds")
    finished_at: float | None = Field(description="epoch seconds; null while it runs")
    error: str | None
    text: str = Field(description="the output tokens decoded (byte-level)")


# ---- what-if and inspection ------------------------------------------------------------------------
class OutcomeOut(Out):
    output_tokens: int
    violations_by_model: dict[str, int] = Field(description="late requests per model uid")
    memory_violations: int
    peak_bytes: dict[str, int] = Field(description="per affected device")


class CandidateWhatIfOut(Out):
    """A candidate placement's prediction, with and without it."""

    horizon_s: float
    compute_units: list[str] = Field(description="the executors the devices belong to")
    baseline: OutcomeOut | None
    with_change: OutcomeOut | None = Field(description="null: the placement does not fit")
    feasible: bool


class PolicyAddOut(Out):
    model: str = Field(description="the model's uid, tenant_id/model_id")
    compute_units: list[str] = Field(description="the executors its guest replica would span")


class PolicyWhatIfOut(Out):
    """What one step of the replica policy would decide now (nothing applied)."""

    placement: Literal["replica"]
    horizon_s: float
    whatifs: int = Field(description="simulations run to decide")
    add: list[PolicyAddOut]
    drain: list[str] = Field(description="replica ids")
    notes: list[str]
    reasons: list[DecisionReasonOut] = Field(description="the notes in fields, one per change")
    status: StepStatusOut | None = Field(description="placed, or nothing placed and why")


class QueuePolicyOut(Out):
    queue: str = Field(description="the queue policy every model's queue is ordered by from now on")
    params: dict[str, float]
    previous: str = Field(description="the policy it replaced")


class InspectOut(Out):
    columns: list[str]
    rows: list[list[Any]] = Field(description="one list per row, in column order (nodes and relationships as maps)")
    truncated: bool = Field(description="the query had more rows than an answer holds "
                                        "(SLICESCHED_INSPECT_MAX_ROWS): rows are its first ones")


# ---- audit -------------------------------------------------------------------------------------------
class AuditEntryOut(Out):
    seq: int = Field(description="its place in the chain: 1, 2, 3, ... with no gap")
    at: float = Field(description="when the action was taken, epoch seconds")
    actor: str = Field(description="who acted: admin, a tenant id, an executor id, scheduler or service")
    actor_role: str = Field(description="admin, tenant, executor, scheduler or system")
    action: str = Field(description="e.g. tenant.create, tenant.key.rotate, model.register, placement.decision")
    target_kind: str = Field(description="tenant, model, executor, executor_pool, placement or service")
    target_id: str | None
    tenant_id: str | None = Field(description="the tenant it concerns; null: the platform's (admin keys only)")
    before: Any = Field(description="the state before the action (null: none)")
    after: Any = Field(description="the state after it")
    details: Any = Field(description="more: a decision's notes and what-if figures, an executor's pool, ...")
    prev_hash: str = Field(description="the hash of the entry before it (64 zeros for the first)")
    hash: str = Field(description="SHA-256 of the canonical JSON of its fields with prev_hash")


class AuditPageOut(Out):
    entries: list[AuditEntryOut] = Field(description="oldest first")
    next_since_seq: int | None = Field(description="since_seq of the next page; null: this was the last")


class AuditVerifyOut(Out):
    ok: bool = Field(description="true: the chain is intact")
    entries: int = Field(description="entries read (up to the first bad one)")
    last_seq: int = Field(description="the last intact entry's seq (0: none)")
    last_hash: str = Field(description="its hash: keep it, and check later with anchor_seq/anchor_hash")
    first_bad_seq: int | None = Field(description="the first entry that breaks the chain; null when intact")
    reason: str | None = Field(description="why it breaks the chain (altered, removed, inserted, reordered)")
    start_seq: int = Field(0, description="checked from after this seq: the last entry of an archived prefix "
                                          "(0: from the first entry)")
    seconds: float


# ---- governance ---------------------------------------------------------------------------------------
class WhoAmIOut(Out):
    role: str
    tenant_id: str | None
    key_id: str | None
    projects: list[str]


class QuotaOut(Out):
    tokens_per_s: float | None
    device_s_per_hour: float | None
    mem_bytes: int | None


class ApiKeyOut(Out):
    key_id: str
    tenant_id: str | None
    name: str
    role: str
    projects: list[str]
    expires_at: float | None = Field(description="epoch seconds; null: never")
    created_at: float
    created_by: str
    status: Literal["active", "revoked", "expired"]


class ApiKeyCreatedOut(ApiKeyOut):
    api_key: str = Field(description="the key, shown once")


class ProjectOut(Out):
    tenant_id: str
    project_id: str
    description: str
    quota: QuotaOut
    created_at: float


class UsageOut(Out):
    quota: QuotaOut
    tokens_admitted: int
    tokens_used: int = Field(description="admitted minus what ended requests did not generate")
    requests_refused: int
    device_s_last_hour: float
    device_s_total: float
    tokens_available: float | None = Field(description="in the token bucket now; null: no tokens/s quota")


class TenantUsageOut(Out):
    tenant_id: str
    tenant: UsageOut | None = Field(description="the tenant-wide meter (null for a key limited to projects: it "
                                                "counts the tenant's other projects' work)")
    projects: dict[str, UsageOut]


class AccessRequestOut(Out):
    request_id: str
    kind: str
    tenant_id: str
    project_id: str | None
    status: Literal["pending", "approved", "rejected"]
    payload: dict[str, Any]
    reason: str | None
    history: list[dict[str, Any]] = Field(description="{at, by, action, reason?}, oldest first")
    created_at: float
    decided_at: float | None
    claimed: bool | None = Field(description="onboarding: whether the first key was issued")


class OnboardingSubmittedOut(AccessRequestOut):
    claim_token: str = Field(description="shown once: present it to /v1/onboarding/{id}/claim")


class ClaimOut(AccessRequestOut):
    api_key: str | None = Field(description="the tenant's first key (tenant_admin), once, after approval")


# ---- experiments ---------------------------------------------------------------------------------------
class ExperimentSummaryOut(Out):
    uid: str
    kind: str = Field(description="replay, whatif or benchmark")
    project: str
    tenant_id: str | None = Field(description="the tenant it was run for; null: none (admin keys only see it)")
    created_at: str | None = Field(description="ISO 8601 UTC")
    seed: int | None
    code_commit: str | None
    code_dirty: bool | None
    cost_model_kind: str | None
    out_dir: str | None


class ExperimentOut(Out):
    uid: str
    kind: str
    project: str
    tenant_id: str | None
    created_at: str
    seed: int | None
    code: dict[str, Any] = Field(description="commit, dirty, package_version, diff_sha256")
    cost_model: dict[str, Any] = Field(description="kind, artifact, sha256 (null: the analytic roofline)")
    data_digests: dict[str, str] = Field(description="each data file read -> its SHA-256")
    config: dict[str, Any]
    results: list[dict[str, Any]] = Field(description="one per policy and load")
    plots: list[dict[str, Any]] = Field(description="name, path, sha256, size_bytes")
    out_dir: str | None


class ExperimentComparisonOut(Out):
    a: str
    b: str
    top: list[list[Any]] = Field(description="[field, A, B]: kind, project, created_at, code, cost model")
    config_differences: list[list[Any]] = Field(description="[dotted key, A, B] of each configuration value "
                                                            "that differs")
    data_differences: list[list[Any]] = Field(description="[data file, A's SHA-256, B's]")
    rows: list[list[Any]] = Field(description="[policy xload, figure, A, B]: the headline figures side by side")
    result_differences: int = Field(description="result values that differ (wall-clock timings left out)")


# ---- workflows -----------------------------------------------------------------------------------------
class WorkflowStepOut(Out):
    step_id: str
    kind: str = Field(description="model or tool")
    role: str
    status: str = Field(description="pending, running, done, failed or cancelled")
    request_id: str | None = Field(description="a model call's request")
    start_s: float | None = Field(description="seconds from the workflow's submission")
    end_s: float | None
    duration_s: float | None
    output_tokens: int
    text: str = Field(description="what it produced (up to 2,000 characters)")
    error: str | None
    detail: dict[str, Any] = Field(description="a call's prompt_tokens, ttft_s, queued_s; a tool's cpu_s, wall_s, "
                                               "digest, waited_s")


class WorkflowOut(Out):
    workflow_id: str
    tenant_id: str
    project_id: str
    shape: str
    status: str = Field(description="running, done, failed or cancelled")
    slo_s: float
    created_at: float = Field(description="epoch seconds")
    finished_at: float | None
    e2e_s: float | None
    met_slo: bool | None = Field(description="done within slo_s (null while it runs, or when it did not finish)")
    error: str | None
    steps: list[WorkflowStepOut] = Field(description="in dependency order")


# ---- predictors ------------------------------------------------------------------------------------
class CalibrationOut(Out):
    """Coverage of each quantile on held-out observations: the share of truths at or below it (a
    calibrated p90 covers 0.9). A target is null without held-out observations of its kind."""

    quantiles: list[float]
    num_calls: int
    num_tools: int
    output_tokens: list[float] | None = None
    latency_s: list[float] | None = None
    tool_duration_s: list[float] | None = None


class ObservationsOut(Out):
    calls: int = Field(description="call observations kept for refits (the window)")
    tools: int
    new_calls: int = Field(description="call observations since the last refit")
    recorded_calls: int = Field(description="finished workflow model calls recorded by this process")
    recorded_tools: int
    restored: int = Field(description="observations read back from the file at start")
    unwritten: int = Field(description="observations not yet appended to the file (written about every second)")
    file: str = Field(description="the JSONL file (GET /v1/predictors/observations exports it)")


class RefitOut(Out):
    at: float = Field(description="epoch seconds of its start")
    duration_s: float
    seed: int
    from_: Literal["naive", "learned"] = Field(alias="from", description="naive: fitted from scratch; learned: "
                                               "fine-tuned")
    version: int = Field(description="the version it made")
    trained_calls: int
    trained_tools: int
    held_out_calls: int = Field(description="the newest fifth, for its calibration")
    held_out_tools: int

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PredictorOut(Out):
    enabled: bool = Field(description="a predictor is configured (--predictor); false: the slack policy uses "
                          "token_s per budgeted token")
    source: str | None = Field(description="naive, or the folder it was loaded from")
    kind: Literal["none", "naive", "learned"] = Field(description="what answers now")
    version: int = Field(description="0: none; 1: the one loaded at start; +1 per refit swapped in")
    digest: str | None = Field(description="SHA-256 of a learned model's weights (equal models, equal digests)")
    refit_interval_s: float
    min_new: int
    window: int
    seed: int
    observations: ObservationsOut
    refits: int
    refit_failures: int
    key_failures: int = Field(description="slack keys the predictor failed to give (the token estimate decided)")
    last_error: str | None = Field(description="the last refit's failure; null once one succeeds")
    last_refit: RefitOut | None
    calibration: CalibrationOut | None = Field(description="the model answering now, on the last refit's "
                                               "held-out observations")
    calibration_before: CalibrationOut | None = Field(description="the model it replaced, on the same")

"""Settings of the live service, from the environment (``SLICESCHED_*``, declared in
:mod:`service.environment`) and the command line."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from learned.choice import DEFAULT_KIND, kind_from
from service import environment as env
from service.core.policies import PLACEMENT_POLICIES
from service.core.queue import QUEUE_POLICIES
from service.domain.error import InvalidInputError
from service.graph.connection import Neo4jSettings
from service.live.retention import RetentionSettings

# what the executors can run: whole replicas, and sliced guests (a model's layers cut over
# other tenants' devices, run in their owners' gaps)
LIVE_PLACEMENTS = ("container", "replica", "slice")
MIN_BODY_BYTES = 64 * 1024  # the smallest body limit: every route takes a body this large


def state_dir() -> Path:
    return env.path("SLICESCHED_STATE") or Path.home() / ".local/state/slicesched"


@dataclass(frozen=True)
class ServiceSettings:
    admin_key: str
    executor_key: str | None = None  # the bootstrap executor pool's key; None: executor pools only
    executor_kinds: tuple[str, ...] = ()  # device kinds the bootstrap pool may register (): the catalogue's
    queue: str = "fifo"
    placement: str = "container"
    lease_ttl_s: float = 10.0  # a lease not renewed within this expires
    heartbeat_s: float = 2.0  # executors heartbeat this often
    max_attempts: int = 3  # failed leases before a request fails
    max_batch: int = 8  # leases per replica at once (its KV slots)
    schedule_interval_s: float = 2.0  # the slice policy steps at most this often
    # replica placement: a model whose home executor is this busy gets a guest ahead of a backlog
    # where the what-if predicts no tenant worse off (0: only for backlogs; service.core.placement)
    headroom_utilisation: float = 0.5
    # replica placement: a guest is drained for a pressing owner only where the what-if predicts
    # that keeping it makes the other tenants' requests late (False: every press drains)
    confirm_drains: bool = True
    slice_retention_s: float = 3600.0  # live Slices (leases) are kept this long after they end
    db_timeout_s: float = 2.0  # a call that cannot reach Neo4j fails (503, Retry-After) within about this
    call_timeout_s: float = 10.0  # a call that reached Neo4j but has no answer by then: 503, outcome unknown
    max_pending_writes: int = 500_000  # GMG mirror rows kept during an outage (coalesced per object)
    max_queued: int = 200_000  # requests waiting per model; beyond, a submission is refused (429)
    # a request body larger than its route takes is refused (413) before it is read: the bulk
    # routes (batches of requests, completions, progress, workflows) take the larger limit
    max_body_bytes: int = 2 * 1024 * 1024
    # inspection (POST /v1/inspect, audit reads): stopped in Neo4j past its timeout, at most this
    # many at once (beyond: 429 at once; they share threads and connections with the lease path)
    # and at most this many rows in an answer
    inspect_timeout_s: float = 30.0
    max_inspections: int = 2
    inspect_max_rows: int = 10_000
    max_bulk_body_bytes: int = 64 * 1024 * 1024
    neo4j: Neo4jSettings = field(default_factory=Neo4jSettings.from_env)
    # what grows (requests, workflows, audit entries, observations): archived, then deleted (service.live.retention)
    retention: RetentionSettings = field(default_factory=RetentionSettings.from_env)
    cost_model: str = DEFAULT_KIND  # the what-if mirror's iteration costs (learned.choice.KINDS)
    audit: bool = True  # record the audit log (SLICESCHED_AUDIT=0: off; reading and verifying still work)
    usage_interval_s: float = 5.0  # quota usage is written onto Tenant and Project nodes this often
    max_pending_access_requests: int = 1000  # onboarding requests awaiting a decision; beyond, a 429
    # the distributional predictor (service/live/predictors.py): None (none: the slack policy uses
    # token_s per budgeted token), "naive", or a folder written by `slicesched predictors train`
    predictor: str | None = None
    predictor_refit_s: float = 300.0  # a refit is considered this often (with a predictor)
    predictor_min_new: int = 50  # new call observations a scheduled refit waits for
    predictor_window: int = 4000  # observations of each kind kept and trained on
    predictor_seed: int = 0
    observations_file: Path | None = None  # finished workflow steps (JSONL); None: <state>/predictor/observations.jsonl
    # the what-if's cost model retrained from the GMG's slice observations this often (0: never;
    # service/live/retraining.py), once this many new ones arrived
    cost_model_retrain_s: float = 0.0
    cost_model_retrain_min_new: int = 20
    # leader election (service/live/leader.py): one serve of several on a database leads, the
    # others stand by; its term on Neo4j's clock, renewed every fifth of it
    leader_election: bool = False
    leader_ttl_s: float = 5.0

    def __post_init__(self) -> None:
        kind_from(self.cost_model)  # a known kind, else InvalidInputError
        if self.queue not in QUEUE_POLICIES:
            raise InvalidInputError(f"unknown queue policy {self.queue!r} (known: {', '.join(QUEUE_POLICIES)})")
        if self.placement not in LIVE_PLACEMENTS:
            hint = (" (a replay baseline; live placement is container, replica or slice)"
                    if self.placement in PLACEMENT_POLICIES else "")
            raise InvalidInputError(f"unknown live placement policy {self.placement!r} "
                                    f"(known: {', '.join(LIVE_PLACEMENTS)}){hint}")
        if self.executor_key is not None and (len(self.executor_key) < 16 or self.executor_key == self.admin_key):
            raise InvalidInputError("the executor key must have at least 16 characters and differ from the admin key "
                                    "(executors get a key of their own: SLICESCHED_EXECUTOR_KEY or an executor pool)")
        if not (self.lease_ttl_s > 0 and self.heartbeat_s > 0 and self.max_attempts >= 1 and self.max_batch >= 1):
            raise InvalidInputError("lease_ttl_s, heartbeat_s must be > 0; max_attempts, max_batch >= 1")
        if not (0 < self.db_timeout_s <= 60 and 0 < self.call_timeout_s <= 600 and self.max_pending_writes >= 1000):
            raise InvalidInputError("db_timeout_s must be in (0, 60], call_timeout_s in (0, 600]; "
                                    "max_pending_writes >= 1000")
        if self.max_queued < 1:
            raise InvalidInputError("max_queued must be >= 1")
        if not (0 < self.inspect_timeout_s <= 600 and 1 <= self.max_inspections <= 64
                and 1 <= self.inspect_max_rows <= 10_000_000):
            raise InvalidInputError("inspect_timeout_s must be in (0, 600], max_inspections in [1, 64], "
                                    "inspect_max_rows in [1, 10000000]")
        if not (MIN_BODY_BYTES <= self.max_body_bytes <= self.max_bulk_body_bytes):
            raise InvalidInputError(f"body limits must satisfy {MIN_BODY_BYTES} <= max_body_bytes <= "
                                    f"max_bulk_body_bytes, got {self.max_body_bytes} and {self.max_bulk_body_bytes} "
                                    "(SLICESCHED_MAX_BODY_BYTES, SLICESCHED_MAX_BULK_BODY_BYTES)")
        if not 0.0 <= self.headroom_utilisation <= 1.0:
            raise InvalidInputError(f"headroom_utilisation must be in [0, 1] (0: off), got {self.headroom_utilisation}")
        self._check_predictor()

    def _check_predictor(self) -> None:
        p = self.predictor
        if p is not None and p != "naive" and not (Path(p) / "meta.json").is_file():
            why = "no such folder" if not Path(p).exists() else "no meta.json in it"
            raise InvalidInputError(f"predictor {p!r}: {why}; give a folder written by `slicesched predictors train "
                                    "RECORDS --out DIR`, or 'naive' (SLICESCHED_PREDICTOR, --predictor)", culprit=p)
        if not (0.0 < self.predictor_refit_s <= 86_400.0):
            raise InvalidInputError(f"predictor_refit_s must be in (0, 86400], got {self.predictor_refit_s} "
                                    "(SLICESCHED_PREDICTOR_REFIT_S, --predictor-refit-s)")
        if not (1.0 <= self.leader_ttl_s <= 300.0):
            raise InvalidInputError(f"leader_ttl_s must be in [1, 300] seconds, got {self.leader_ttl_s} "
                                    "(SLICESCHED_LEADER_TTL_S)")
        if not (1 <= self.predictor_min_new <= 1_000_000):
            raise InvalidInputError(f"predictor_min_new must be in [1, 1000000], got {self.predictor_min_new}")
        if not (10 <= self.predictor_window <= 1_000_000):
            raise InvalidInputError(f"predictor_window must be in [10, 1000000], got {self.predictor_window}")
        if not (0 <= self.predictor_seed < 2**31):
            raise InvalidInputError(f"predictor_seed must be in [0, 2^31), got {self.predictor_seed}")

    @property
    def observations_path(self) -> Path:
        return self.observations_file or state_dir() / "predictor" / "observations.jsonl"

    @staticmethod
    def from_env(**overrides: object) -> ServiceSettings:
        """Environment first (:mod:`service.environment`: a malformed value is refused naming its
        variable), then ``overrides`` (the command line). Without ``SLICESCHED_ADMIN_KEY`` a key is
        generated once and kept in ``<state>/admin.key``. The executor key never defaults to the
        admin key: without ``SLICESCHED_EXECUTOR_KEY`` executors need the key of an executor pool
        (``POST /v1/executor-pools``)."""
        env.check_all()
        values: dict[str, object] = {
            "admin_key": env.raw("SLICESCHED_ADMIN_KEY") or _stored_admin_key(),
            "executor_key": env.raw("SLICESCHED_EXECUTOR_KEY"),
            "executor_kinds": env.names("SLICESCHED_EXECUTOR_KINDS"),
            "queue": env.text("SLICESCHED_QUEUE"),
            "placement": env.text("SLICESCHED_PLACEMENT"),
            "lease_ttl_s": env.number("SLICESCHED_LEASE_TTL_S", float),
            "heartbeat_s": env.number("SLICESCHED_HEARTBEAT_S", float),
            "max_batch": env.number("SLICESCHED_MAX_BATCH", int),
            "slice_retention_s": env.number("SLICESCHED_SLICE_RETENTION_S", float),
            "db_timeout_s": env.number("SLICESCHED_DB_TIMEOUT_S", float),
            "call_timeout_s": env.number("SLICESCHED_CALL_TIMEOUT_S", float),
            "max_pending_writes": env.number("SLICESCHED_MAX_PENDING_WRITES", int),
            "max_queued": env.number("SLICESCHED_MAX_QUEUED", int),
            "max_body_bytes": env.number("SLICESCHED_MAX_BODY_BYTES", int),
            "inspect_timeout_s": env.number("SLICESCHED_INSPECT_TIMEOUT_S", float),
            "max_inspections": env.number("SLICESCHED_MAX_INSPECTIONS", int),
            "inspect_max_rows": env.number("SLICESCHED_INSPECT_MAX_ROWS", int),
            "max_bulk_body_bytes": env.number("SLICESCHED_MAX_BULK_BODY_BYTES", int),
            "headroom_utilisation": env.number("SLICESCHED_HEADROOM_UTILISATION", float),
            "confirm_drains": env.flag("SLICESCHED_CONFIRM_DRAINS"),
            "cost_model": kind_from(None),
            "audit": env.flag("SLICESCHED_AUDIT"),
            "predictor": env.text("SLICESCHED_PREDICTOR"),
            "predictor_refit_s": env.number("SLICESCHED_PREDICTOR_REFIT_S", float),
            "predictor_min_new": env.number("SLICESCHED_PREDICTOR_MIN_NEW", int),
            "predictor_window": env.number("SLICESCHED_PREDICTOR_WINDOW", int),
            "predictor_seed": env.number("SLICESCHED_PREDICTOR_SEED", int),
            "observations_file": env.path("SLICESCHED_OBSERVATIONS_FILE"),
            "cost_model_retrain_s": env.number("SLICESCHED_COST_MODEL_RETRAIN_S", float),
            "cost_model_retrain_min_new": env.number("SLICESCHED_COST_MODEL_RETRAIN_MIN_NEW", int),
            "leader_election": env.flag("SLICESCHED_LEADER_ELECTION"),
            "leader_ttl_s": env.number("SLICESCHED_LEADER_TTL_S", float),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return ServiceSettings(**values)  # type: ignore[arg-type]


def _stored_admin_key() -> str:
    path = state_dir() / "admin.key"
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = f"admin_{secrets.token_urlsafe(24)}"
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key

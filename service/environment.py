"""Every ``SLICESCHED_*`` environment variable, declared once, and the one place they are read.

Each variable is a :class:`Variable` in :data:`VARIABLES`: its concern (which settings object reads
it), its kind, its default and what it does. Code reads a variable only through this module
(:func:`text`, :func:`number`, :func:`flag`, :func:`path`, :func:`names`); a test holds every other
module to that, and to declaring what it reads. A malformed value is refused with an
:class:`~service.domain.error.InvalidInputError` naming the variable, at the start of the command
that reads it. ``slicesched config --list`` prints the table with the values in force (secrets
masked); the docs' configuration page is generated from it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from service.domain.error import InvalidInputError, InvariantError

Concern = Literal["service", "executor", "neo4j", "cost model", "files", "cli"]
Kind = Literal["text", "secret", "number", "integer", "flag", "path", "list"]


@dataclass(frozen=True)
class Variable:
    name: str
    concern: Concern  # the settings object (or command) that reads it
    kind: Kind
    default: str  # as written in the environment; "" : unset (what that means is in ``help``)
    help: str
    low: float | None = None  # numbers: the smallest value allowed (inclusive unless ``open_low``)
    high: float | None = None  # numbers: the largest value allowed (inclusive)
    open_low: bool = False  # numbers: ``low`` itself is refused (a positive duration)

    @property
    def secret(self) -> bool:
        return self.kind == "secret"


def _v(name: str, concern: Concern, kind: Kind, default: str, help: str, low: float | None = None,
       high: float | None = None, open_low: bool = False) -> Variable:
    return Variable(f"SLICESCHED_{name}", concern, kind, default, help, low, high, open_low)


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    # ---- the service (service.live.settings.ServiceSettings) -------------------------------------
    _v("ADMIN_KEY", "service", "secret", "", "the platform admin's key; unset: one is generated once and kept in "
       "$SLICESCHED_STATE/admin.key"),
    _v("EXECUTOR_KEY", "service", "secret", "", "the bootstrap executor pool's key (>= 16 characters, not the admin "
       "key); unset: executors need an executor pool's key. The executor daemon reads it too (--key)"),
    _v("EXECUTOR_KINDS", "service", "list", "", "comma-separated device kinds the bootstrap pool may register; unset: "
       "the catalogue's"),
    _v("QUEUE", "service", "text", "fifo", "the queue policy (service.core.queue.QUEUE_POLICIES)"),
    _v("PLACEMENT", "service", "text", "container", "the live placement policy: container, replica or slice"),
    _v("LEASE_TTL_S", "service", "number", "10", "a lease not renewed within this many seconds expires", 0, 3600, True),
    _v("HEARTBEAT_S", "service", "number", "2", "executors heartbeat this often (seconds)", 0, 600, True),
    _v("MAX_BATCH", "service", "integer", "8", "leases per replica at once (its KV slots)", 1, 4096),
    _v("SLICE_RETENTION_S", "service", "number", "3600", "live Slices are kept this long after they end (seconds)",
       0, 30 * 86400, True),
    # ---- retention (service.live.retention.RetentionSettings) -------------------------------------
    _v("RETAIN_REQUESTS_S", "service", "number", "604800", "finished requests (with their results) are archived, "
       "then deleted, this long after they finished (seconds)", 0, 10 * 365 * 86400, True),
    _v("RETAIN_WORKFLOWS_S", "service", "number", "604800", "ended workflows (with their steps) are archived, then "
       "deleted, this long after they ended (seconds)", 0, 10 * 365 * 86400, True),
    _v("RETAIN_AUDIT_S", "service", "number", "7776000", "audit entries older than this are archived, then deleted "
       "(the oldest first; verification starts from the archived prefix's last hash; seconds)",
       0, 10 * 365 * 86400, True),
    _v("RETAIN_OBSERVATIONS_S", "service", "number", "2592000", "predictor observations older than this are "
       "archived, then removed from the observations file (seconds)", 0, 10 * 365 * 86400, True),
    _v("RETENTION_INTERVAL_S", "service", "number", "600", "retention runs this often (seconds)", 0, 86400, True),
    _v("RETENTION_BATCH", "service", "integer", "5000", "rows archived and deleted per transaction", 1, 100000),
    _v("ARCHIVE_DIR", "service", "path", "", "where retention writes its archives (gzipped NDJSON); unset: "
       "$SLICESCHED_STATE/archive"),
    _v("DB_TIMEOUT_S", "service", "number", "2", "a call that cannot reach Neo4j fails (503) within about this",
       0, 60, True),
    _v("CALL_TIMEOUT_S", "service", "number", "10", "a call that reached Neo4j but has no answer by then: 503",
       0, 600, True),
    _v("MAX_BODY_BYTES", "service", "integer", "2097152", "a request body larger than this is refused (413) before "
       "it is read, on every route but the bulk ones; a body over 64 KiB is read only after its key is known",
       65536, 1e9),
    _v("MAX_BULK_BODY_BYTES", "service", "integer", "67108864", "the same for the bulk routes (POST "
       "/v1/requests/batch, /v1/leases/complete, /v1/leases/progress, /v1/workflows)", 65536, 4e9),
    _v("INSPECT_TIMEOUT_S", "service", "number", "30", "an inspection query (POST /v1/inspect) or audit page is "
       "stopped in Neo4j past this (its transaction timeout), and answered by then (seconds)", 0, 600, True),
    _v("MAX_INSPECTIONS", "service", "integer", "2", "inspection queries and audit reads running at once; beyond, "
       "a 429 at once (they share worker threads and Neo4j connections with the lease path)", 1, 64),
    _v("INSPECT_MAX_ROWS", "service", "integer", "10000", "rows an inspection answers at most (the rest dropped "
       "unread; the answer says truncated)", 1, 1e7),
    _v("MAX_PENDING_WRITES", "service", "integer", "500000", "GMG mirror rows kept during a Neo4j outage", 1000, 1e9),
    _v("MAX_QUEUED", "service", "integer", "200000", "requests waiting per model; beyond, a submission is a 429",
       1, 1e9),
    _v("HEADROOM_UTILISATION", "service", "number", "0.5", "replica placement: a home this busy gets a guest ahead "
       "of a backlog (0: only for backlogs)", 0, 1),
    _v("CONFIRM_DRAINS", "service", "flag", "1", "replica placement: drain a guest for a pressing owner only where "
       "a what-if predicts the others late (0: every press drains)"),
    _v("LEADER_ELECTION", "service", "flag", "0", "run for leadership: of the serve processes on one database, one "
       "leads and the others stand by (503 not_leader, /readyz 503) and take over when its term ends (service.live.leader)"),
    _v("LEADER_TTL_S", "service", "number", "5", "a leader's term (on Neo4j's clock): renewed every fifth of it; a "
       "standby takes over once it ends unrenewed", 1, 300),
    _v("AUDIT", "service", "flag", "1", "record the audit log (0: off; reading and verifying still work)"),
    _v("PREDICTOR", "service", "text", "", "the distributional predictor: 'naive' or a folder written by "
       "`slicesched predictors train`; unset: none"),
    _v("PREDICTOR_REFIT_S", "service", "number", "300", "a predictor refit is considered this often (seconds)",
       0, 86400, True),
    _v("PREDICTOR_MIN_NEW", "service", "integer", "50", "new observations a scheduled refit waits for", 1, 1e6),
    _v("PREDICTOR_WINDOW", "service", "integer", "4000", "observations of each kind kept and trained on", 10, 1e6),
    _v("PREDICTOR_SEED", "service", "integer", "0", "the predictor's training seed", 0, 2**31 - 1),
    _v("OBSERVATIONS_FILE", "service", "path", "", "finished workflow steps (JSONL); unset: "
       "$SLICESCHED_STATE/predictor/observations.jsonl"),
    # ---- the executor daemon and clients of the API ----------------------------------------------
    _v("SERVER", "executor", "text", "http://127.0.0.1:8000", "the service's URL, for executors and the CLI's "
       "API commands"),
    # ---- Neo4j (service.graph.connection.Neo4jSettings) -----------------------------------------
    _v("NEO4J_URI", "neo4j", "text", "", "an external Neo4j's Bolt URI; unset: the managed local server"),
    _v("NEO4J_USER", "neo4j", "text", "", "the external Neo4j's user"),
    _v("NEO4J_PASSWORD", "neo4j", "secret", "", "the Neo4j password (>= 8 characters for the managed server); "
       "unset: the managed server's generated one"),
    _v("NEO4J_DATABASE", "neo4j", "text", "neo4j", "the database name"),
    # ---- cost models ------------------------------------------------------------------------------
    _v("COST_MODEL", "cost model", "text", "learned", "the cost model pricing iterations: learned, gnn, table or "
       "roofline (--cost-model wins)"),
    _v("COST_MODEL_DIR", "cost model", "path", "", "where trained cost-model artifacts are cached; unset: "
       "$XDG_CACHE_HOME/slicesched/cost-models"),
    _v("COST_MODEL_PROFILES", "cost model", "list", "", "own operator profiles to train on (os.pathsep-separated "
       "paths)"),
    _v("COST_MODEL_RETRAIN_S", "cost model", "number", "0", "the service retrains the what-if's cost model from the "
       "GMG's slice observations this often and swaps it in (seconds; 0: never)", 0, 604800),
    _v("COST_MODEL_RETRAIN_MIN_NEW", "cost model", "integer", "20", "new slice observations a scheduled retrain "
       "waits for", 1, 1e6),
    # ---- files ------------------------------------------------------------------------------------
    _v("STATE", "files", "path", "", "the state folder (managed Neo4j, admin key, predictor files); unset: "
       "~/.local/state/slicesched"),
    _v("CACHE", "files", "path", "", "the tools and Neo4j jars cache; unset: ~/.cache/slicesched"),
    _v("DATA", "files", "path", "", "the public data sets' folder (fetch's target); unset: "
       "$XDG_CACHE_HOME/slicesched/data"),
    _v("DATA_MIRROR", "files", "text", "", "`slicesched data fetch`'s default --mirror"),
)}

T = TypeVar("T", int, float)


def _declared(name: str) -> Variable:
    try:
        return VARIABLES[name]
    except KeyError:
        raise InvariantError(f"{name} is read but not declared in service.environment.VARIABLES") from None


def raw(name: str) -> str | None:
    """The variable's value as set (stripped), or None when unset or empty."""
    _declared(name)
    value = os.environ.get(name, "").strip()
    return value or None


def text(name: str) -> str | None:
    """The value, else the declared default (None when that is unset too)."""
    return raw(name) or _declared(name).default or None


def path(name: str) -> Path | None:
    value = text(name)
    return Path(value).expanduser() if value else None


def names(name: str, sep: str = ",") -> tuple[str, ...]:
    """A list variable's items (``sep``-separated, blanks dropped)."""
    return tuple(item.strip() for item in (text(name) or "").split(sep) if item.strip())


def number(name: str, kind: Callable[[str], T]) -> T:
    """A number within its declared bounds; anything else is refused naming the variable."""
    v = _declared(name)
    value = raw(name) or v.default
    try:
        parsed = kind(value)
    except ValueError:
        raise InvalidInputError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}",
                                culprit=name) from None
    low_ok = v.low is None or (parsed > v.low if v.open_low else parsed >= v.low)
    if not (math.isfinite(parsed) and low_ok and (v.high is None or parsed <= v.high)):
        lo = "(" if v.open_low else "["
        raise InvalidInputError(f"{name} must be in {lo}{_fmt(v.low)}, {_fmt(v.high)}], got {value!r}", culprit=name)
    return parsed


def flag(name: str) -> bool:
    """A yes/no variable: 1/true/yes/on or 0/false/no/off (any case); anything else is refused."""
    value = (raw(name) or _declared(name).default).lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise InvalidInputError(f"{name} must be 1 or 0 (or true/false, yes/no, on/off), got {value!r}", culprit=name)


def check_all() -> None:
    """Refuse any malformed value among the variables set (the whole environment at once)."""
    for v in VARIABLES.values():
        if raw(v.name) is None:
            continue
        if v.kind == "number":
            number(v.name, float)
        elif v.kind == "integer":
            number(v.name, int)
        elif v.kind == "flag":
            flag(v.name)


def listing() -> list[dict[str, str]]:
    """The table: name, concern, kind, default, the value in force (secrets masked) and help."""
    rows = []
    for v in VARIABLES.values():
        value = raw(v.name)
        shown = "(set)" if value and v.secret else value or ""
        rows.append({"name": v.name, "concern": v.concern, "kind": v.kind, "default": v.default, "value": shown,
                     "range": _range(v), "help": v.help})
    return rows


def markdown() -> str:
    """The table as Markdown (the docs' configuration page)."""
    lines = ["| variable | read by | kind | default | allowed | what it does |", "| --- | --- | --- | --- | --- | --- |"]
    for v in VARIABLES.values():
        lines.append(f"| `{v.name}` | {v.concern} | {v.kind} | {f'`{v.default}`' if v.default else '-'} | "
                     f"{_range(v) or '-'} | {v.help.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _range(v: Variable) -> str:
    if v.low is None and v.high is None:
        return ""
    return f"{'(' if v.open_low else '['}{_fmt(v.low)}, {_fmt(v.high)}]"


def _fmt(x: float | None) -> str:
    if x is None:
        return "inf"
    return f"{x:g}" if x != int(x) or abs(x) < 1e6 else f"{x:.0e}"

"""An experiment record: one replay, what-if or benchmark run, with what it needs to be rerun
and compared. Pure data and comparisons; no I/O (who fills a record in:
:mod:`service.provenance` and :mod:`service.cli.replay`; who stores it:
:mod:`service.graph.experiment_store`).

A record holds the run's full configuration (for a replay: the parsed command-line options,
enough to run it again), the code version it ran (git commit and dirty flag, else the package
version), the SHA-256 of every data file it read, the seed, the cost model with its artifact
hash, the results and the plots (their paths and SHA-256; the bytes stay in the run's output
folder).

Results are compared number for number, except the fields in :data:`UNREPRODUCIBLE_FIELDS`
(wall-clock timings), which no rerun can repeat. NaN equals NaN here: a percentile of no
samples is NaN in both runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.domain.error import InvalidInputError

KINDS: tuple[str, ...] = ("replay", "whatif", "benchmark")
DEFAULT_PROJECT = "default"
#: Result fields that measure the machine, not the simulation: left out of every comparison.
UNREPRODUCIBLE_FIELDS: frozenset[str] = frozenset({"wall_s"})
#: Configuration keys a comparison does not list: the options repeat the config, and the cost
#: model's artifact path differs between machines with the same artifact.
CONFIG_NOISE: tuple[str, ...] = ("options.", "cost_model.artifact")
#: The figures a comparison shows per policy and load: (label, dotted key in a result).
HEADLINE_FIGURES: tuple[tuple[str, str], ...] = (
    ("tokens/s", "token_throughput_tps"), ("SLA viol.", "sla_violation_rate"),
    ("e2e p50 s", "e2e_s.p50"), ("e2e p99 s", "e2e_s.p99"),
    ("ttft p50 s", "ttft_s.p50"), ("ttft p99 s", "ttft_s.p99"))


@dataclass(frozen=True)
class CodeVersion:
    """The code a run ran. ``commit`` is the git HEAD (None: not a git checkout, or git is
    missing); ``dirty`` whether tracked files differed from it (None: unknown); ``diff_sha256``
    the SHA-256 of those differences (``git diff HEAD``; None when clean or unknown), so two
    dirty runs with different edits differ; ``package_version`` the installed version, always."""

    commit: str | None
    dirty: bool | None
    package_version: str
    diff_sha256: str | None = None

    def describe(self) -> str:
        if self.commit is None:
            return f"package {self.package_version} (no git commit)"
        return self.commit[:12] + (" (dirty)" if self.dirty else "")

    def to_doc(self) -> dict[str, Any]:
        return {"commit": self.commit, "dirty": self.dirty, "package_version": self.package_version,
                "diff_sha256": self.diff_sha256}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> CodeVersion:
        return cls(doc.get("commit"), doc.get("dirty"), str(doc.get("package_version", "")), doc.get("diff_sha256"))


@dataclass(frozen=True)
class Plot:
    """A plot a run wrote: its file name, where it was written, its size and SHA-256."""

    name: str
    path: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class Experiment:
    """One recorded run.

    ``kind`` is one of :data:`KINDS`; ``project`` groups experiments (a plain name, default
    ``"default"``); ``tenant_id`` the tenant it was run for, None for none. ``created_at`` is
    ISO 8601 UTC. ``config`` is everything that shaped the run; for a replay its ``options``
    are the parsed command-line options a rerun passes again. ``data_digests`` maps each data
    file read (absolute path, or ``builtin:<kind>/<name>`` for a named built-in document) to
    its SHA-256. ``cost_model`` is the cost model's own description (kind, artifact path,
    ``sha256``: None for the analytic roofline). ``results`` is one mapping per policy and load.
    """

    uid: str
    kind: str
    config: dict[str, Any]
    code: CodeVersion
    results: list[dict[str, Any]]
    created_at: str
    project: str = DEFAULT_PROJECT
    tenant_id: str | None = None
    seed: int | None = None
    data_digests: dict[str, str] = field(default_factory=dict)
    cost_model: dict[str, Any] = field(default_factory=dict)
    plots: tuple[Plot, ...] = ()
    out_dir: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidInputError(f"experiment kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.project:
            raise InvalidInputError("an experiment's project must be a non-empty name")

    @property
    def cost_model_sha256(self) -> str | None:
        value = self.cost_model.get("sha256")
        return None if value is None else str(value)


# ---- comparisons --------------------------------------------------------------------------------
def flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one mapping of dotted keys (``e2e_s.p50``); a list of mappings by
    index (``by_load[0].requests``), any other list as one value."""
    if not isinstance(doc, Mapping):
        return {prefix: doc} if prefix else {"": doc}
    out: dict[str, Any] = {}
    for key in sorted(doc, key=str):
        path = f"{prefix}.{key}" if prefix else str(key)
        value = doc[key]
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, path))
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            for i, item in enumerate(value):
                out.update(flatten(item, f"{path}[{i}]") if item else {f"{path}[{i}]": item})
        else:
            out[path] = value
    return out


def same_value(a: Any, b: Any) -> bool:
    """Equality with NaN equal to NaN, ints equal to the same floats, lists element-wise."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@dataclass(frozen=True)
class Difference:
    """One value that differs: ``key`` (dotted), and its value in A and in B (None: absent)."""

    key: str
    a: Any
    b: Any


def differences(a: Mapping[str, Any], b: Mapping[str, Any], *, ignore: frozenset[str] = frozenset()
                ) -> list[Difference]:
    """Every dotted key whose value differs between ``a`` and ``b`` (or is in one only), sorted;
    a key whose last part is in ``ignore`` is skipped."""
    fa, fb = flatten(a), flatten(b)
    out = []
    for key in sorted(set(fa) | set(fb)):
        if key.rpartition(".")[2] in ignore:
            continue
        if key not in fa or key not in fb or not same_value(fa[key], fb[key]):
            out.append(Difference(key, fa.get(key), fb.get(key)))
    return out


def result_key(result: Mapping[str, Any]) -> str:
    """A result's name within its run: ``policy x load`` (``fifo/container x1``)."""
    return f"{result.get('policy')} x{float(result.get('load_scale', 1.0)):g}"


def results_by_key(results: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {result_key(r): r for r in results}


def result_differences(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> list[Difference]:
    """Every result value that differs, keyed ``policy xload: field`` (a policy and load in one
    run only: one difference with the whole result as its value), wall-clock fields left out."""
    ra, rb = results_by_key(a), results_by_key(b)
    out: list[Difference] = []
    for key in sorted(set(ra) | set(rb)):
        if key not in ra or key not in rb:
            out.append(Difference(key, "present" if key in ra else None, "present" if key in rb else None))
            continue
        out += [Difference(f"{key}: {d.key}", d.a, d.b)
                for d in differences(ra[key], rb[key], ignore=UNREPRODUCIBLE_FIELDS)]
    return out


def headline_rows(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]
                  ) -> list[tuple[str, str, Any, Any]]:
    """Side-by-side rows ``(policy xload, figure, A, B)`` of :data:`HEADLINE_FIGURES` for every
    policy and load in either run (None where a run has none)."""
    ra, rb = results_by_key(a), results_by_key(b)
    rows = []
    for key in sorted(set(ra) | set(rb)):
        fa = flatten(ra[key]) if key in ra else {}
        fb = flatten(rb[key]) if key in rb else {}
        rows += [(key, label, fa.get(field_), fb.get(field_)) for label, field_ in HEADLINE_FIGURES]
    return rows


@dataclass(frozen=True)
class Reproduction:
    """A rerun against its record: what differs in the code, the data, the cost model and the
    results. ``exact`` only when nothing does."""

    code: list[Difference]
    data: list[Difference]
    cost_model: list[Difference]
    results: list[Difference]

    @property
    def exact(self) -> bool:
        return not (self.code or self.data or self.cost_model or self.results)

    def lines(self) -> list[str]:
        """One line per difference, provenance first (what may explain a result difference)."""
        out = [f"code version: {d.key} was {d.a!r}, now {d.b!r}" for d in self.code]
        for d in self.data:
            if d.a is None:
                out.append(f"data: {d.key} was not read by the recorded run (now {_short(d.b)})")
            elif d.b is None:
                out.append(f"data: {d.key} was read by the recorded run ({_short(d.a)}) but not now")
            else:
                out.append(f"data digest: {d.key} was {_short(d.a)}, now {_short(d.b)}")
        out += [f"cost model: {d.key} was {d.a!r}, now {d.b!r}" for d in self.cost_model]
        out += [f"result {d.key}: recorded {d.a!r}, rerun {d.b!r}" for d in self.results]
        return out


def _short(digest: Any) -> str:
    return f"sha256 {str(digest)[:16]}…" if isinstance(digest, str) else repr(digest)


def reproduction(record: Experiment, rerun: Experiment) -> Reproduction:
    """Compare a rerun with its record. The code is compared by commit, dirty flag and the
    digest of uncommitted changes (the package version only where there is no commit); the
    cost model by kind and artifact hash."""
    code_keys = ("commit", "dirty", "diff_sha256") if record.code.commit is not None or rerun.code.commit is not None \
        else ("package_version",)
    ca, cb = record.code.to_doc(), rerun.code.to_doc()
    code = [Difference(k, ca[k], cb[k]) for k in code_keys if not same_value(ca[k], cb[k])]
    cost = [Difference(k, record.cost_model.get(k), rerun.cost_model.get(k)) for k in ("kind", "sha256")
            if not same_value(record.cost_model.get(k), rerun.cost_model.get(k))]
    return Reproduction(code, differences(record.data_digests, rerun.data_digests), cost,
                        result_differences(record.results, rerun.results))


def comparison(a: Experiment, b: Experiment) -> dict[str, Any]:
    """What a side-by-side comparison shows, JSON-ready: the run-level fields of each
    (``top``: label, A, B), the configuration and data-digest differences, the headline figures
    per policy and load (``rows``: key, figure, A, B) and how many result values differ."""
    top = [["kind", a.kind, b.kind], ["project", a.project, b.project], ["created_at", a.created_at, b.created_at],
           ["code", a.code.describe(), b.code.describe()],
           ["cost model", f"{a.cost_model.get('kind')} {a.cost_model_sha256 or ''}".strip(),
            f"{b.cost_model.get('kind')} {b.cost_model_sha256 or ''}".strip()]]
    config = [[d.key, d.a, d.b] for d in differences(a.config, b.config) if not d.key.startswith(CONFIG_NOISE)]
    data = [[d.key, d.a, d.b] for d in differences(a.data_digests, b.data_digests)]
    return {"a": a.uid, "b": b.uid, "top": top, "config_differences": config, "data_differences": data,
            "rows": [list(r) for r in headline_rows(a.results, b.results)],
            "result_differences": len(result_differences(a.results, b.results))}


def record_doc(e: Experiment) -> dict[str, Any]:
    """The whole record as one JSON-ready mapping."""
    return {"uid": e.uid, "kind": e.kind, "project": e.project, "tenant_id": e.tenant_id,
            "created_at": e.created_at, "seed": e.seed, "code": e.code.to_doc(), "cost_model": e.cost_model,
            "data_digests": e.data_digests, "config": e.config, "results": e.results,
            "plots": [{"name": p.name, "path": p.path, "sha256": p.sha256, "size_bytes": p.size_bytes}
                      for p in e.plots], "out_dir": e.out_dir}

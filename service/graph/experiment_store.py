"""Experiment records in the GMG: one ``(:Experiment)`` node per recorded run (what a record
holds: :mod:`service.domain.experiment`). Scalars are properties, so Cypher can filter and show
them; nested values (config, results, digests, plots) are JSON strings. Plot bytes are not
stored here: the record keeps their paths and SHA-256 (see the README's "Experiments").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from service.domain.error import NotFoundError
from service.domain.experiment import CodeVersion, Experiment, Plot
from service.graph.store import StorePart


class UnknownExperimentError(NotFoundError):
    """No experiment with that uid (exit code 2)."""


def _json(value: Any) -> str:
    # NaN is kept (Python's json writes and reads it): a percentile of no samples is NaN
    return json.dumps(value, default=float, sort_keys=True)


class ExperimentStore(StorePart):
    QUERIES: tuple[str, ...] = ("create_experiment", "list_experiments", "get_experiment")

    def create_experiment(self, experiment: Experiment) -> str:
        """Persist ``experiment``; returns its uid. A uid already taken raises
        ``neo4j.exceptions.ConstraintError`` and writes nothing."""
        e = experiment
        rows = self._write(
            "create_experiment", uid=e.uid, kind=e.kind, project=e.project, tenant_id=e.tenant_id,
            created_at=e.created_at, seed=e.seed, code_commit=e.code.commit, code_dirty=e.code.dirty,
            code_diff_sha256=e.code.diff_sha256, code_package_version=e.code.package_version,
            cost_model_kind=e.cost_model.get("kind"), cost_model_sha256=e.cost_model_sha256, out_dir=e.out_dir,
            config_json=_json(e.config), data_digests_json=_json(e.data_digests), cost_model_json=_json(e.cost_model),
            results_json=_json(e.results),
            plots_json=_json([{"name": p.name, "path": p.path, "sha256": p.sha256, "size_bytes": p.size_bytes}
                              for p in e.plots]))
        return str(rows[0]["uid"])

    def list_experiments(self, *, project: str | None = None, kind: str | None = None, limit: int = 100,
                         tenant_id: str | None = None, projects: Sequence[str] | None = None
                         ) -> list[dict[str, Any]]:
        """Records (uid, kind, project, tenant_id, created_at, seed, code_commit, code_dirty,
        cost_model_kind, out_dir), newest first; None filters match all (``projects``: any of
        these projects)."""
        return self._read("list_experiments", project=project, kind=kind, limit=int(limit), tenant_id=tenant_id,
                          projects=None if projects is None else list(projects))

    def get_experiment(self, uid: str) -> Experiment:
        """The record ``uid``; :class:`UnknownExperimentError` if there is none. A record
        written before full records existed (config and results only) reads with empty
        provenance."""
        rows = self._read("get_experiment", uid=uid)
        if not rows:
            raise UnknownExperimentError(f"no experiment {uid!r} (see `slicesched experiments list`)", )
        r = rows[0]
        # the stored commit and cost-model hash columns are what a query (or a person) sees and
        # changes; they win over the JSON copies
        cost_model = json.loads(r["cost_model_json"] or "{}")
        if "sha256" in cost_model or r["cost_model_sha256"] is not None:
            cost_model["sha256"] = r["cost_model_sha256"]
        return Experiment(
            uid=str(r["uid"]), kind=str(r["kind"]), project=str(r["project"]), tenant_id=r["tenant_id"],
            created_at=str(r["created_at"]), seed=r["seed"],
            code=CodeVersion(r["code_commit"], r["code_dirty"], str(r["code_package_version"] or "unknown"),
                             r["code_diff_sha256"]),
            config=json.loads(r["config_json"] or "{}"), results=json.loads(r["results_json"] or "[]"),
            data_digests=json.loads(r["data_digests_json"] or "{}"), cost_model=cost_model,
            plots=tuple(Plot(str(p["name"]), str(p["path"]), str(p["sha256"]), int(p["size_bytes"]))
                        for p in json.loads(r["plots_json"] or "[]")),
            out_dir=r["out_dir"])

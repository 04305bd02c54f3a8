"""Live workflows in the GMG: a ``Workflow`` node per accepted workflow (its validated document
and inputs as JSON text, tenant, project, SLO, submit time, status) with one ``WorkflowStep``
per step (``HAS_STEP``; a model call's step ``CALLS`` its ``Request``). Written at acceptance
before the answer, then as whole snapshots carrying a version, so a late batch never undoes a
newer state; read back at start to resume what a previous process left running."""

from __future__ import annotations

from typing import Any

from service.graph.store import StorePart


class WorkflowStore(StorePart):
    QUERIES: tuple[str, ...] = ("create_workflows", "update_workflows", "live_workflows")

    def create_workflows(self, rows: list[dict[str, Any]]) -> set[str]:
        """Accepted workflows with their steps, in one transaction; returns the uids created
        (a uid that exists is left out and changes nothing)."""
        if not rows:
            return set()
        out = self._write("create_workflows", rows=rows)
        return {str(u) for u in out[0]["created"]} if out else set()

    def update_workflows(self, rows: list[dict[str, Any]]) -> set[str]:
        """Snapshots of workflows' progress; a row older than what Neo4j holds (by ``version``),
        or of a workflow that ended otherwise, changes nothing. Returns the uids updated. (No
        rows still runs the query: the writer's warm-up plans it that way.)"""
        out = self._write("update_workflows", rows=rows)
        return {str(u) for u in out[0]["updated"]} if out else set()

    def live_workflows(self, since: float) -> list[dict[str, Any]]:
        """Every running workflow, and those that ended since ``since`` (epoch s), with steps."""
        return [r["workflow"] for r in self._read("live_workflows", since=float(since))]

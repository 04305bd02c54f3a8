"""Tenants and models in the GMG: a model's operator graph imported phase by phase (one
transaction each), its weights placed, its summary read, a tenant deleted in bounded chunks."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from neo4j import ManagedTransaction

from service.domain.error import InvalidInputError
from service.domain.opgraph import OperatorGraph
from service.graph.store import StorePart, check_id, model_uid


@dataclass(frozen=True)
class ImportStats:
    model_uid: str
    phase: str
    operators: int
    tensors: int
    edges: int  # PRECEDES + READS + WRITES + HAS_OPERATOR
    seconds: float

    @property
    def items_per_s(self) -> float:
        return (self.operators + self.edges) / self.seconds if self.seconds > 0 else float("inf")


class ModelStore(StorePart):
    QUERIES: tuple[str, ...] = ("upsert_tenant", "upsert_model", "delete_model_phase", "create_model_phase", "place_weights",
               "model_summary", "delete_tenant")

    def upsert_tenant(self, tenant_id: str, **props: Any) -> None:
        self._write("upsert_tenant", tenant_id=check_id("tenant", tenant_id), props=props)

    def upsert_model(self, tenant_id: str, model_id: str, **props: Any) -> None:
        """Set properties of an existing model (e.g. the live service's family and seed)."""
        if not self._write("upsert_model", tenant_id=tenant_id, uid=model_uid(tenant_id, model_id),
                           props={"model_id": model_id, **props}):
            raise InvalidInputError(f"no tenant {tenant_id!r}: create it first", culprit=tenant_id)

    def import_model(self, tenant_id: str, model_id: str, graph: OperatorGraph, *,
                     device_id: str | None = None, create_tenant: bool = True) -> ImportStats:
        """Write one phase of a model's operator graph, replacing an earlier import of that phase.

        Validates first; everything is one transaction, so a failure writes nothing. With
        ``device_id`` the model's weights are made resident on that device.
        """
        graph.validate()
        uid = model_uid(tenant_id, model_id)
        phase = graph.phase
        ordered_tensors = sorted(graph.tensors.values(), key=lambda t: t.kind != "weight")
        position = {t.tensor_id: i for i, t in enumerate(ordered_tensors)}
        op_position = {op.op_id: i for i, op in enumerate(graph.operators)}
        tensor_rows = [
            {"uid": f"{uid}/{t.tensor_id}" if t.kind == "weight" else f"{uid}/{phase}/{t.tensor_id}",
             "tenant_id": tenant_id, "model_uid": uid, "phase": None if t.kind == "weight" else phase,
             "tensor_id": t.tensor_id, "kind": t.kind, "shape": list(t.shape), "dtype": t.dtype,
             "size_bytes": t.size_bytes}
            for t in ordered_tensors
        ]
        num_weights = sum(1 for t in ordered_tensors if t.kind == "weight")
        operators = [
            {"uid": f"{uid}/{phase}/{op.op_id}", "tenant_id": tenant_id, "model_uid": uid, "phase": phase,
             "op_id": op.op_id, "index": i, "kind": op.kind, "target": op.target, "layer": op.layer,
             "flops": op.flops, "bytes_read": op.bytes_read, "bytes_written": op.bytes_written,
             "workspace_bytes": op.workspace_bytes}
            for i, op in enumerate(graph.operators)
        ]
        precedes = [[op_position[a], op_position[b]] for a, b in graph.edges()]
        reads = [[i, position[t]] for i, op in enumerate(graph.operators) for t in op.inputs]
        writes = [[i, position[t]] for i, op in enumerate(graph.operators) for t in op.outputs]
        cfg = graph.config
        model_props = {
            "model_id": model_id, "name": graph.model_name, "style": cfg.get("style"),
            "dtype": cfg.get("dtype"), "num_layers": cfg.get("n_layers"), "d_model": cfg.get("d_model"),
            "weight_bytes": graph.bytes_of("weight"),
            f"{phase}_tokens": graph.num_tokens,  # the traced batch's tokens, that slice cuts scale from
        }

        def work(tx: ManagedTransaction) -> None:
            if create_tenant:
                self._tx_run(tx, "upsert_tenant", tenant_id=tenant_id, props={})
            if not self._tx_run(tx, "upsert_model", tenant_id=tenant_id, uid=uid, props=model_props):
                raise InvalidInputError(f"no tenant {tenant_id!r}: create it first", culprit=tenant_id)
            self._tx_run(tx, "delete_model_phase", model_uid=uid, phase=phase)
            done = self._tx_run(
                tx, "create_model_phase", model_uid=uid, weights=tensor_rows[:num_weights],
                tensors=tensor_rows[num_weights:], operators=operators, precedes=precedes, reads=reads,
                writes=writes,
            )
            if not done or not done[0]["ordered"]:
                raise RuntimeError("create_model_phase: collected lists lost their order; nothing was written")
            if device_id is not None:
                placed = self._tx_run(tx, "place_weights", model_uid=uid, device_id=device_id)
                if not placed or placed[0]["placed"] == 0:
                    raise InvalidInputError(f"unknown device {device_id!r}: apply a cluster spec that has it",
                                            culprit=device_id)

        check_id("tenant", tenant_id)
        started = time.perf_counter()
        self._execute_write(work)
        elapsed = time.perf_counter() - started
        return ImportStats(uid, graph.phase, len(operators), len(tensor_rows),
                           len(precedes) + len(reads) + len(writes) + len(operators), elapsed)

    def place_weights(self, tenant_id: str, model_id: str, device_id: str) -> int:
        rows = self._write("place_weights", model_uid=model_uid(tenant_id, model_id), device_id=device_id)
        placed = int(rows[0]["placed"]) if rows else 0
        if placed == 0:
            raise InvalidInputError(f"nothing placed: unknown model {tenant_id}/{model_id} or device {device_id!r}")
        return placed

    def model_summary(self, tenant_id: str, model_id: str, phase: str) -> dict[str, Any]:
        rows = self._read("model_summary", model_uid=model_uid(tenant_id, model_id), phase=phase)
        return rows[0] if rows else {}

    def delete_tenant(self, tenant_id: str, *, chunk: int = 10_000) -> int:
        """Delete all of a tenant's nodes in bounded chunks; returns how many were deleted."""
        total = 0
        while True:
            rows = self._write("delete_tenant", tenant_id=check_id("tenant", tenant_id), limit=chunk)
            deleted = int(rows[0]["deleted"]) if rows else 0
            total += deleted
            if deleted == 0:
                return total

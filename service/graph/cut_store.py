"""Slices cut from the GMG (the contract of :mod:`service.core.cut`), answered by Cypher for the
live service; replay computes the same cut in memory (:func:`service.models.cut.cut_model`)."""

from __future__ import annotations

from service.core.cut import Granularity, SliceCut, check_slices
from service.domain.error import InvalidInputError, NotFoundError
from service.domain.opgraph import PHASES
from service.graph.store import StorePart, model_uid


class CutStore(StorePart):
    QUERIES: tuple[str, ...] = ("model_layers", "cut_slices")

    def cut_slices(self, tenant_id: str, model_id: str, phase: str, granularity: Granularity) -> list[SliceCut]:
        """The slices of one imported model phase, in execution order.

        Refuses (:class:`InvalidInputError`) an unknown phase, a granularity that does not divide
        the model's layers (before the cut runs) and a cut with an empty or broken slice;
        :class:`NotFoundError` when the model or that phase is not imported.
        """
        if phase not in PHASES:
            raise InvalidInputError(f"unknown phase {phase!r} (expected one of {PHASES})", culprit=str(phase))
        uid = model_uid(tenant_id, model_id)
        head = self._read("model_layers", model_uid=uid, phase=phase)
        if not head or head[0]["operators"] == 0:
            raise NotFoundError(f"no {phase} graph of model {uid!r}: import it first")
        name = str(head[0]["name"] or uid)
        granularity.check(int(head[0]["num_layers"]), name)
        if head[0]["tokens"] is None:
            raise InvalidInputError(f"model {uid!r} was imported without its traced {phase} shape: import it again",
                                    culprit=uid)
        rows = self._read("cut_slices", model_uid=uid, phase=phase, layers=granularity.layers,
                          sublayer=granularity.sublayer)
        check_slices(name, granularity, [(int(r["layer_ops"]), bool(r["contiguous"])) for r in rows])
        return [SliceCut(
            index=int(r["index"]), first_layer=int(r["first_layer"]), last_layer=int(r["last_layer"]),
            part=str(r["part"]), op_ids=tuple(r["op_ids"]), input_bytes=int(r["input_bytes"]),
            output_bytes=int(r["output_bytes"]), weight_ids=tuple(r["weight_ids"]), weight_bytes=int(r["weight_bytes"]),
            kv_bytes=int(r["kv_bytes"]), workspace_bytes=int(r["workspace_bytes"]), flops=int(r["flops"]),
            predecessors=tuple(int(p) for p in r["predecessors"]), tokens=int(r["tokens"]),
        ) for r in rows]

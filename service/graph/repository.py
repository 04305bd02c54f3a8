"""The GMG repository: every read and write of the Global Mapping Graph goes through here.

Each public method runs catalog queries of the same name (``import_model`` is a composition of
several, in one transaction). Values reach Cypher only as parameters; writes go in batches of
``UNWIND $rows``. :class:`GraphRepository` is one object made of its parts, a module each: the
plumbing and schema (:mod:`service.graph.store`), tenants and models
(:mod:`service.graph.model_store`), the cluster (:mod:`service.graph.cluster_store`), the
candidate-slot search (:mod:`service.graph.slot_store`), slices cut from a model's graph
(:mod:`service.graph.cut_store`), the live service's records
(:mod:`service.graph.live_store`), live workflows (:mod:`service.graph.workflow_store`), the audit log (:mod:`service.graph.audit_store`), governance
(keys, projects, access requests, usage: :mod:`service.graph.governance_store`), experiment
records (:mod:`service.graph.experiment_store`), inspection (:mod:`service.graph.inspection`) and
retention's pages and deletes (:mod:`service.graph.retention_store`).
"""

from __future__ import annotations

from service.graph.audit_store import AuditStore
from service.graph.cluster_store import ClusterStore
from service.graph.cut_store import CutStore
from service.graph.experiment_store import ExperimentStore
from service.graph.governance_store import GovernanceStore
from service.graph.inspection import Inspection
from service.graph.live_store import LiveStore
from service.graph.model_store import ModelStore
from service.graph.retention_store import RetentionStore
from service.graph.slot_store import SlotStore
from service.graph.store import GraphStore
from service.graph.workflow_store import WorkflowStore


class GraphRepository(ModelStore, ClusterStore, SlotStore, CutStore, LiveStore, WorkflowStore, AuditStore,
                      GovernanceStore, ExperimentStore, Inspection, RetentionStore):
    REQUIRED: tuple[str, ...] = (*GraphStore.QUERIES, *ModelStore.QUERIES, *ClusterStore.QUERIES, *SlotStore.QUERIES,
                *CutStore.QUERIES, *LiveStore.QUERIES, *WorkflowStore.QUERIES, *AuditStore.QUERIES, *GovernanceStore.QUERIES,
                *ExperimentStore.QUERIES, *Inspection.QUERIES, *RetentionStore.QUERIES)

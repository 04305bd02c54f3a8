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

from neo4j import Driver

from service.graph.audit_store import AuditStore
from service.graph.catalog import QueryCatalog
from service.graph.cluster_store import ClusterStore
from service.graph.cut_store import CutStore
from service.graph.experiment_store import ExperimentStore
from service.graph.governance_store import GovernanceStore
from service.graph.inspection import Inspection
from service.graph.live_store import LiveStore
from service.graph.model_store import ModelStore
from service.graph.retention_store import RetentionStore
from service.graph.slot_store import SlotStore
from service.graph.store import GraphStore, StorePart
from service.graph.workflow_store import WorkflowStore


class GraphRepository(GraphStore):
    """The plumbing (:class:`GraphStore`: driver, catalog, schema, the write fence) and its parts,
    one attribute each: ``repo.live.create_requests(...)``, ``repo.slots.find_candidate_slots(...)``."""

    PARTS: tuple[type[StorePart], ...] = (ModelStore, ClusterStore, SlotStore, CutStore, LiveStore, WorkflowStore,
                                          AuditStore, GovernanceStore, ExperimentStore, Inspection, RetentionStore)
    REQUIRED: tuple[str, ...] = (*GraphStore.QUERIES, *(q for part in PARTS for q in part.QUERIES))

    def __init__(self, driver: Driver, catalog: QueryCatalog | None = None, *, database: str = "neo4j") -> None:
        super().__init__(driver, catalog, database=database)
        self.models = ModelStore(self)  # tenants, models, their operators and weights
        self.cluster = ClusterStore(self)  # devices, links, device state
        self.slots = SlotStore(self)  # the candidate-slot search and replay's slices
        self.cuts = CutStore(self)  # slices cut from a model's graph
        self.live = LiveStore(self)  # the live service's requests, leases, keys, leadership
        self.workflows = WorkflowStore(self)  # live workflows
        self.audit = AuditStore(self)  # the audit log
        self.governance = GovernanceStore(self)  # keys, projects, access requests, usage
        self.experiments = ExperimentStore(self)  # experiment records
        self.inspection = Inspection(self)  # named read-only queries and ad hoc reads
        self.retention = RetentionStore(self)  # retention's pages and deletes

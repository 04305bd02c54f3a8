"""Candidate slots: the Cypher search over the real GMG answers exactly as the in-memory one.

Each example writes its own cluster (unique name and ids) and tenant (models, weights, slices),
asks both implementations the same queries and compares slots, order included. The tenant's
nodes are deleted afterwards; the cluster's devices stay, scoped by their unique cluster name.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.core.slot import (
    ClusterState,
    DeviceView,
    InputDep,
    LinkView,
    PlacedSlice,
    Placement,
    Slot,
    SlotQuery,
    find_slots_in_memory,
)
from service.domain.cluster import ClusterSpec, Link
from service.domain.error import InvalidInputError
from service.domain.model_config import model_config
from service.domain.opgraph import OperatorGraph
from service.graph.repository import GraphRepository
from service.models.trace import trace_phase

pytestmark = pytest.mark.neo4j

KINDS = ("A100-80GB", "H100-80GB", "L4")
MIB = 1024**2


@cache
def tiny_graphs() -> tuple[OperatorGraph, ...]:
    """Small models whose weights (2-4 MiB) matter on the few-MiB devices drawn below."""
    return (trace_phase(model_config("tiny", n_layers=1), "decode", batch=1, context=8),
            trace_phase(model_config("tiny"), "decode", batch=1, context=8))


def uid() -> str:
    return uuid.uuid4().hex[:10]


@dataclass
class Scenario:
    """A cluster and its runtime state, written to Neo4j and mirrored as a ClusterState."""

    cluster: str
    tenant: str
    hosts: dict[str, list[tuple[str, str, int]]]  # host -> [(device_id, kind, mem_bytes)]
    intra: dict[str, tuple[float, float] | None] = field(default_factory=dict)  # host -> (gbps, latency_us)
    extra_links: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # undirected
    host_links: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # directed
    models: dict[str, tuple[int, str]] = field(default_factory=dict)  # model_id -> (graph index, device)
    slices: list[tuple[str, float, float, int, bool]] = field(default_factory=list)  # device, s, e, bytes, done

    @property
    def device_ids(self) -> list[str]:
        return [d for devs in self.hosts.values() for d, _, _ in devs]

    def spec(self) -> ClusterSpec:
        hosts = []
        for h, devs in self.hosts.items():
            doc: dict[str, Any] = {"host_id": h, "devices": [
                {"device_id": d, "kind": kind, "mem_bytes": mem} for d, kind, mem in devs]}
            if self.intra.get(h):
                gbps, lat = self.intra[h]  # type: ignore[misc]
                doc["intra_link"] = {"gbps": gbps, "latency_us": lat}
            hosts.append(doc)
        links = [{"src": a, "dst": b, "gbps": g, "latency_us": lat} for (a, b), (g, lat) in self.extra_links.items()]
        return ClusterSpec.from_dict({"name": self.cluster, "hosts": hosts, "links": links})

    def write(self, repo: GraphRepository) -> None:
        spec = self.spec()
        repo.cluster.apply_cluster(spec)
        repo.slots.replace_host_links(self.cluster, [Link(a, b, "network", g, lat)
                                               for (a, b), (g, lat) in self.host_links.items()])
        repo.models.upsert_tenant(self.tenant)
        for model_id, (gi, device) in self.models.items():
            repo.models.import_model(self.tenant, model_id, tiny_graphs()[gi], device_id=device, create_tenant=False)
        repo.cluster.refresh_device_state(self.cluster)
        placed = [PlacedSlice(f"{self.tenant}/s{i}", self.tenant, f"{self.tenant}/m0", d, s, e, b)
                  for i, (d, s, e, b, _) in enumerate(self.slices)]
        repo.slots.place_slices(placed)
        done = {p.uid: None for p, (*_, is_done) in zip(placed, self.slices, strict=True) if is_done}
        if done:
            assert repo.slots.mark_slices_done(done) == len(done)

    def state(self) -> ClusterState:
        spec = self.spec()
        devices = {d.device_id: DeviceView(d.device_id, d.host_id, d.kind, d.mem_bytes) for d in spec.devices}
        links = {(x.src, x.dst): LinkView(x.gbps, x.latency_us) for x in spec.links}
        host_links = {k: LinkView(g, lat) for k, (g, lat) in self.host_links.items()}
        placements: dict[str, list[Placement]] = {}
        for d, s, e, b, is_done in self.slices:
            if not is_done:
                placements.setdefault(d, []).append(Placement(s, e, b))
        for ps in placements.values():
            ps.sort(key=lambda p: p.start_s)
        resident: dict[str, dict[str, int]] = {}
        for model_id, (gi, device) in self.models.items():
            resident.setdefault(device, {})[f"{self.tenant}/{model_id}"] = tiny_graphs()[gi].bytes_of("weight")
        return ClusterState(self.cluster, devices, links, host_links, placements, resident)


def assert_same(cypher: list[Slot], memory: list[Slot]) -> None:
    assert [s.device_id for s in cypher] == [s.device_id for s in memory]
    for a, b in zip(cypher, memory, strict=True):
        assert math.isclose(a.start_s, b.start_s, rel_tol=1e-9, abs_tol=1e-9), (a, b)
        assert math.isclose(a.headroom_bytes, b.headroom_bytes, rel_tol=1e-9, abs_tol=1e-9), (a, b)


# ---- the property: Cypher == in memory ---------------------------------------------------------
times = st.integers(0, 20).map(lambda q: q * 0.25)  # a grid, so starts and ends meet exactly
link_numbers = st.tuples(st.sampled_from([8.0, 100.0, 800.0]), st.sampled_from([0.0, 2.0, 50.0]))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Scenario, list[SlotQuery]]:
    cluster, tenant = f"c-{uid()}", f"t-{uid()}"
    hosts: dict[str, list[tuple[str, str, int]]] = {}
    for h in range(draw(st.integers(1, 3))):
        host = f"{cluster}-h{h}"
        hosts[host] = [(f"{host}-d{i}", draw(st.sampled_from(KINDS)), draw(st.integers(4, 24)) * MIB)
                       for i in range(draw(st.integers(1, 3)))]
    sc = Scenario(cluster, tenant, hosts)
    sc.intra = {h: draw(st.none() | link_numbers) for h in hosts}
    ids = sc.device_ids
    for _ in range(draw(st.integers(0, 2))):
        a, b = draw(st.sampled_from(ids)), draw(st.sampled_from(ids))
        if a != b:
            sc.extra_links[(min(a, b), max(a, b))] = draw(link_numbers)
    for a in hosts:
        for b in hosts:
            if a != b and draw(st.booleans()):
                sc.host_links[(a, b)] = draw(link_numbers)
    for m in range(draw(st.integers(0, 2))):
        sc.models[f"m{m}"] = (draw(st.integers(0, 1)), draw(st.sampled_from(ids)))
    for d in ids:
        for _ in range(draw(st.integers(0, 4))):
            start = draw(times)
            sc.slices.append((d, start, start + draw(st.integers(1, 8)) * 0.25, draw(st.integers(0, 4)) * MIB,
                              draw(st.booleans()) and draw(st.booleans())))
    queries = []
    model_uids = [f"{tenant}/m{m}" for m in range(3)]
    for _ in range(draw(st.integers(1, 4))):
        kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=3, unique=True))
        deps = [InputDep(draw(st.sampled_from([*ids, f"{cluster}-nowhere"])) if draw(st.integers(0, 9)) == 0
                         else draw(st.sampled_from(ids)), draw(times), draw(st.integers(0, 4)) * 10**8)
                for _ in range(draw(st.integers(0, 2)))]
        queries.append(SlotQuery(
            cluster=cluster, tenant_id=tenant, model_uid=draw(st.sampled_from(model_uids)), now_s=draw(times),
            duration_s_by_kind={k: draw(st.integers(1, 6)) * 0.25 for k in kinds},
            slice_bytes=draw(st.integers(0, 12)) * MIB, weight_bytes=draw(st.integers(0, 8)) * MIB,
            needs_weights=draw(st.booleans()), input_deps=deps, margin=draw(st.sampled_from([0.0, 0.05, 0.3])),
            k=draw(st.integers(1, 6)),
        ))
    return sc, queries


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=scenarios())
def test_cypher_answers_like_the_in_memory_search(repo: GraphRepository, case: tuple[Scenario, list[SlotQuery]]) -> None:
    sc, queries = case
    try:
        sc.write(repo)
        state = sc.state()
        for q in queries:
            want = find_slots_in_memory(state, q)
            assert_same(repo.slots.find_candidate_slots(q), want)
            # the query sweeps devices in tiers (scan_first, then 3x more, then the rest); small
            # tiers make every tier and its exactness test run on these few devices
            for scan_first in (1, 2):
                assert_same(repo.slots.find_candidate_slots(q, scan_first=scan_first), want)
    finally:
        repo.models.delete_tenant(sc.tenant)


# ---- targeted cases -----------------------------------------------------------------------------
def two_hosts(cluster: str, *, intra: bool = True) -> Scenario:
    """h0: a, b (NVLink 800 Gb/s, 2 us when ``intra``); h1: c. 80 GB devices."""
    sc = Scenario(cluster, f"t-{uid()}", {
        f"{cluster}-h0": [(f"{cluster}-a", "A100-80GB", 80 * 10**9), (f"{cluster}-b", "A100-80GB", 80 * 10**9)],
        f"{cluster}-h1": [(f"{cluster}-c", "H100-80GB", 80 * 10**9)],
    })
    if intra:
        sc.intra[f"{cluster}-h0"] = (800.0, 2.0)
    return sc


def query(sc: Scenario, **kw: Any) -> SlotQuery:
    base: dict[str, Any] = {"cluster": sc.cluster, "tenant_id": sc.tenant, "model_uid": f"{sc.tenant}/m0",
                            "now_s": 0.0, "duration_s_by_kind": {"A100-80GB": 0.5, "H100-80GB": 0.5},
                            "slice_bytes": 10**9, "k": 10}
    return SlotQuery(**{**base, **kw})


def answer(repo: GraphRepository, sc: Scenario, q: SlotQuery) -> list[tuple[str, float]]:
    cypher = repo.slots.find_candidate_slots(q)
    assert_same(cypher, find_slots_in_memory(sc.state(), q))
    return [(s.device_id.rsplit("-", 1)[1], s.start_s) for s in cypher]


def test_a_remote_producer_adds_its_transfer_time(repo: GraphRepository, cluster_name: str) -> None:
    sc = two_hosts(cluster_name)
    sc.host_links[(f"{cluster_name}-h0", f"{cluster_name}-h1")] = (100.0, 5.0)
    sc.write(repo)
    try:
        q = query(sc, input_deps=[InputDep(f"{cluster_name}-a", 1.0, 10**9)])
        assert answer(repo, sc, q) == [
            ("a", 1.0),                                   # same device: no transfer
            ("b", 1.0 + 10**9 / (800e9 / 8) + 2e-6),      # NVLink
            ("c", 1.0 + 10**9 / (100e9 / 8) + 5e-6),      # host network link
        ]
        # A producer that finished long ago costs nothing beyond now.
        late = query(sc, now_s=5.0, input_deps=[InputDep(f"{cluster_name}-a", 1.0, 10**9)])
        assert [t for _, t in answer(repo, sc, late)] == [5.0, 5.0, 5.0]
    finally:
        repo.models.delete_tenant(sc.tenant)


def test_a_window_overlapping_a_placement_is_skipped(repo: GraphRepository, cluster_name: str) -> None:
    sc = two_hosts(cluster_name)
    a = f"{cluster_name}-a"
    sc.slices = [(a, 1.0, 2.0, 10**9, False), (a, 2.5, 4.0, 10**9, False), (a, 0.0, 10.0, 10**9, True)]
    sc.write(repo)
    try:
        only_a = {"A100-80GB": 0.5}
        # [0.5, 1.1) hits [1, 2); [2, 2.6) hits [2.5, 4): the first free window starts at 4.
        assert answer(repo, sc, query(sc, now_s=0.5, duration_s_by_kind={"A100-80GB": 0.6}, k=1)) == [("b", 0.5)]
        q = query(sc, now_s=0.5, duration_s_by_kind={"A100-80GB": 0.6})
        assert answer(repo, sc, q) == [("b", 0.5), ("a", 4.0)]
        # Exactly fitting gaps are used: [0.5, 1.0) and then [2.0, 2.5).
        assert answer(repo, sc, query(sc, now_s=0.5, duration_s_by_kind=only_a)) == [("a", 0.5), ("b", 0.5)]
        assert answer(repo, sc, query(sc, now_s=1.5, duration_s_by_kind=only_a)) == [("b", 1.5), ("a", 2.0)]
        # A done slice no longer blocks, and the retention cleanup removes it.
        assert repo.slots.delete_done_slices(before_s=20.0, chunk=1) >= 1
        assert repo.inspection.run_read("MATCH (s:Slice {tenant_id: $t}) RETURN count(s)", {"t": sc.tenant}).rows[0][0] == 2
        # Deleting the tenant bypasses the slice writes: refreshing the devices frees the windows.
        repo.models.delete_tenant(sc.tenant)
        repo.cluster.refresh_device_state(sc.cluster)
        sc.slices = []
        assert answer(repo, sc, q) == [("a", 0.5), ("b", 0.5)]
    finally:
        repo.models.delete_tenant(sc.tenant)


def test_memory_overflow_excludes_a_device(repo: GraphRepository, cluster_name: str) -> None:
    sc = two_hosts(cluster_name)
    small, big = (g.bytes_of("weight") for g in tiny_graphs())
    sc.hosts[f"{cluster_name}-h0"] = [(f"{cluster_name}-a", "A100-80GB", 20 * MIB),
                                      (f"{cluster_name}-b", "A100-80GB", 20 * MIB)]
    sc.hosts[f"{cluster_name}-h1"] = [(f"{cluster_name}-c", "H100-80GB", 10 * MIB)]
    sc.models = {"m0": (1, f"{cluster_name}-a"), "m1": (0, f"{cluster_name}-b")}  # a holds big, b small
    sc.write(repo)
    try:
        limit = 20 * MIB * (1.0 - 0.1)
        fits_beside_big = int(limit - big) - 1
        q = query(sc, slice_bytes=fits_beside_big, margin=0.1)
        assert {d for d, _ in answer(repo, sc, q)} == {"a", "b"}  # c (10 MiB) is too small
        assert [d for d, _ in answer(repo, sc, query(sc, slice_bytes=fits_beside_big + 2, margin=0.1))] == ["b"]
        # Needing m0's weights: a holds them; b would have to load them beside its own.
        needs = query(sc, slice_bytes=fits_beside_big, margin=0.1, needs_weights=True, weight_bytes=big)
        assert [d for d, _ in answer(repo, sc, needs)] == ["a"]
        assert repo.slots.find_candidate_slots(needs)[0].headroom_bytes == limit - (big + fits_beside_big)
        assert small < big
    finally:
        repo.models.delete_tenant(sc.tenant)


def test_a_missing_link_excludes_a_device(repo: GraphRepository, cluster_name: str) -> None:
    sc = two_hosts(cluster_name, intra=False)
    sc.write(repo)
    try:
        q = query(sc, input_deps=[InputDep(f"{cluster_name}-a", 1.0, 10**6)])
        assert answer(repo, sc, q) == [("a", 1.0)]
        # A network link from h0 reaches c, not b (same host, no device link); h1 -> h0 is not it.
        sc.host_links[(f"{cluster_name}-h1", f"{cluster_name}-h0")] = (100.0, 5.0)
        repo.slots.replace_host_links(cluster_name, [Link(f"{cluster_name}-h1", f"{cluster_name}-h0", "network", 100, 5)])
        assert answer(repo, sc, q) == [("a", 1.0)]
        sc.host_links[(f"{cluster_name}-h0", f"{cluster_name}-h1")] = (100.0, 5.0)
        repo.slots.replace_host_links(cluster_name, [Link(a, b, "network", g, lat) for (a, b), (g, lat) in sc.host_links.items()])
        assert [d for d, _ in answer(repo, sc, q)] == ["a", "c"]
        # An unknown producer device reaches nothing.
        assert answer(repo, sc, query(sc, input_deps=[InputDep(f"{cluster_name}-zz", 0.0, 1)])) == []
    finally:
        repo.models.delete_tenant(sc.tenant)


def test_slice_writes_are_batched_checked_and_dependencies_kept(repo: GraphRepository, cluster_name: str,
                                                                tenant: str) -> None:
    sc = two_hosts(cluster_name)
    sc.tenant = tenant
    sc.write(repo)
    try:
        a, c = f"{cluster_name}-a", f"{cluster_name}-c"
        slices = [PlacedSlice(f"{tenant}/p", tenant, f"{tenant}/m0", a, 0.0, 1.0, 5),
                  PlacedSlice(f"{tenant}/q", tenant, f"{tenant}/m0", c, 1.5, 2.0, 5, (f"{tenant}/p",))]
        assert repo.slots.place_slices(slices, batch=1) == 2
        rows = repo.inspection.run_read("MATCH (s:Slice {tenant_id: $t})-[:DEPENDS_ON]->(p:Slice)-[:ON]->(d:Device) "
                             "RETURN s.uid, p.uid, d.device_id, s.state", {"t": tenant}).rows
        assert rows == [[f"{tenant}/q", f"{tenant}/p", a, "planned"]]
        with pytest.raises(InvalidInputError, match="unknown devices"):
            repo.slots.place_slices([PlacedSlice(f"{tenant}/x", tenant, f"{tenant}/m0", "no-such-gpu", 0.0, 1.0, 1)])
        with pytest.raises(InvalidInputError, match="end_s"):
            repo.slots.place_slices([PlacedSlice(f"{tenant}/y", tenant, f"{tenant}/m0", a, 1.0, 1.0, 1)])
        assert repo.inspection.run_read("MATCH (s:Slice {tenant_id: $t}) RETURN count(s)", {"t": tenant}).rows[0][0] == 2
        assert repo.slots.mark_slices_done({f"{tenant}/p": 0.8}) == 1
        assert repo.slots.delete_done_slices(before_s=0.5) == 0  # ended at 0.8: inside the horizon
        assert repo.slots.delete_done_slices(before_s=0.9) == 1
    finally:
        repo.models.delete_tenant(tenant)

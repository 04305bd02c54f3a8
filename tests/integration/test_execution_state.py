"""Execution state in the GMG (real Neo4j): planned slices are ON their device, COVER their
operators and come AFTER their predecessor; their windows make the device busy for the slot
search until they are done; the device_timeline query shows them in order, scoped per tenant."""

from __future__ import annotations

import random

import pytest

from service.core.slot import PlacedSlice, SlotQuery
from service.domain.cluster import ClusterSpec
from service.domain.error import InvalidInputError
from service.domain.opgraph import OperatorGraph
from service.graph.repository import GraphRepository

pytestmark = pytest.mark.neo4j

GIB = 1 << 30


def chain(n: int) -> OperatorGraph:
    """A decode phase of ``n`` operators in a chain (no tracing: the test stays fast)."""
    tensors = [{"tensor_id": "x0", "kind": "input", "shape": [4], "dtype": "float32"}]
    operators = []
    for i in range(n):
        tensors.append({"tensor_id": f"x{i + 1}", "kind": "activation", "shape": [4], "dtype": "float32"})
        operators.append({"op_id": f"op{i}", "kind": "add", "flops": 4, "inputs": [f"x{i}"], "outputs": [f"x{i + 1}"]})
    return OperatorGraph.from_dict({"model_name": "chain", "phase": "decode", "tensors": tensors, "operators": operators})


def free_start(repo: GraphRepository, cluster: str, tenant: str, device: str, now_s: float) -> float:
    """When the slot search offers ``device`` for a 0.5 s slice not before ``now_s``."""
    q = SlotQuery(cluster, tenant, f"{tenant}/m", now_s, {"A100-80GB": 0.5}, slice_bytes=1, k=8)
    return {s.device_id: s.start_s for s in repo.slots.find_candidate_slots(q)}[device]


def timeline(repo: GraphRepository, device: str, viewer: str | None, since_s: float = 0.0) -> list[list[object]]:
    return repo.inspection.run_named("device_timeline", {"device_id": device, "tenant_id": viewer, "since_s": since_s}).rows


def test_planned_slices_cover_follow_and_show_on_the_device_timeline(repo: GraphRepository, cluster_name: str,
                                                                     tenant: str) -> None:
    other, stranger = f"{tenant}-b", f"{tenant}-c"
    d0, d1 = f"{cluster_name}-d0", f"{cluster_name}-d1"
    repo.cluster.apply_cluster(ClusterSpec.from_dict({"name": cluster_name, "hosts": [{"host_id": f"{cluster_name}-h", "devices": [
        {"device_id": d, "kind": "A100-80GB", "mem_bytes": 80 * GIB} for d in (d0, d1)]}]}))
    graph = chain(12)
    repo.models.import_model(tenant, "m", graph)
    ops = [o.op_id for o in graph.operators]
    m = f"{tenant}/m"
    try:
        first = PlacedSlice(f"{tenant}/s0", tenant, m, d0, 0.0, 1.0, 10, phase="decode", op_ids=tuple(ops[:8]))
        second = PlacedSlice(f"{tenant}/s1", tenant, m, d0, 2.0, 3.0, 10, phase="decode", op_ids=tuple(ops[8:]),
                             after=first.uid)
        guest = PlacedSlice(f"{other}/x", other, f"{other}/m", d0, 1.0, 2.0, 10)
        assert repo.slots.place_slices([first, second, guest], batch=2) == 3

        covered = repo.inspection.run_read("MATCH (s:Slice {tenant_id: $t})-[:COVERS]->(o:Operator) "
                                "RETURN s.uid, collect(o.op_id)", {"t": tenant}).rows
        assert {uid: sorted(o) for uid, o in covered} == {first.uid: sorted(ops[:8]), second.uid: sorted(ops[8:])}
        assert repo.inspection.run_read("MATCH (s:Slice)-[:AFTER]->(p:Slice)-[:ON]->(d:Device) WHERE s.tenant_id = $t "
                             "RETURN s.uid, p.uid, d.device_id", {"t": tenant}).rows == [[second.uid, first.uid, d0]]

        # planned windows [0, 1), [1, 2), [2, 3) on d0: busy until 3; d1 is free now
        assert free_start(repo, cluster_name, tenant, d0, 0.0) == 3.0
        assert free_start(repo, cluster_name, tenant, d1, 0.0) == 0.0
        assert repo.slots.mark_slices_done({second.uid: 2.5}) == 1  # done slices no longer block
        assert free_start(repo, cluster_name, tenant, d0, 0.0) == 2.0

        # a re-placement replaces its COVERS edges and keeps its predecessor
        assert repo.slots.place_slices([PlacedSlice(second.uid, tenant, m, d0, 2.0, 3.0, 10, phase="decode",
                                              op_ids=(ops[8], ops[9]))]) == 1
        assert repo.inspection.run_read("MATCH (s:Slice {uid: $u}) RETURN COUNT { (s)-[:COVERS]->() }, "
                             "COUNT { (s)-[:AFTER]->() }", {"u": second.uid}).rows == [[2, 1]]
        assert free_start(repo, cluster_name, tenant, d0, 0.0) == 3.0  # planned again

        # bad input writes nothing
        for bad, message in ((PlacedSlice(f"{tenant}/y", tenant, m, d1, 0.0, 1.0, 1, phase="decode",
                                          op_ids=("no-such-op",)), "operators"),
                             (PlacedSlice(f"{tenant}/y", tenant, m, d1, 0.0, 1.0, 1, after=f"{tenant}/nope"),
                              "predecessors"),
                             (PlacedSlice(f"{tenant}/y", tenant, m, d1, 0.0, 1.0, 1, op_ids=(ops[0],)), "phase")):
            with pytest.raises(InvalidInputError, match=message):
                repo.slots.place_slices([bad])
        assert repo.inspection.run_read("MATCH (s:Slice {uid: $u}) RETURN s", {"u": f"{tenant}/y"}).rows == []
        assert free_start(repo, cluster_name, tenant, d1, 0.0) == 0.0

        # the timeline by start: all named for the admin; a tenant sees others as anonymous windows
        named = [[first.uid, tenant, m, "planned", 0.0, 1.0, 8], [guest.uid, other, f"{other}/m", "planned", 1.0, 2.0, 0],
                 [second.uid, tenant, m, "planned", 2.0, 3.0, 2]]
        anonymous = [None, None, None, None]
        assert timeline(repo, d0, None) == named
        assert timeline(repo, d0, tenant) == [named[0], [*anonymous, 1.0, 2.0, None], named[2]]
        assert timeline(repo, d0, other) == [[*anonymous, 0.0, 1.0, None], named[1], [*anonymous, 2.0, 3.0, None]]
        assert timeline(repo, d0, stranger) == []  # no slice there: nothing, not even anonymous windows
        assert timeline(repo, d0, None, since_s=1.5) == named[1:]
        assert timeline(repo, d1, None) == []
    finally:
        repo.models.delete_tenant(tenant)
        repo.models.delete_tenant(other)


def test_the_busy_window_cache_follows_any_sequence_of_slice_writes(repo: GraphRepository, cluster_name: str,
                                                                   tenant: str) -> None:
    """The cache is updated incrementally (only the slices a write touched): after random
    placements, moves and ends it equals the windows of the busy slices each device holds."""
    rng = random.Random(7)
    devices = [f"{cluster_name}-d{i}" for i in range(3)]
    repo.cluster.apply_cluster(ClusterSpec.from_dict({"name": cluster_name, "hosts": [{"host_id": f"{cluster_name}-h", "devices": [
        {"device_id": d, "kind": "A100-80GB", "mem_bytes": 80 * GIB} for d in devices]}]}))
    truth = ("MATCH (d:Device {cluster: $c}) OPTIONAL MATCH (s:Slice)-[:ON]->(d) WHERE s.state IN ['planned', 'running'] "
             "WITH d, s ORDER BY s.start_s, s.uid "
             "RETURN d.device_id, collect(CASE WHEN s IS NOT NULL THEN [s.start_s, s.end_s] END), "
             "[i IN range(0, size(coalesce(d.busy_start_s, [])) - 1) | [d.busy_start_s[i], d.busy_end_s[i]]]")
    try:
        for _ in range(12):
            uids = [f"{tenant}/s{rng.randrange(10)}" for _ in range(rng.randrange(1, 5))]
            if rng.random() < 0.6:  # place (or move) some slices
                slices = []
                for uid in dict.fromkeys(uids):
                    start = float(rng.randrange(20))
                    slices.append(PlacedSlice(uid, tenant, f"{tenant}/m", rng.choice(devices), start, start + 1.5, 1))
                repo.slots.place_slices(slices)
            else:  # end some (unknown ones are skipped)
                repo.slots.mark_slices_done(dict.fromkeys(uids, None))
            for device, want, cached in repo.inspection.run_read(truth, {"c": cluster_name}).rows:
                assert cached == want, device
        # The from-scratch recompute (found through the state index, not the devices' history)
        # agrees with the incremental cache.
        assert repo.cluster.refresh_device_state(cluster_name) == len(devices)
        for device, want, cached in repo.inspection.run_read(truth, {"c": cluster_name}).rows:
            assert cached == want, device
    finally:
        repo.models.delete_tenant(tenant)


def test_live_retention_deletes_only_live_slices_ended_before_the_horizon(repo: GraphRepository, cluster_name: str,
                                                                         tenant: str) -> None:
    """``delete_old_live_slices`` seeks ended live slices by end: a running one (no end yet), a
    recent one and a planner's slice stay; the old ones go in chunks, however small."""
    device = f"{cluster_name}-d0"
    repo.cluster.apply_cluster(ClusterSpec.from_dict({"name": cluster_name, "hosts": [{"host_id": f"{cluster_name}-h", "devices": [
        {"device_id": device, "kind": "A100-80GB", "mem_bytes": 80 * GIB}]}]}))
    make = ("UNWIND $rows AS row MATCH (d:Device {device_id: $device}) "
            "CREATE (s:Slice {uid: row.uid, tenant_id: $tenant, state: row.state, live: row.live, start_s: 0.0, "
            "end_s: 1.0, end_wall: row.end_wall})-[:ON]->(d)")
    rows = ([{"uid": f"{tenant}/old{i}", "state": "done", "live": True, "end_wall": 100.0 + i} for i in range(5)]
            + [{"uid": f"{tenant}/recent", "state": "done", "live": True, "end_wall": 1000.0},
               {"uid": f"{tenant}/running", "state": "running", "live": True, "end_wall": None},
               {"uid": f"{tenant}/planner", "state": "done", "live": None, "end_wall": 50.0}])
    try:
        with repo.driver.session() as session:
            session.run(make, rows=rows, device=device, tenant=tenant).consume()
        assert repo.live.delete_old_live_slices(500.0, chunk=2) == 5
        left = repo.inspection.run_read("MATCH (s:Slice {tenant_id: $t}) RETURN s.uid ORDER BY s.uid", {"t": tenant}).rows
        assert [r[0] for r in left] == [f"{tenant}/planner", f"{tenant}/recent", f"{tenant}/running"]
        assert repo.live.delete_old_live_slices(500.0) == 0
    finally:
        repo.models.delete_tenant(tenant)

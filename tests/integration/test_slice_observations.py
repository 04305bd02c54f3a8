"""Slice observations in the GMG (real Neo4j): what an executor measured is written on the
Slice node (a placed one, or a new one ON its device), read back as training rows since a time,
and becomes the samples the cost model is refitted on."""

from __future__ import annotations

from typing import Any

import pytest

from learned.observations import ObservedSlice, observation_samples
from service.cli.cost_model import observations_from_gmg
from service.core.slot import PlacedSlice
from service.domain.cluster import ClusterSpec
from service.graph.connection import Neo4jSettings
from service.graph.repository import GraphRepository
from service.live.retraining import trace_observed

pytestmark = pytest.mark.neo4j

GIB = 1 << 30


def row(uid: str, device: str, start: int, end: int, latency_s: float, wall: float, tenant: str) -> dict[str, object]:
    return {"uid": uid, "tenant_id": tenant, "family": "tiny-llama", "device_id": device, "layer_start": start,
            "layer_end": end, "batch": 1, "tokens": 16, "phase": "prefill", "latency_s": latency_s,
            "observed_wall": wall}


def test_observations_are_written_on_slices_and_read_back_as_training_rows(
        repo: GraphRepository, cluster_name: str, tenant: str, neo4j: Neo4jSettings, driver: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    d0, d1 = f"{cluster_name}-d0", f"{cluster_name}-d1"
    repo.cluster.apply_cluster(ClusterSpec.from_dict({"name": cluster_name, "hosts": [{"host_id": f"{cluster_name}-h", "devices": [
        {"device_id": d0, "kind": "A100-80GB", "mem_bytes": 80 * GIB},
        {"device_id": d1, "kind": "H100-80GB", "mem_bytes": 80 * GIB}]}]}))
    placed = PlacedSlice(f"{tenant}/p0", tenant, f"{tenant}/m", d0, 0.0, 1.0, 10)
    assert repo.slots.place_slices([placed]) == 1
    base = 4.0e9  # epoch seconds far ahead: only this test's rows are at or after it
    rows = [row(placed.uid, d0, 0, 1, 0.002, base + 1, tenant), row(f"{tenant}/n1", d1, 1, 2, 0.003, base + 2, tenant),
            row(f"{tenant}/lost", f"{cluster_name}-nowhere", 0, 1, 0.001, base + 3, tenant)]
    try:
        assert repo.live.record_slice_observations(rows) == 2  # an unknown device records nothing
        got = [ObservedSlice.from_row(r) for r in repo.live.slice_observations(base)]
        assert [(o.uid, o.device_kind, o.layer_start, o.layer_end, o.latency_s) for o in got] == [
            (placed.uid, "A100-80GB", 0, 1, 0.002), (f"{tenant}/n1", "H100-80GB", 1, 2, 0.003)]
        assert [r["uid"] for r in repo.live.slice_observations(base + 1.5)] == [f"{tenant}/n1"]  # --since
        on = repo.inspection.run_read("MATCH (s:Slice {uid: $u})-[:ON]->(d:Device) RETURN d.device_id, s.state",
                           {"u": f"{tenant}/n1"}).rows
        assert on == [[d1, "done"]]  # created ON its device, never busy
        samples = observation_samples(got, trace_observed)
        assert [s.target_ms for s in samples] == pytest.approx([2.0, 3.0])
        assert [s.device.kind for s in samples] == ["A100-80GB", "H100-80GB"]

        # the command's reader, through the service's Neo4j settings
        for name, value in neo4j.env().items():
            monkeypatch.setenv(name, value)
        assert [o.uid for o in observations_from_gmg(base)] == [placed.uid, f"{tenant}/n1"]

        with driver.session() as session:  # an executor that left: its devices go, its rows stay trainable
            session.run("MATCH (d:Device {device_id: $d}) DETACH DELETE d", d=d1).consume()
        assert [(r["uid"], r["device_kind"]) for r in repo.live.slice_observations(base)] == [
            (placed.uid, "A100-80GB"), (f"{tenant}/n1", "H100-80GB")]
    finally:
        with driver.session() as session:  # a server kept between runs keeps no rows of this one
            session.run("MATCH (s:Slice) WHERE s.uid STARTS WITH $t DETACH DELETE s", t=f"{tenant}/").consume()

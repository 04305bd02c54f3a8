"""The Global Mapping Graph on the real Neo4j server: schema, imports, clusters, inspection."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from service.domain.cluster import ClusterSpec
from service.domain.error import InvalidClusterError, InvalidGraphError, InvalidInputError, ReadOnlyViolationError
from service.domain.model_config import model_config
from service.domain.opgraph import OperatorGraph
from service.graph.cluster_store import ClusterStore
from service.graph.connection import Neo4jSettings
from service.graph.repository import GraphRepository
from service.live.view import live_spec
from service.models.trace import trace_phase

pytestmark = pytest.mark.neo4j
ROOT = Path(__file__).resolve().parents[2]


def scalar(repo: GraphRepository, text: str, **params: Any) -> Any:
    return repo.inspection.run_read(text, params).rows[0][0]


def tenant_counts(repo: GraphRepository, tenant: str) -> dict[str, int]:
    rows = repo.inspection.run_read("MATCH (n {tenant_id: $t}) RETURN labels(n)[0] AS label, count(*) AS n", {"t": tenant}).rows
    return {label: n for label, n in rows}


def spec_doc(name: str, prefix: str) -> dict[str, Any]:
    return {"name": name, "hosts": [{"host_id": f"{prefix}-h", "devices": [
        {"device_id": f"{prefix}-d0", "kind": "A100-80GB"}, {"device_id": f"{prefix}-d1", "kind": "A100-80GB"}],
        "intra_link": {"gbps": 2400, "latency_us": 2}}]}


def test_schema_is_idempotent(repo: GraphRepository) -> None:
    before = repo.inspection.run_read("SHOW CONSTRAINTS YIELD name RETURN count(*)").rows[0][0]
    repo.apply_schema()
    repo.apply_schema()
    assert repo.inspection.run_read("SHOW CONSTRAINTS YIELD name RETURN count(*)").rows[0][0] == before >= 8
    names = {r[0] for r in repo.inspection.run_read("SHOW INDEXES YIELD name RETURN name").rows}
    assert {"operator_uid", "operator_model_phase", "tensor_model_kind"} <= names


def test_import_writes_the_whole_graph_and_reimport_replaces_it(repo: GraphRepository, tenant: str) -> None:
    graph = trace_phase(model_config("tiny-llama"), "prefill", batch=2, tokens=32)
    stats = repo.models.import_model(tenant, "m", graph)
    assert stats.operators == len(graph.operators)
    uid = f"{tenant}/m"
    assert scalar(repo, "MATCH (o:Operator {model_uid: $u}) RETURN count(o)", u=uid) == len(graph.operators)
    assert scalar(repo, "MATCH (:Operator {model_uid: $u})-[r:PRECEDES]->() RETURN count(r)", u=uid) == len(graph.edges())
    assert scalar(repo, "MATCH (t:Tensor {model_uid: $u}) RETURN count(t)", u=uid) == len(graph.tensors)
    assert scalar(repo, "MATCH (:Tenant {tenant_id: $t})-[:OWNS]->(m:Model) RETURN m.uid", t=tenant) == uid
    assert scalar(repo, "MATCH (o:Operator {model_uid: $u}) RETURN sum(o.flops)", u=uid) == graph.total_flops
    # The decode phase shares the weights; a re-import of a phase replaces it.
    decode = trace_phase(model_config("tiny-llama"), "decode", batch=2, context=32)
    repo.models.import_model(tenant, "m", decode)
    repo.models.import_model(tenant, "m", graph)
    weights = sum(1 for t in graph.tensors.values() if t.kind == "weight")
    assert scalar(repo, "MATCH (t:Tensor {model_uid: $u, kind: 'weight'}) RETURN count(t)", u=uid) == weights
    assert scalar(repo, "MATCH (o:Operator {model_uid: $u}) RETURN count(o)", u=uid) == \
        len(graph.operators) + len(decode.operators)
    summary = repo.models.model_summary(tenant, "m", "prefill")
    assert summary["operators"] == len(graph.operators) and summary["flops"] == graph.total_flops


def test_a_failure_inside_the_import_writes_nothing(repo: GraphRepository, tenant: str) -> None:
    graph = trace_phase(model_config("tiny"), "prefill", batch=1, tokens=8)
    with pytest.raises(InvalidInputError, match="unknown device 'no-such-gpu'"):
        repo.models.import_model(tenant, "m", graph, device_id="no-such-gpu")
    assert tenant_counts(repo, tenant) == {}


def test_a_bad_graph_is_refused_before_writing(repo: GraphRepository, tenant: str) -> None:
    doc = trace_phase(model_config("tiny"), "prefill", batch=1, tokens=8).to_dict()
    doc["operators"][3]["inputs"].append("a:missing")
    with pytest.raises(InvalidGraphError, match="a:missing"):
        repo.models.import_model(tenant, "m", OperatorGraph.from_dict(doc))
    assert tenant_counts(repo, tenant) == {}


def test_cluster_apply_is_declarative_and_bad_specs_write_nothing(repo: GraphRepository, cluster_name: str) -> None:
    prefix = cluster_name
    repo.cluster.apply_cluster(ClusterSpec.from_dict(spec_doc(cluster_name, prefix)))
    ids = lambda: sorted(r[0] for r in repo.inspection.run_read(  # noqa: E731
        "MATCH (d:Device {cluster: $c}) RETURN d.device_id", {"c": cluster_name}).rows)
    assert ids() == [f"{prefix}-d0", f"{prefix}-d1"]
    assert scalar(repo, "MATCH (:Device {cluster: $c})-[l:LINK]->() RETURN count(l)", c=cluster_name) == 2
    smaller = spec_doc(cluster_name, prefix)
    smaller["hosts"][0]["devices"].pop()
    repo.cluster.apply_cluster(ClusterSpec.from_dict(smaller))
    assert ids() == [f"{prefix}-d0"]
    broken = spec_doc(cluster_name, prefix)
    broken["hosts"][0]["devices"][1]["kind"] = "TPUv9"
    with pytest.raises(InvalidClusterError):
        repo.cluster.apply_cluster(ClusterSpec.from_dict(broken))
    assert ids() == [f"{prefix}-d0"]


def test_cluster_links_are_written_as_a_difference(repo: GraphRepository, cluster_name: str) -> None:
    """Re-applying a live cluster writes only the links that changed (a full rewrite of a large
    mesh stalled every lease write), and links changed behind the store are noticed and repaired."""
    def spec(n: int) -> ClusterSpec:
        s = live_spec([(f"{cluster_name}-g{i}", f"{cluster_name}-e{i // 2}", "cpu", 4 << 30) for i in range(n)])
        return dataclasses.replace(s, name=cluster_name)

    def links() -> set[tuple[str, str, str]]:
        return {(a, b, k) for a, b, k in repo.inspection.run_read(
            "MATCH (a:Device {cluster: $c})-[l:LINK]->(b) RETURN a.device_id, b.device_id, l.kind", {"c": cluster_name}).rows}

    def expected(s: ClusterSpec) -> set[tuple[str, str, str]]:
        return {(x.src, x.dst, x.kind) for x in s.links}

    out = repo.cluster.apply_cluster(spec(3))
    assert out["links"] == out["links_written"] == 6 and links() == expected(spec(3))
    out = repo.cluster.apply_cluster(spec(4))  # a device joins: its 3 links out and 3 in
    assert (out["links_written"], out["links_deleted"]) == (6, 0) and links() == expected(spec(4))
    assert repo.cluster.apply_cluster(spec(4))["links_written"] == 0
    with repo.driver.session(database=repo.database) as s:  # behind the store's back
        s.run("MATCH (:Device {device_id: $d})-[l:LINK]->() WITH l LIMIT 1 DELETE l", d=f"{cluster_name}-g0").consume()
    assert len(links()) == 11
    assert repo.cluster.apply_cluster(spec(4))["links_written"] == 1 and links() == expected(spec(4))
    out = repo.cluster.apply_cluster(spec(2))  # two devices leave and take their links with them
    assert out["links_deleted"] == 0 and links() == expected(spec(2))
    fresh = ClusterStore(repo.cluster.store)  # another process: reads the links back once
    assert fresh.apply_cluster(spec(2))["links_written"] == 0
    changed = dataclasses.replace(spec(2), links=[dataclasses.replace(x, gbps=x.gbps * 2) for x in spec(2).links])
    assert fresh.apply_cluster(changed)["links_written"] == 2
    assert {g for (g,) in repo.inspection.run_read(
        "MATCH (:Device {cluster: $c})-[l:LINK]->() RETURN l.gbps", {"c": cluster_name}).rows} == {changed.links[0].gbps}


def test_weights_placement_and_named_inspection(repo: GraphRepository, tenant: str, cluster_name: str) -> None:
    repo.cluster.apply_cluster(ClusterSpec.from_dict(spec_doc(cluster_name, cluster_name)))
    other = tenant + "-b"
    g = trace_phase(model_config("tiny"), "prefill", batch=1, tokens=16)
    repo.models.import_model(tenant, "chat", g, device_id=f"{cluster_name}-d0")
    repo.models.import_model(other, "bot", trace_phase(model_config("tiny-llama"), "prefill", batch=1, tokens=16),
                      device_id=f"{cluster_name}-d0")
    headroom = {r[0]: r for r in repo.inspection.run_named("devices_headroom").rows}
    d0 = headroom[f"{cluster_name}-d0"]
    assert d0[3] > g.bytes_of("weight") and d0[4] == d0[2] - d0[3] and d0[6] == 2
    shared = {r[0]: sorted(r[1]) for r in repo.inspection.run_named("shared_devices").rows}
    assert shared[f"{cluster_name}-d0"] == sorted([tenant, other])
    heavy = repo.inspection.run_named("heaviest_operators", {"tenant_id": tenant, "model_id": "chat", "limit": 3})
    flops = [r[4] for r in heavy.rows]
    assert len(flops) == 3 and flops == sorted(flops, reverse=True)
    assert flops[0] == max(op.flops for op in g.operators)
    chain = repo.inspection.run_named("dependency_chain", {"tenant_id": tenant, "model_id": "chat", "phase": "prefill",
                                                "op_id": g.operators[8].op_id})
    ancestors = {op for op, _ in _ancestors(g, g.operators[8].op_id)}
    assert {r[1] for r in chain.rows} == ancestors
    repo.models.delete_tenant(other)
    assert tenant_counts(repo, other) == {}


def _ancestors(g: OperatorGraph, op_id: str) -> set[tuple[str, int]]:
    preds: dict[str, list[str]] = {}
    for a, b in g.edges():
        preds.setdefault(b, []).append(a)
    seen: set[str] = set()
    stack = [op_id]
    while stack:
        for p in preds.get(stack.pop(), []):
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return {(s, 0) for s in seen}


@pytest.mark.parametrize("query", [
    "CREATE (n:Intruder {x: 1}) RETURN n",
    "MATCH (d:Device) SET d.mem_bytes = 0 RETURN d",
    "MATCH (n:Tenant) DETACH DELETE n",
    "MERGE (n:Intruder {x: 2}) RETURN n",
])
def test_inspection_is_read_only(repo: GraphRepository, query: str) -> None:
    with pytest.raises(ReadOnlyViolationError, match="read-only"):
        repo.inspection.run_read(query)
    assert scalar(repo, "MATCH (n:Intruder) RETURN count(n)") == 0


def test_inspection_errors_are_clear(repo: GraphRepository) -> None:
    with pytest.raises(InvalidInputError, match="syntax"):
        repo.inspection.run_read("MATCH (n RETURN n")
    with pytest.raises(InvalidInputError, match="not an inspection query"):
        repo.inspection.run_named("upsert_hosts", {"cluster": "x", "rows": []})


def run_cli(neo4j: Neo4jSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **neo4j.env()}
    return subprocess.run([sys.executable, "-m", "service.cli.main", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def test_cli_imports_inspects_and_refuses_bad_input(neo4j: Neo4jSettings, tenant: str, tmp_path: Path) -> None:
    ok = run_cli(neo4j, "model", "import", "tiny", "--tenant", tenant, "--phase", "decode", "--context", "64")
    assert ok.returncode == 0, ok.stderr
    assert f"imported {tenant}/tiny decode" in ok.stdout
    table = run_cli(neo4j, "cypher", "--json", "MATCH (o:Operator {tenant_id: $t}) RETURN count(o) AS n",
                    "--param", f"t={tenant}")
    assert table.returncode == 0 and '"n": 32' in table.stdout
    write = run_cli(neo4j, "cypher", "CREATE (n:Intruder) RETURN n")
    assert write.returncode == 2 and "read-only" in write.stderr and "Traceback" not in write.stderr
    bad = tmp_path / "g.json"
    doc = trace_phase(model_config("tiny"), "prefill", batch=1, tokens=4).to_dict()
    doc["operators"][0]["inputs"].append(doc["operators"][5]["outputs"][0])  # a cycle
    bad.write_text(__import__("json").dumps(doc))
    res = run_cli(neo4j, "model", "import", "--graph", str(bad), "--tenant", tenant + "x")
    assert res.returncode == 2 and "cycle" in res.stderr and "Traceback" not in res.stderr
    res = run_cli(neo4j, "cluster", "apply", str(tmp_path / "missing.yaml"))
    assert res.returncode == 2 and "no cluster spec" in res.stderr
    res = run_cli(neo4j, "model", "import", "gpt5", "--tenant", tenant)
    assert res.returncode == 2 and "unknown model 'gpt5'" in res.stderr


def test_the_compile_backend_leaves_the_graph_in_the_gmg(repo: GraphRepository, tenant: str) -> None:
    import torch

    from service.models.family import build_model, example_inputs
    from service.models.trace import GraphRecorder

    config = model_config("tiny")
    model = build_model(config, seed=1)
    inputs = example_inputs(config, "prefill", batch=1, tokens=8)
    recorder = GraphRecorder(model_name="tiny", phase="prefill", shape={"batch": 1, "tokens": 8},
                             on_graph=lambda g: repo.models.import_model(tenant, "compiled", g))
    with torch.inference_mode():
        got, _ = torch.compile(model, backend=recorder, dynamic=False)(**inputs)
        want, _ = model(**inputs)
    torch._dynamo.reset()
    assert torch.allclose(got, want, atol=1e-6)
    graph = recorder.graphs[-1]
    uid = f"{tenant}/compiled"
    assert scalar(repo, "MATCH (o:Operator {model_uid: $u}) RETURN count(o)", u=uid) == len(graph.operators)
    assert scalar(repo, "MATCH (o:Operator {model_uid: $u}) RETURN sum(o.flops)", u=uid) == graph.total_flops

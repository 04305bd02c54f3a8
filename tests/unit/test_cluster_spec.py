"""Cluster specs: the built-ins and every kind of bad input."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from service.cluster.spec import builtin_names, load_cluster_spec
from service.domain.cluster import GIB, ClusterSpec
from service.domain.error import InvalidClusterError


def test_builtin_specs() -> None:
    assert builtin_names() == ["2x4xH100", "2x8xA100", "8xA100-nvlink", "local-cpu-2", "local-cpu-4"]
    a100 = load_cluster_spec("8xA100-nvlink")
    assert len(a100.devices) == 8 and {d.kind for d in a100.devices} == {"A100-80GB"}
    assert len(a100.links) == 8 * 7  # all-to-all, both directions
    assert a100.link("node0/gpu0", "node0/gpu7").kind == "nvlink"  # type: ignore[union-attr]
    h100 = load_cluster_spec("2x4xH100")
    assert h100.hosts == ["node0", "node1"] and len(h100.devices) == 8
    assert h100.link("node0/gpu1", "node1/gpu2").kind == "network"  # type: ignore[union-attr]
    assert h100.link("node1/gpu0", "node1/gpu3").gbps == 3600  # type: ignore[union-attr]
    assert len(h100.links) == 2 * (2 * 6 + 16)
    local = load_cluster_spec("local-cpu-2")
    assert [d.device_id for d in local.devices] == ["cpu:0", "cpu:1"]
    assert local.devices[0].mem_bytes == 4 * GIB


def base() -> dict[str, Any]:
    return {"name": "t", "hosts": [{"host_id": "h", "devices": [
        {"device_id": "a", "kind": "A100-80GB"}, {"device_id": "b", "kind": "L4", "mem_gib": 20}]}],
        "links": [{"src": "a", "dst": "b", "gbps": 64, "latency_us": 3}]}


def bad(fn: Any) -> dict[str, Any]:
    d = copy.deepcopy(base())
    fn(d)
    return d


def test_explicit_devices_and_links() -> None:
    spec = ClusterSpec.from_dict(base())
    assert spec.device("b").mem_bytes == 20 * GIB
    assert spec.link("b", "a").gbps == 64  # type: ignore[union-attr]


@pytest.mark.parametrize(("doc", "culprit", "message"), [
    (bad(lambda d: d["hosts"][0]["devices"][1].update(kind="TPUv9")), "b", "unknown device kind"),
    (bad(lambda d: d["hosts"][0]["devices"][1].update(device_id="a")), "a", "duplicate device"),
    (bad(lambda d: d["hosts"].append({"host_id": "h", "devices": {"kind": "L4"}})), "h", "duplicate host"),
    (bad(lambda d: d["hosts"][0]["devices"][0].update(mem_bytes=0)), "a", "positive"),
    (bad(lambda d: d["hosts"][0]["devices"][0].update(peak_flops=-5)), "a", "positive"),
    (bad(lambda d: d["links"][0].update(gbps=0)), "link a-b", "positive"),
    (bad(lambda d: d["links"][0].update(dst="z")), "z", "dangling"),
    (bad(lambda d: d["links"][0].update(dst="a")), "a", "itself"),
    (bad(lambda d: d["hosts"][0].update(devices={"kind": "L4", "count": 0})), "h", "positive integer"),
])
def test_bad_specs_name_their_culprit(doc: dict[str, Any], culprit: str, message: str) -> None:
    with pytest.raises(InvalidClusterError, match=message) as err:
        ClusterSpec.from_dict(doc)
    assert err.value.culprit == culprit


def test_spec_files_and_unknown_names(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text('{"name": "mine", "hosts": [{"host_id": "x", "devices": {"kind": "H100-80GB", "count": 2}}]}')
    assert [d.device_id for d in load_cluster_spec(str(path)).devices] == ["x/gpu0", "x/gpu1"]
    with pytest.raises(InvalidClusterError, match="no cluster spec"):
        load_cluster_spec("16xB200")
    (tmp_path / "broken.yaml").write_text("name: [unclosed")
    with pytest.raises(InvalidClusterError, match="not valid YAML"):
        load_cluster_spec(str(tmp_path / "broken.yaml"))

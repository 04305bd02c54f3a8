"""The tail scaler with warm-up modelled: a growing tail is answered a warm-up ahead, replicas
warming up count as capacity on the way, nothing is drained while one warms; and the warm-up
time is the engine start-up plus the weight copy over the link."""

from __future__ import annotations

import pytest

from service.core.tail import CallFeatures, NaivePredictor
from service.sim.tail_routing import TailScaler, TenantReplicas
from service.sim.workflow import ReplicaState


class _Driver:
    """A tenant whose one replica has ``queue`` requests waiting (NaivePredictor: tail ratio 1 + queue)."""

    def __init__(self) -> None:
        self.queue = 0

        class _Cluster:
            def replica_load(self, rid: str) -> int:
                return 0

        self.cluster = _Cluster()

    def probe(self, tenant_id: str) -> CallFeatures:
        return CallFeatures("coder", "m", 7.0, 500, 0, 0, 3, 0.0, 0, 0, 0.0)

    def replica_state(self, rid: str) -> ReplicaState:
        return ReplicaState(self.queue, 0, 0.0, 0)


def _decide(scaler: TailScaler, driver: _Driver, now: float, tenant: TenantReplicas) -> list[str]:
    return [a.kind for a in scaler.decide(now, driver, [tenant], num_free=4)]  # type: ignore[arg-type]


def test_a_growing_tail_is_answered_one_warm_up_ahead() -> None:
    for warmup, expect in ((20.0, ["add"]), (0.0, [])):
        scaler, driver = TailScaler(NaivePredictor(), up=2.0), _Driver()
        tenant = TenantReplicas("t", "m", ("r1",), warming=0, warmup_s=warmup)
        assert _decide(scaler, driver, 0.0, tenant) == []  # ratio 1
        driver.queue = 1  # ratio 2, not above up; growing 0.2 per s: 6 when a replica asked now is ready
        assert _decide(scaler, driver, 5.0, tenant) == expect


def test_replicas_warming_up_count_as_capacity_and_block_a_drain() -> None:
    scaler, driver = TailScaler(NaivePredictor(), up=2.0, down=1.3), _Driver()
    driver.queue = 2  # ratio 3 on one replica: add; with one warming, spread over two: 2, no add
    assert _decide(scaler, driver, 0.0, TenantReplicas("t", "m", ("r1",))) == ["add"]
    assert _decide(TailScaler(NaivePredictor()), driver, 0.0, TenantReplicas("t", "m", ("r1",), warming=1)) == []
    driver.queue = 0  # idle on two replicas: drains one, unless a third is still warming
    assert _decide(TailScaler(NaivePredictor()), driver, 0.0, TenantReplicas("t", "m", ("r1", "r2"))) == ["drain"]
    assert _decide(TailScaler(NaivePredictor()), driver, 0.0,
                   TenantReplicas("t", "m", ("r1", "r2"), warming=1)) == []


def test_warm_up_is_start_up_plus_the_weight_copy_over_the_slowest_link() -> None:
    from learned.roofline import RooflineCostModel
    from service.domain.cluster import ClusterSpec
    from service.domain.model_config import MODEL_CONFIGS
    from service.replay.agentic import AgenticConfig, warmup_s
    from service.sim.iteration import weight_bytes

    spec = ClusterSpec.from_dict({"name": "two", "hosts": [{"host_id": "h", "devices": {"kind": "A100-80GB", "count": 2},
                                                            "intra_link": {"kind": "pcie", "gbps": 256,
                                                                           "latency_us": 5}}]})
    config = AgenticConfig(spec, RooflineCostModel(), startup_s=20.0)
    copy_s = weight_bytes(MODEL_CONFIGS["llama2-13b"]) / (256e9 / 8)
    assert warmup_s(config, "llama2-13b") == pytest.approx(20.0 + copy_s + 5e-6)
    assert 0.5 < copy_s < 1.0  # 26 GB over PCIe 4.0 x16

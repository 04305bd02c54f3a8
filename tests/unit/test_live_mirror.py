"""The live what-if mirror is anchored to the truth: its queues are the live queues.

A mirror that re-simulated the last minute of arrivals would drain a live backlog whenever the
simulator runs faster than the executors (and invent one when it runs slower); then every
what-if predicts no SLA violation and no gain from more room, and the replica policy never
helps the tenant that needs it. The anchored mirror hands over exactly the requests that are
unfinished live, with their true ages.
"""

from __future__ import annotations

from collections import Counter

from learned.roofline import RooflineCostModel
from service.core.scheduler import DeviceInfo, ReplicaChange, ReplicaInfo
from service.domain.request import RequestSpec
from service.live.view import LiveClusterView, LiveSnapshot, live_spec

GIB = 2**30


def _snapshot(*, pending: int, finished: int, window_s: float = 60.0) -> LiveSnapshot:
    spec = live_spec([("exec-a", "exec-a", "cpu", 8 * GIB), ("exec-b", "exec-b", "cpu", 8 * GIB)])
    home = ReplicaInfo("acme/m@exec-a/cpu:0", "acme", "acme/m", "tiny", ("exec-a",), pending, 0, False, False, 0.0)
    devices = (DeviceInfo("exec-a", "exec-a", 7 * GIB, 1.0, (home.replica_id,)),
               DeviceInfo("exec-b", "exec-b", 8 * GIB, 0.0, ()))
    # finished requests arrived first; the backlog arrived over the last 40 s and still waits
    recent = [RequestSpec(f"done{i}", "acme/m", "tiny", i * 0.5, 16, 8, "interactive") for i in range(finished)]
    recent += [RequestSpec(f"wait{i}", "acme/m", "tiny", 20.0 + i * (40.0 / pending), 16, 8, "interactive")
               for i in range(pending)]
    return LiveSnapshot(now_s=100.0, spec=spec, replicas=(home,), devices=devices,
                        max_batch={home.replica_id: 4}, recent=tuple(recent), window_s=window_s,
                        window_start_wall=1e9, iteration_s={"tiny": 0.05}, devices_of={"exec-a": ("exec-a/cpu:0",),
                                                                                      "exec-b": ("exec-b/cpu:0",)},
                        pending=frozenset(f"wait{i}" for i in range(pending)))


def test_the_mirror_holds_the_live_backlog_and_not_the_finished_work() -> None:
    view = LiveClusterView(_snapshot(pending=30, finished=20), cost_model=RooflineCostModel())
    mirror = view._sim.cluster
    assert mirror.now_s == 60.0  # the live clock, though the backlog arrived earlier
    in_flight = Counter(spec.request_id.rstrip("0123456789") for _, spec in mirror.in_flight())
    assert in_flight == {"wait": 30}  # the finished requests are history, not work
    assert len(mirror.arrivals_since(0.0)) == 50  # ...but they count for the load forecast


def test_a_backlog_past_its_ttft_target_is_predicted_late_and_more_room_gains() -> None:
    view = LiveClusterView(_snapshot(pending=30, finished=0), cost_model=RooflineCostModel())
    baseline, changed = view.what_if(ReplicaChange("acme/m", "tiny", ("exec-b",)), 20.0)
    assert baseline.violations_by_tenant.get("acme/m", 0) >= 25  # queued for seconds: TTFT (1 s) missed
    assert changed is not None and changed.output_tokens >= baseline.output_tokens

"""Re-plans of home replicas share the cluster write that follows them (a group commit):
executors registering together cost a few writes of the cluster's shape, not one each."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from service.core.queue import make_queue_policy
from service.live.homes import HomePlanner
from service.live.notify import Signal
from service.live.records import LiveModel
from service.live.state import LiveState


class Cluster:
    def __init__(self, fail: bool = False) -> None:
        self.writes: list[int] = []  # devices in each apply_cluster
        self.fail = fail

    def apply_cluster(self, spec: Any) -> None:
        if self.fail:
            raise RuntimeError("refused")
        self.writes.append(len(spec.devices))

    def set_weight_residences(self, residences: dict[str, list[str]], *, cluster: str) -> None:
        pass


def planner(cluster: Cluster) -> tuple[HomePlanner, LiveState]:
    state = LiveState(make_queue_policy("fifo"), clock=lambda: 0.0, wall=lambda: 0.0, lease_ttl_s=5.0)
    state.add_tenant("a", "standard", 1.0, 0, "h")
    state.add_model(LiveModel("a", "m", "tiny", 1, 1))
    repo: Any = SimpleNamespace(cluster=cluster)

    async def db(fn: Any, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.01)  # a round trip: re-plans that come meanwhile wait for the next write
        return fn(*args, **kwargs)

    nothing = SimpleNamespace(placed=lambda *a, **k: None, record=lambda *a, **k: None)
    return HomePlanner(state, nothing, nothing, Signal(), db, lambda: repo), state  # type: ignore[arg-type]


def test_re_plans_together_share_writes_and_each_waits_for_one_that_covers_it() -> None:
    cluster = Cluster()
    homes, state = planner(cluster)

    async def go() -> None:
        async def join(i: int) -> None:
            state.register_executor(f"e{i}", f"h{i // 8}", [("gpu:0", "cpu", 4 << 30)])
            await homes.replan()
            assert cluster.writes and cluster.writes[-1] >= i + 1  # a write that saw this device

        await asyncio.gather(*(join(i) for i in range(32)))

    asyncio.run(go())
    assert 1 <= len(cluster.writes) <= 3  # 32 re-plans: the first write, then one for all the rest
    assert cluster.writes[-1] == 32
    assert len(state.replicas) == 32


def test_a_failed_cluster_write_reaches_every_re_plan_that_waited_for_it() -> None:
    homes, state = planner(Cluster(fail=True))

    async def go() -> list[BaseException | None]:
        state.register_executor("e0", "h0", [("gpu:0", "cpu", 4 << 30)])
        return list(await asyncio.gather(homes.replan(), homes.replan(), return_exceptions=True))

    outcomes = asyncio.run(go())
    assert all(isinstance(o, RuntimeError) for o in outcomes)
    with pytest.raises(RuntimeError):
        asyncio.run(homes.replan())  # and the next one writes again (and fails again)

"""The scheduled retrain of the what-if's cost model: it waits for enough new observations,
trains off the event loop, swaps the model in at once and records the swap; a failed retrain
keeps the old model; the setting is read from the environment."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from learned.artifact import LoadedCostModel
from learned.roofline import RooflineCostModel
from service.domain.error import InvalidInputError
from service.live.retraining import CostModelRetrainer, Swap
from service.live.settings import ServiceSettings


def observation(i: int, wall: float) -> dict[str, Any]:
    return {"uid": f"s{i}", "family": "tiny-llama", "device_kind": "cpu", "layer_start": 0, "layer_end": 1,
            "batch": 1, "tokens": 8, "phase": "prefill", "latency_s": 0.001, "observed_wall": wall}


class Service:
    """What the retrainer swaps: the model pricing the decisions and its artifact."""

    def __init__(self) -> None:
        self.model: Any = "old"
        self.sha: str | None = "old-sha"
        self.swaps: list[Swap] = []

    def swap(self, loaded: LoadedCostModel, record: Swap) -> None:
        self.model, self.sha = loaded.model, loaded.sha256
        self.swaps.append(record)


async def inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


def retrainer(tmp_path: Path, rows: list[dict[str, Any]], service: Service, *, fail: bool = False,
              trained: list[Path] | None = None) -> CostModelRetrainer:
    def train(path: Path) -> Path:
        if fail:
            raise InvalidInputError("training failed")
        (trained if trained is not None else []).append(path)
        return tmp_path / f"observed-{len(trained or [])}"

    def load(target: Path) -> LoadedCostModel:
        return LoadedCostModel("learned", RooflineCostModel(), target, f"sha-{target.name}")

    return CostModelRetrainer(read=lambda since: list(rows), train=train, load=load, swap=service.swap,
                              files_dir=tmp_path, min_new=3, wall=lambda: 5000.0, run=inline)


def test_a_retrain_waits_for_new_observations_then_swaps_the_model_in(tmp_path: Path) -> None:
    rows = [observation(i, 100.0 + i) for i in range(2)]
    service, trained = Service(), list[Path]()
    r = retrainer(tmp_path, rows, service, trained=trained)
    asyncio.run(r.tick())
    assert trained == [] and service.model == "old"  # 2 new < 3
    rows.append(observation(2, 102.0))
    asyncio.run(r.tick())
    assert len(trained) == 1 and trained[0].read_text().count("\n") == 3  # trained on the observations' file
    assert isinstance(service.model, RooflineCostModel) and service.sha == "sha-observed-1"
    assert service.swaps == r.swaps == [Swap(5000.0, str(tmp_path / "observed-1"), "sha-observed-1", 3)]
    asyncio.run(r.tick())  # nothing new since: no retrain
    assert len(trained) == 1
    rows.extend(observation(i, 200.0 + i) for i in range(3, 6))
    asyncio.run(r.tick())
    assert len(trained) == 2 and service.sha == "sha-observed-2" and len(r.swaps) == 2


def test_a_failed_retrain_keeps_the_old_model(tmp_path: Path) -> None:
    service = Service()
    r = retrainer(tmp_path, [observation(i, 100.0 + i) for i in range(5)], service, fail=True)
    with pytest.raises(InvalidInputError):  # the supervisor logs and counts it, and ticks again later
        asyncio.run(r.tick())
    assert service.model == "old" and service.sha == "old-sha" and r.swaps == [] and r.trained_through == 0.0


def test_the_retrain_schedule_is_a_service_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLICESCHED_STATE", str(tmp_path))
    monkeypatch.setenv("SLICESCHED_ADMIN_KEY", "a" * 32)
    assert ServiceSettings.from_env().cost_model_retrain_s == 0.0  # off unless set
    monkeypatch.setenv("SLICESCHED_COST_MODEL_RETRAIN_S", "600")
    monkeypatch.setenv("SLICESCHED_COST_MODEL_RETRAIN_MIN_NEW", "50")
    s = ServiceSettings.from_env()
    assert (s.cost_model_retrain_s, s.cost_model_retrain_min_new) == (600.0, 50)
    monkeypatch.setenv("SLICESCHED_COST_MODEL_RETRAIN_S", "-1")
    with pytest.raises(InvalidInputError, match="SLICESCHED_COST_MODEL_RETRAIN_S"):
        ServiceSettings.from_env()

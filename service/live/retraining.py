"""The what-if mirror's cost model, retrained from what the executors measured and swapped in live.

:class:`CostModelRetrainer` runs as a supervised loop (``cost-model-retrain``, every
``SLICESCHED_COST_MODEL_RETRAIN_S`` seconds; 0: off). A tick reads the slice observations in the
GMG (:meth:`~service.graph.live_store.LiveStore.slice_observations`); once at least ``min_new``
were observed since the last retrain, it keeps them as a JSON-lines file named by its bytes, refits
the default artifact's GNN on them (:func:`learned.observations.train_observed`, in a worker
thread: the event loop never waits on training), loads the result, and swaps it in with one
assignment on the event loop (:meth:`swap`'s callback): the next scheduler step prices with it,
none is priced by half of each. A tick that fails (Neo4j, training, loading) raises before the
swap: the loop's supervisor logs and counts it and the old model stays. Each swap is recorded
(``swaps``: when, the artifact's sha256, the observations): the audit log's ``cost_model.swapped``
entry, written by the callback, sits in seq order between the placement decisions priced by the
old artifact and those priced by the new one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learned.artifact import LoadedCostModel
from learned.observations import ObservedSlice, observations_file
from service.domain.model_config import ModelConfig
from service.domain.opgraph import OperatorGraph
from service.live import threads

log = logging.getLogger("slicesched.retraining")


@dataclass(frozen=True)
class Swap:
    """One retrained model swapped in (``at``: epoch seconds)."""

    at: float
    artifact: str
    sha256: str | None
    observations: int


class CostModelRetrainer:
    """Retrains on a schedule and swaps the model in (see the module docstring).

    ``read``: the GMG's observation rows since an epoch time; ``train``: an observations file ->
    the trained artifact's folder; ``load``: that folder -> the loaded model; ``swap``: puts a
    loaded model in service (called on the event loop). ``run``: how blocking work leaves the
    event loop (a worker thread; tests run it inline).
    """

    def __init__(self, *, read: Callable[[float], Sequence[Mapping[str, Any]]], train: Callable[[Path], Path],
                 load: Callable[[Path], LoadedCostModel], swap: Callable[[LoadedCostModel, Swap], None],
                 files_dir: Path, min_new: int = 20, wall: Callable[[], float] = time.time,
                 run: Callable[..., Awaitable[Any]] = threads.run) -> None:
        if min_new < 1:
            raise ValueError(f"min_new must be >= 1, got {min_new}")
        self._read, self._train, self._load, self._swap = read, train, load, swap
        self.files_dir = files_dir
        self.min_new = min_new
        self.wall = wall
        self._run = run
        self.trained_through = 0.0  # epoch seconds: the newest observation the current model was trained on
        self.swaps: list[Swap] = []

    async def tick(self) -> None:
        """One scheduled look: retrain and swap when enough new observations arrived."""
        rows = [ObservedSlice.from_row(r) for r in await self._run(self._read, 0.0)]
        new = [r for r in rows if r.observed_wall > self.trained_through]
        if len(new) < self.min_new:
            return
        path = observations_file(rows, self.files_dir)
        log.info("retraining the cost model on %d slice observations (%d new)", len(rows), len(new))
        target = await self._run(self._train, path)
        loaded = await self._run(self._load, target)
        record = Swap(self.wall(), str(target), loaded.sha256, len(rows))
        self._swap(loaded, record)  # on the event loop: one assignment, nothing awaited in between
        self.swaps.append(record)
        self.trained_through = max(r.observed_wall for r in new)
        log.info("cost model swapped: %s (sha256 %s)", target, loaded.sha256)


def trace_observed(config: ModelConfig, phase: str, *, batch: int, tokens: int, context: int) -> OperatorGraph:
    """A model's prefill or decode step traced on the meta device (the observations' graphs:
    :func:`learned.observations.observation_samples`; torch is imported on first use)."""
    from service.models.trace import trace_phase

    return trace_phase(config, phase, batch=batch, tokens=tokens, context=context)

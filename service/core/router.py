"""Predicted-tail routing that does not herd: power-of-d choices over predicted completion,
with the work this router dispatched counted from the moment it dispatches it.

Pure: no I/O, no wall clock; the only randomness is the injected ``numpy.random.Generator``
(which ``d`` candidates are looked at). The same object serves replay
(:mod:`service.sim.tail_routing` wraps it as the cluster's router) and, later, the live
service: it knows replicas only as :class:`Candidate` rows and predictions only as numbers a
callback returns, so it imports nothing of the simulator.

Why the herd happens, and what breaks it. Calls released together (a planner's fan-out, a
burst of arrivals) are routed one after another against nearly the same replica states; a
router that sends each to the replica with the lowest predicted completion sends them all to
the same one whenever the prediction moves less with one more call than the replicas differ
(a learned predictor flat in queue length, or a state snapshot that lags the dispatches, as a
live mirror does). Three things break it:

1. **Power of d choices**: each call looks at ``d`` eligible replicas drawn at random
   (Mitzenmacher's two-choice result: the heaviest load falls from ``log n / log log n`` to
   ``log log n`` above the mean), so simultaneous calls look at different subsets.
2. **Outstanding work counted at dispatch**: a replica's score is its predicted completion of
   the call plus the predicted service seconds of the calls this router sent it that have
   not finished, divided by its batch slots (the work already promised to it, which a stale or
   flat prediction does not show); :meth:`PowerOfDRouter.finished` takes a call's work off.
3. **Ties by load**: equal scores go to the replica with fewer requests in it, then the
   first in the candidates' order.

A replica that cannot admit (``Candidate.can_admit`` false: draining, not ready, or the call
can never fit it) is never chosen; with none eligible :meth:`PowerOfDRouter.choose` raises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from service.domain.error import InvalidInputError

__all__ = ["Candidate", "PowerOfDRouter", "Predict"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A replica a call could go to, as the router sees it."""

    replica_id: str
    load: int  # requests in it now (waiting, prefilling, decoding) as its state shows
    slots: int = 1  # sequences it runs at once (its max_num_seqs): outstanding work spreads over them
    can_admit: bool = True  # false: draining, not ready, or the call never fits it; never chosen


#: Predicted completion of the call on each candidate, seconds from now (any quantile the
#: caller routes by: p99 for tail routing), in the candidates' order.
Predict = Callable[[Sequence[Candidate]], Sequence[float]]


class PowerOfDRouter:
    """See the module docstring. ``d``: candidates looked at per call (0: all of them, the
    plain argmin); ``count_outstanding``: add the dispatched, unfinished work (off: the
    prediction alone, the router that herds)."""

    def __init__(self, rng: np.random.Generator, *, d: int = 2, count_outstanding: bool = True) -> None:
        if d < 0:
            raise InvalidInputError(f"router: d must be >= 0, got {d}")
        self.rng = rng
        self.d = d
        self.count_outstanding = count_outstanding
        self._outstanding_s: dict[str, float] = {}  # replica -> predicted seconds dispatched, unfinished
        self._dispatched: dict[str, tuple[str, float]] = {}  # request -> (replica, its predicted seconds)

    def outstanding_s(self, replica_id: str) -> float:
        """Predicted service seconds this router sent the replica that have not finished."""
        return self._outstanding_s.get(replica_id, 0.0)

    def choose(self, request_id: str, candidates: Sequence[Candidate], predict: Predict,
               service_s: float | Callable[[str], float]) -> str:
        """The replica for ``request_id``, recorded as dispatched there with ``service_s``
        predicted seconds of work (a number, or a function of the chosen replica's id).
        ``InvalidInputError`` when no candidate can admit."""
        eligible = [c for c in candidates if c.can_admit]
        if not eligible:
            raise InvalidInputError(f"request {request_id}: no replica can admit it", culprit=request_id)
        looked = eligible
        if 0 < self.d < len(eligible):
            picks = sorted(self.rng.choice(len(eligible), size=self.d, replace=False).tolist())
            looked = [eligible[i] for i in picks]
        predicted = list(predict(looked))
        if len(predicted) != len(looked):
            raise InvalidInputError(f"router: {len(predicted)} predictions for {len(looked)} candidates")

        def score(i: int) -> tuple[float, int, int]:
            c = looked[i]
            extra = self.outstanding_s(c.replica_id) / max(1, c.slots) if self.count_outstanding else 0.0
            return float(predicted[i]) + extra, c.load, i

        best = looked[min(range(len(looked)), key=score)]
        work = service_s(best.replica_id) if callable(service_s) else service_s
        self._dispatch(request_id, best.replica_id, max(0.0, float(work)))
        return best.replica_id

    def _dispatch(self, request_id: str, replica_id: str, work_s: float) -> None:
        self.finished(request_id)  # a request routed again (requeued) moves its work
        self._dispatched[request_id] = (replica_id, work_s)
        self._outstanding_s[replica_id] = self._outstanding_s.get(replica_id, 0.0) + work_s

    def finished(self, request_id: str) -> None:
        """The request finished or was dropped: its work is off its replica (unknown ids: no-op)."""
        entry = self._dispatched.pop(request_id, None)
        if entry is None:
            return
        replica_id, work_s = entry
        left = self._outstanding_s.get(replica_id, 0.0) - work_s
        if left <= 1e-9:
            self._outstanding_s.pop(replica_id, None)
        else:
            self._outstanding_s[replica_id] = left

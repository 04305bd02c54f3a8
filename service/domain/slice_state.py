"""The states of a ``Slice`` node of the GMG: one vocabulary for the planner, the live lease path
and the candidate-slot search.

A slice is ``planned`` (placed by a planner, not started), then ``running`` (started; a live
lease is running while an executor holds it), then ``done``. A live lease may instead end
``expired``, ``failed`` or ``cancelled``, and restart closes the leases a previous process left
open as ``abandoned``. Only :data:`BUSY_SLICE_STATES` occupy their device: the busy windows cached
on each ``Device`` (``busy_start_s``/``busy_end_s``, read by ``find_candidate_slots``) are the
windows of its slices in those states. The Cypher files name these states as literals;
``tests/unit/test_slice_state.py`` holds them to this module. A request's status (the API's
``queued``/``leased``/...) is a different vocabulary: :class:`service.domain.request.RequestStatus`.

Time base of ``Slice.start_s``/``end_s`` (and so of the busy windows): the time base of the
device's cluster. A planner's cluster uses the planner's seconds; the live cluster uses epoch
seconds (wall clock): a live lease's window starts at its grant and ends at its expected end
until it ends, then at its real end (``start_wall``/``end_wall`` hold the same instants). The
live candidate search translates the mirror's seconds to epoch seconds before it asks
(:meth:`service.live.scheduling.SchedulingLoop.cypher_slots`).
"""

from __future__ import annotations

from enum import StrEnum


class SliceState(StrEnum):
    """A Slice's state; the value is the string the GMG stores."""

    PLANNED = "planned"  # placed by a planner, not started
    RUNNING = "running"  # started: a live lease an executor holds
    DONE = "done"  # ran to its end (the only end of a planned slice)
    EXPIRED = "expired"  # a live lease not renewed in time (or its executor left)
    FAILED = "failed"  # a live lease its executor reported failed
    CANCELLED = "cancelled"  # a live lease whose request was cancelled
    ABANDONED = "abandoned"  # a live lease left open by a previous service process


#: The states whose slices occupy their device (busy windows for the candidate-slot search).
BUSY_SLICE_STATES = (SliceState.PLANNED, SliceState.RUNNING)

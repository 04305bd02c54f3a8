"""Admission: which queued requests a replica takes now. One implementation, used by the
simulator's batcher (:class:`service.sim.replica.Batcher`, every iteration) and by the live
lease book (every executor poll).

The queue policy orders the replica's waiting queue (FIFO, SJF, aging, weighted fair share:
:mod:`service.core.queue`); admission takes from its head while the head fits the replica now
(``fits``: KV blocks and batch budget in the simulator, free batch slots live). It is
head-of-line: when the selected request does not fit, nothing overtakes it, so a policy's
order is never bent by sizes (the starvation bounds of the aging policies hold).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from service.core.queue import WaitingQueue

T = TypeVar("T")


def admit(queue: WaitingQueue[T], served: Mapping[str, float], fits: Callable[[T], bool]) -> Iterator[T]:
    """Yield queued items in the policy's order, removed from the queue, while ``fits(head)``.

    ``fits`` may reserve what the item needs (it returns True once it has); the caller's loop
    body does the rest of the bookkeeping before the next head is chosen, so ``served``
    (fair-share policies) and any budget ``fits`` reads are current at every choice.
    """
    while queue:
        head = queue.peek(served)
        if not fits(head):
            return
        yield queue.pop(served)

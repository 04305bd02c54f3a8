"""Leader election: several ``slicesched serve`` processes on one database, one leading.

With ``SLICESCHED_LEADER_ELECTION=1`` a serve process runs for the leadership before it takes
any traffic. The leadership is a ``(:Leader {name})`` node in Neo4j: its holder, its epoch and
the end of its term on the server's clock (one clock for every contender, whatever the hosts'
clocks say). The holder renews its term every fifth of it (:meth:`Leadership.contend`, the
``acquire_leadership`` query); another takes it once the term has ended unrenewed and stayed
ended for a grace of half a term, with the epoch raised by one (the grace lets a leader that lost
Neo4j for longer than a term, as every contender did, renew before a standby takes over). For the
grace to be enough, an ask is one attempt (no driver retries, whose pauses grow past a second), a
failed renewal is asked again a fifth of a term later, and the serve process runs its asks on a
thread of their own, never queued behind calls waiting out an outage
(:class:`~service.live.service.LiveService`). And when the ended term was first seen more than a
term after its end (nobody could ask: Neo4j was down), the grace is longer by three terms: the
leader's first ask on a restarted, cold server can take seconds. The others stand by: they answer 503 ``not_leader`` and ``/readyz`` 503, so a
Service address routes to the leader, and they ask again every fifth of a term; one that wins
recovers the state from the GMG as a restarted service does and starts taking traffic.

Fencing. The epoch is the fencing token: every write transaction of a leader under election
reads the leadership's holder and epoch at its end, inside the transaction
(:meth:`Leadership.check`, the repository's write fence), and a deposed leader's write, one that
would commit after another process took over, sees another holder or a later epoch and is rolled
back (:class:`~service.domain.error.NotLeaderError`). Besides, a leader stops writing on its own
clock a third of a term before its term can end on the server's (its deadline counts from before
it asked), so a write begun before a takeover can commit after it only if it takes that long;
that window and the commit itself are what the check at the end does not close (Neo4j reads
committed data; a takeover committed between the check's read and the write's commit is not
seen).

A leader that cannot renew (Neo4j down) stops writing at its deadline and keeps asking: the same
holder and epoch renew even after the term ended, as nobody else led in between. One that finds
another holder or epoch has been deposed: it stops its loops and calls ``on_deposed`` (serve
ends the process, so that whatever runs it starts it again as a standby).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from neo4j import ManagedTransaction

from service.domain.error import NotLeaderError

__all__ = ["LEADERSHIP", "Leadership", "Term", "holder_id"]

log = logging.getLogger(__name__)

LEADERSHIP = "slicesched"  # the leadership's name: one per database
RENEW_FRACTION = 0.2  # a leader renews, and a standby asks, every this share of a term
GUARD_FRACTION = 1.0 / 3.0  # a leader stops writing this share of a term before its term can end
GRACE_FRACTION = 0.5  # an ended term stands this share of a term before another contender takes it
OUTAGE_GRACE_TERMS = 3.0  # and this many terms more when nobody saw it end (a Neo4j outage)


class LeaderStore(Protocol):
    def acquire_leadership(self, name: str, holder: str, epoch: int, ttl_ms: int,
                           grace_ms: int = 0, outage_grace_ms: int = 0) -> dict[str, Any]: ...

    def release_leadership(self, name: str, holder: str, epoch: int) -> bool: ...

    def leader_term(self, tx: ManagedTransaction, name: str) -> dict[str, Any] | None: ...


@dataclass(frozen=True, slots=True)
class Term:
    """The leadership as the last call found it."""

    holder: str | None
    epoch: int
    left_s: float  # of its term on the server's clock when read (negative: ended)


def holder_id() -> str:
    """This process's name as a contender: host, pid and a random part (a restarted process on
    the same host and pid is another contender)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Leadership:
    """One process's run for the leadership ``name`` (module doc); the repository's write fence
    while it leads. ``contend`` blocks on one Neo4j round trip (call it in a thread)."""

    def __init__(self, store: LeaderStore, *, ttl_s: float, holder: str | None = None, name: str = LEADERSHIP,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.store, self.ttl_s, self.name, self.clock = store, ttl_s, name, clock
        self.holder = holder or holder_id()
        self.epoch: int | None = None  # the term this process holds (or held until its deadline)
        self.deposed = False  # it held a term and found another holder or epoch
        self.last: Term | None = None
        self._deadline = -math.inf  # monotonic: it writes nothing after this

    @property
    def interval_s(self) -> float:
        """How often a leader renews and a standby asks."""
        return self.ttl_s * RENEW_FRACTION

    @property
    def leads(self) -> bool:
        """It holds a term and its own deadline has not passed."""
        return self.epoch is not None and not self.deposed and self.clock() < self._deadline

    def contend(self) -> bool:
        """Take or renew the leadership: whether this process leads now. A holder that finds
        another holder or epoch is :attr:`deposed` from then on."""
        asked = self.clock()
        row = self.store.acquire_leadership(self.name, self.holder, -1 if self.epoch is None else self.epoch,
                                            round(self.ttl_s * 1000), round(self.ttl_s * GRACE_FRACTION * 1000),
                                            round(self.ttl_s * OUTAGE_GRACE_TERMS * 1000))
        term = self.last = Term(row["holder"], int(row["epoch"]), float(row["left_ms"]) / 1000.0)
        took = self.clock() - asked
        if took > self.interval_s:  # the leader's slow asks are how it loses its term (docs/scaling.md)
            log.warning("a leadership ask took %.1f s (%s; %s holds epoch %d, %.1f s of its term left)", took,
                        "leading" if self.epoch is not None else "standing by", term.holder, term.epoch, term.left_s)
        if term.holder == self.holder and (self.epoch is None or term.epoch == self.epoch):
            if self.epoch is None:
                log.info("leading: %s holds epoch %d", self.holder, term.epoch)
            self.epoch = term.epoch
            self._deadline = asked + self.ttl_s * (1.0 - GUARD_FRACTION)
            return True
        if self.epoch is not None and not self.deposed:
            log.error("deposed: %s held epoch %d; %s now leads at epoch %d", self.holder, self.epoch, term.holder,
                      term.epoch)
            self.deposed = True
        return False

    def release(self) -> None:
        """End the term now (a clean stop): the standby takes over at its next ask."""
        if self.epoch is not None and not self.deposed:
            self.store.release_leadership(self.name, self.holder, self.epoch)
            self._deadline = -math.inf

    def check(self, tx: ManagedTransaction) -> None:
        """The write fence, at the end of each write transaction: refuse it unless this process
        still leads, on its own clock and in the database (module doc)."""
        if not self.leads:
            raise NotLeaderError(self._why(), retry_after_s=self.interval_s)
        term = self.store.leader_term(tx, self.name)
        if term is None or term["holder"] != self.holder or int(term["epoch"]) != self.epoch:
            self.deposed = True
            raise NotLeaderError(f"this serve process no longer leads: the leadership is at epoch "
                                 f"{None if term is None else term['epoch']}, held by another process; "
                                 "nothing was written", retry_after_s=self.interval_s)

    def refusal(self) -> str:
        """Why this process refuses a call now (it does not lead)."""
        return self._why()

    def _why(self) -> str:
        if self.deposed:
            return "this serve process was deposed (another one leads); nothing was written"
        if self.epoch is None:
            return "this serve process is the standby (another one leads); retry at the service's address"
        if self.leads:
            return "this serve process is taking over as leader (recovering the state); retry shortly"
        return "this serve process could not renew its leadership in time (Neo4j unreachable?); nothing was written"

    def describe(self) -> dict[str, Any]:
        """For /readyz and /v1/stats: the role, the epoch, the holder seen last."""
        role = "deposed" if self.deposed else "leader" if self.leads else "standby" if self.epoch is None \
            else "renewing"
        seen = self.last
        return {"role": role, "holder": self.holder, "epoch": self.epoch,
                "leader": None if seen is None else seen.holder, "leader_epoch": None if seen is None else seen.epoch,
                "term_s": self.ttl_s}

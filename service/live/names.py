"""The names the HTTP layer validates against, from the rooms that define them: the SLA classes
(:data:`service.sim.sla.SLA_CLASSES`) and the queue policies
(:data:`service.core.queue.QUEUE_POLICIES`)."""

from __future__ import annotations

from service.core.queue import QUEUE_POLICIES
from service.sim.sla import SLA_CLASSES

SLA_CLASS_NAMES: tuple[str, ...] = tuple(SLA_CLASSES)
QUEUE_POLICY_NAMES: tuple[str, ...] = tuple(QUEUE_POLICIES)

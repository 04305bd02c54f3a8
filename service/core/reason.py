"""Why a placement step did what it did, in fields: a step's :class:`Status` (placed, or nothing
placed and why) and a decision's :class:`DecisionReason` (one per change, with its figures).

Both render to the sentence the logs, the reports and the console show (:meth:`Status.text`,
:meth:`DecisionReason.text`); the fields are what a program reads (:meth:`as_dict`: plain JSON
values). A policy bug is no status: it raises ``InvariantError`` (the API's 500).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

StatusCode = Literal["placed", "static", "no_backlog", "no_candidates", "no_fit_memory", "tenant_worse", "no_gain",
                     "whatif_budget_spent"]
"""What a step's placement came to: ``placed`` a change was chosen; ``static`` the policy places
nothing after the start (``container``); ``no_backlog`` no model wants more room (none has
``min_backlog`` waiting, or each has its most guests); ``no_candidates`` models want room but
the candidate search found no slot for any; ``no_fit_memory`` every candidate judged was
refused for memory (its weights do not fit, or the what-if predicts a memory violation);
``tenant_worse`` no candidate was safe and at least one made a tenant's requests late;
``no_gain`` safe candidates, none doing good by the policy's score; ``whatif_budget_spent`` the
step's what-if wall time ran out before a change was chosen."""

STATUS_CODES: tuple[StatusCode, ...] = ("placed", "static", "no_backlog", "no_candidates", "no_fit_memory",
                                        "tenant_worse", "no_gain", "whatif_budget_spent")


@dataclass(frozen=True, slots=True)
class Status:
    """A step's placement result: ``placed``, or nothing placed and why (:data:`StatusCode`).
    ``tenant``: ``tenant_worse``'s tenant (the one with most added late requests); ``figures``:
    the numbers behind the code (counts of candidates and what-ifs, the late requests added...)."""

    code: StatusCode
    tenant: str | None = None
    figures: Mapping[str, Any] = field(default_factory=dict)

    @property
    def placed(self) -> bool:
        return self.code == "placed"

    def text(self) -> str:
        """The status in a line."""
        f = self.figures
        match self.code:
            case "placed":
                return "placed"
            case "static":
                return "nothing placed: the policy's placement is fixed at the start"
            case "no_backlog":
                return "nothing placed: no model wants more room"
            case "no_candidates":
                return f"nothing placed: no candidate slot for {', '.join(f.get('models', ())) or 'any model'}"
            case "no_fit_memory":
                return f"nothing placed: all {f.get('judged', 0)} candidates judged risk memory"
            case "tenant_worse":
                return (f"nothing placed: no safe candidate; {self.tenant} would have {f.get('late_delta', 0)} "
                        f"more requests late")
            case "no_gain":
                return f"nothing placed: {f.get('safe', 0)} safe candidates, none doing good"
            case "whatif_budget_spent":
                return f"nothing placed: the what-if time ran out with {f.get('skipped', 0)} candidates unjudged"
        return self.code  # pragma: no cover (the match is exhaustive)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "text": self.text()}
        if self.tenant is not None:
            out["tenant"] = self.tenant
        if self.figures:
            out["figures"] = dict(self.figures)
        return out


ReasonCode = Literal["add", "slice", "drain_idle", "drain_owner_pressed", "drain_owner_memory", "whatifs_unjudged",
                     "sliced"]
"""What a decision's line says: ``add`` a whole guest replica; ``slice`` a sliced guest (layers
over devices); ``drain_idle`` a guest idle too long; ``drain_owner_pressed`` a guest leaving for
an owner whose backlog presses (with the drain what-if's figures when confirmed);
``drain_owner_memory`` a guest leaving because a device lacks an owner's KV reserve;
``whatifs_unjudged`` candidates a wall-time cap left unjudged; ``sliced`` where an applied sliced
guest's layers run and in whose idle windows (the live service's line)."""


@dataclass(frozen=True, slots=True)
class DecisionReason:
    """One line of a decision, in fields: what (``code``), for which tenant and model, on which
    devices (or which ``replica``), and the figures behind it (plain JSON values, see each
    code's renderer in :meth:`text`)."""

    code: ReasonCode
    model: str | None = None
    tenant: str | None = None
    devices: tuple[str, ...] = ()
    replica: str | None = None
    figures: Mapping[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        """The line the logs and reports show (the sentence the notes always had)."""
        f = self.figures
        match self.code:
            case "add" | "slice":
                return f"{change_words(self)}: {f['tokens_gain']:+.0f} tokens in {f['horizon_s']:.0f}s, {sla_words(f)}"
            case "drain_idle":
                return f"drain {self.replica}: idle {f['idle_s']:.0f}s"
            case "drain_owner_pressed":
                return f"drain {self.replica}: {pressed_words(f)}"
            case "drain_owner_memory":
                return f"drain {self.replica}: owner {f['owner']} has {f['waiting']} waiting and {f['device']} lacks its KV reserve"
            case "whatifs_unjudged":
                return f"{f['skipped']} plans left unjudged: the step's {f['whatif_wall_s']:g} s of what-ifs ran out"
            case "sliced":
                where = ", ".join(f"layers {s}-{e - 1} on {d}" for d, s, e in f["plan"])
                owners = f["owners"]
                whose = f"in {' and '.join(owners)}'s idle windows" if owners else "on devices no tenant owns"
                mode = "owner priority" if f["yields"] else "taking turns with the owners"
                return f"sliced: {self.model} {where}, {whose} ({mode})"
        return self.code  # pragma: no cover (the match is exhaustive)

    def as_dict(self) -> dict[str, Any]:
        """The reason as plain JSON values with its line (``text``); empty fields left out."""
        out: dict[str, Any] = {"code": self.code}
        for key, value in (("tenant", self.tenant), ("model", self.model), ("replica", self.replica)):
            if value is not None:
                out[key] = value
        if self.devices:
            out["devices"] = list(self.devices)
        out["figures"] = dict(self.figures)
        out["text"] = self.text()
        return out


def change_words(reason: DecisionReason) -> str:
    """The change of an ``add`` or ``slice`` reason in words (``mode_in_words``: say how it shares
    its devices, as the ``slice`` policy does, which judges both modes)."""
    f = reason.figures
    where = ",".join(reason.devices)
    if reason.code == "add":
        if f.get("mode_in_words"):
            return f"add {reason.model} on {where} (whole, turns)"
        return f"add {reason.model} on {where}" + (" ahead of a backlog (its home is busy)" if f.get("ahead") else "")
    head = f"slice {reason.model}: {f['num_slices']} slices of {'/'.join(map(str, f['slice_layers']))} layers on {where}"
    if f.get("mode_in_words"):
        return head + (" (turns)" if f.get("turns") else " (owner priority)")
    return head


def sla_words(f: Mapping[str, Any]) -> str:
    """What a change's what-if predicts for the SLAs: requests late within the horizon without
    and with it (``late_before``, ``late_after``) and late with what follows the horizon
    (``lateness_before``, ``lateness_after``)."""
    pending = ""
    if f["lateness_before"] != f["lateness_after"]:
        pending = f", late with what follows the horizon {f['lateness_before']} -> {f['lateness_after']}"
    if f["late_before"] > f["late_after"]:
        return (f"{f['late_before'] - f['late_after']} fewer requests late ({f['late_before']} -> "
                f"{f['late_after']}){pending}, no tenant worse, no memory at risk")
    return f"no SLA or memory at risk{pending}"


def pressed_words(f: Mapping[str, Any]) -> str:
    """Why an owner's backlog presses (``owner``, ``waiting``, ``slack_share``: the least share of
    a waiting request's TTFT allowance left, None unknown), with the drain what-if's late
    requests with the guest and without it when it confirmed the drain."""
    left = "" if f.get("slack_share") is None else \
        f", one with {max(0.0, f['slack_share']):.0%} of its TTFT allowance left"
    words = f"owner {f['owner']} has {f['waiting']} waiting{left}"
    if "late_with" in f:
        words += f"; the others' requests predicted late {f['late_with']} with it, {f['late_without']} without"
    return words


def share_or_none(share: float) -> float | None:
    """A slack share as a figure: ``None`` when unknown (``-inf``)."""
    return None if math.isinf(share) else share

"""A placement step in three parts: **filter**, **score**, **bind**.

The guest policies (``replica``, ``slice-fixed``, ``slice``) are each one :class:`PlacementSteps`
composed of small parts, as Kubernetes' scheduler framework composes plug-ins:

- **release** (:class:`GuestDrains` with a :class:`DrainRule`): guests that leave now (idle, or
  an owner of one of their devices needs it), each with its :class:`DecisionReason`;
- **gate** (:class:`DeviceGate`): devices no guest may go to this step;
- **filter** (:class:`CandidateFilter`): the candidate changes for the models that want room
  (:class:`Backlog`), from the candidate-slot search (device groups, sliced plans), lazily;
- **score** (:class:`WhatIfJudge`): each candidate judged by the what-if simulator
  (:class:`WhatIfRun` with its :class:`WhatIfReason`), the safe change that does most good chosen
  (:func:`best_by_what_if`), and the step's :class:`Status` when none is;
- **bind** (:class:`AddChosen`): the chosen change into the :class:`Decision` with its reason (the
  cluster view applies the decision: :meth:`ClusterView.apply`).

A step tries its filter-and-score :class:`PlacementStage` s in order and binds the first change chosen
(``replica`` with ``headroom_utilisation`` has a second stage: guests ahead of a backlog). "Nothing
placed" is a :class:`Status` code on the decision, never an exception; a policy bug raises
``InvariantError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Any, NamedTuple, Protocol

from service.core.reason import DecisionReason, ReasonCode, Status, sla_words
from service.core.scheduler import (
    ClusterView,
    Decision,
    ReplicaChange,
    ReplicaInfo,
    WhatIfOutcome,
    WhatIfReason,
    WhatIfRun,
)

Figures = dict[str, Any]
OwnerRule = Callable[[ReplicaInfo, ReplicaInfo, str], "tuple[ReasonCode, Figures] | None"]
"""``(guest, owner, device) -> (code, figures)``: why ``guest`` leaves ``device`` for ``owner`` (None: it stays)."""


# ---- the step's context --------------------------------------------------------------------------
@dataclass(slots=True)
class StepContext:
    """What a step's parts read: the view and its replicas at the step, the decision being made,
    the devices closed to guests, the models wanting room (most waiting first) and their families,
    and the what-if wall-time cap (``out_of_time``; None: no cap)."""

    now_s: float
    state: ClusterView
    replicas: list[ReplicaInfo]
    decision: Decision
    closed: set[str] = field(default_factory=set)
    pressing: list[str] = field(default_factory=list)
    family_of: dict[str, str] = field(default_factory=dict)
    out_of_time: Callable[[], bool] | None = None

    def tenant_of(self, model_uid: str) -> str | None:
        return next((r.tenant_id for r in self.replicas if r.model_uid == model_uid), None)


@dataclass(frozen=True, slots=True)
class Candidates:
    """A filter's answer: the changes to judge, best first (lazy: the slot search runs as the
    judge asks), and the models that wanted room (none: the step has ``no_backlog``)."""

    changes: Iterable[ReplicaChange]
    wanting: tuple[str, ...]


class CandidateFilter(Protocol):
    """The filter: candidate changes from the slot search."""

    def candidates(self, ctx: StepContext) -> Candidates: ...


class DeviceGate(Protocol):
    """Devices no guest goes to this step (may keep state between steps)."""

    def closed(self, now_s: float, replicas: Sequence[ReplicaInfo]) -> set[str]: ...


class DrainRule(Protocol):
    """Why a guest leaves a device of an owner, for this step's context."""

    def for_step(self, ctx: StepContext) -> OwnerRule: ...


# ---- parts shared by every guest policy ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Backlog:
    """The models that want room: at least ``min_backlog`` waiting and fewer than
    ``max_guests_per_tenant`` guests (:func:`pressing_models`)."""

    min_backlog: int = 2
    max_guests_per_tenant: int = 4

    def pressing(self, replicas: Sequence[ReplicaInfo]) -> tuple[list[str], dict[str, str]]:
        return pressing_models(replicas, self.min_backlog, self.max_guests_per_tenant)


@dataclass(frozen=True, slots=True)
class NoClosedDevices:
    """A gate that closes nothing (``slice-fixed``: owner priority keeps owners first)."""

    def closed(self, now_s: float, replicas: Sequence[ReplicaInfo]) -> set[str]:
        return set()


@dataclass(frozen=True, slots=True)
class GuestDrains:
    """The release part: every guest idle for ``idle_drain_s`` leaves, and every guest ``rule``
    names a reason for (:func:`drain_guests`)."""

    idle_drain_s: float
    rule: DrainRule

    def drain(self, ctx: StepContext) -> None:
        drain_guests(ctx.replicas, self.idle_drain_s, ctx.decision, self.rule.for_step(ctx))


@dataclass(frozen=True, slots=True)
class ChainedFilter:
    """Several filters' candidates, one after the other (the ``slice`` policy: whole guests,
    then sliced plans)."""

    filters: tuple[CandidateFilter, ...]

    def candidates(self, ctx: StepContext) -> Candidates:
        parts = [f.candidates(ctx) for f in self.filters]
        return Candidates(chain.from_iterable(p.changes for p in parts),
                          tuple(dict.fromkeys(m for p in parts for m in p.wanting)))


@dataclass(frozen=True, slots=True)
class WhatIfJudge:
    """The score part: each candidate judged by the what-if over ``horizon_s`` (``drain_s`` > 0:
    each run goes on that long without arrivals), ranked by ``score``; ``ahead``: a change need
    only do no harm (a guest ahead of a backlog). See :func:`best_by_what_if`."""

    horizon_s: float
    score: WhatIfScore = field(default_factory=lambda: late_then_tokens)
    drain_s: float = 0.0
    ahead: bool = False

    def judge(self, ctx: StepContext, candidates: Candidates) -> tuple[WhatIfChoice | None, Status]:
        """The change chosen (None: none), and the step's status for it."""
        decision = ctx.decision
        first, skipped_before = len(decision.whatifs), decision.whatifs_skipped
        best = best_by_what_if(ctx.state, candidates.changes, self.horizon_s, decision, ahead=self.ahead,
                               score=self.score, drain_s=self.drain_s, out_of_time=ctx.out_of_time)
        return best, judged_status(candidates.wanting, decision.whatifs[first:],
                                   decision.whatifs_skipped - skipped_before, best)


@dataclass(frozen=True, slots=True)
class PlacementStage:
    """One filter and the judge of its candidates."""

    filter: CandidateFilter
    judge: WhatIfJudge


@dataclass(frozen=True, slots=True)
class AddChosen:
    """The bind part: the chosen change goes into the decision with its :class:`DecisionReason`
    (``mode_in_words``: the line says how the guest shares its devices)."""

    mode_in_words: bool = False

    def bind(self, ctx: StepContext, choice: WhatIfChoice, judge: WhatIfJudge) -> None:
        ctx.decision.add.append(choice.change)
        ctx.decision.reasons.append(change_reason(choice, judge.horizon_s, ctx.tenant_of(choice.change.model_uid),
                                                  ahead=judge.ahead, mode_in_words=self.mode_in_words))


@dataclass(frozen=True, slots=True)
class WhatIfBudget:
    """A step's what-ifs capped at ``wall_s`` wall seconds read from ``clock`` (core reads no
    clock itself)."""

    wall_s: float
    clock: Callable[[], float]


@dataclass
class PlacementSteps:
    """One guest policy's step, composed: release, gate, backlog, stages (filter and score, the
    first change chosen wins), bind. ``name`` is the policy's."""

    name: str
    drains: GuestDrains
    gate: DeviceGate
    backlog: Backlog
    stages: tuple[PlacementStage, ...]
    bind: AddChosen = field(default_factory=AddChosen)
    budget: WhatIfBudget | None = None

    def step(self, now_s: float, state: ClusterView) -> Decision:
        started_s = self.budget.clock() if self.budget is not None else 0.0
        ctx = StepContext(now_s, state, list(state.replicas()), Decision(), out_of_time=self._out_of_time(started_s))
        self.drains.drain(ctx)
        ctx.closed = self.gate.closed(now_s, ctx.replicas)
        ctx.pressing, ctx.family_of = self.backlog.pressing(ctx.replicas)
        status: Status | None = None
        for stage in self.stages:
            best, said = stage.judge.judge(ctx, stage.filter.candidates(ctx))
            if best is not None:
                status = said
                self.bind.bind(ctx, best, stage.judge)
                break
            # The first stage's status, unless it found nothing to judge and a later stage did.
            if status is None or (status.code in ("no_backlog", "no_candidates") and said.figures.get("judged", 0)):
                status = said
        decision = ctx.decision
        decision.status = status if status is not None else Status("no_backlog")
        if decision.whatifs_skipped and self.budget is not None:
            decision.reasons.append(DecisionReason("whatifs_unjudged", figures={
                "skipped": decision.whatifs_skipped, "whatif_wall_s": self.budget.wall_s}))
        return decision

    def _out_of_time(self, started_s: float) -> Callable[[], bool] | None:
        """The wall-time cap as :func:`best_by_what_if` asks it (``None``: no cap)."""
        if self.budget is None:
            return None
        cap, clock = self.budget.wall_s, self.budget.clock
        return lambda: clock() - started_s >= cap


# ---- status ---------------------------------------------------------------------------------------
def judged_status(wanting: Sequence[str], runs: Sequence[WhatIfRun], skipped: int,
                  best: WhatIfChoice | None) -> Status:
    """A stage's :class:`Status` from what it judged: ``placed`` when a change was chosen; else
    ``whatif_budget_spent`` when the cap left candidates unjudged, ``no_backlog`` when no model
    wanted room, ``no_candidates`` when the search found none, ``no_gain`` when some were safe,
    ``tenant_worse`` when one made a tenant worse, else ``no_fit_memory``."""
    counts: dict[str, int] = {}
    for run in runs:
        verdict = run.reason.verdict if run.reason is not None else "unjudged"
        counts[verdict] = counts.get(verdict, 0) + 1
    figures: Figures = {"judged": len(runs), "verdicts": counts}
    if best is not None:
        return Status("placed", figures=figures)
    if skipped:
        return Status("whatif_budget_spent", figures={**figures, "skipped": skipped})
    if not wanting:
        return Status("no_backlog")
    if not runs:
        return Status("no_candidates", figures={"models": list(wanting), "judged": 0})
    if counts.get("no_gain", 0) or counts.get("beaten", 0):
        return Status("no_gain", figures={**figures, "safe": counts.get("no_gain", 0) + counts.get("beaten", 0)})
    worse = [r.reason for r in runs if r.reason is not None and r.reason.verdict == "tenant_worse"]
    if worse:
        top = max(worse, key=lambda r: r.late_delta)
        return Status("tenant_worse", tenant=top.tenant, figures={**figures, "late_delta": top.late_delta})
    return Status("no_fit_memory", figures=figures)


# ---- the release part ----------------------------------------------------------------------------
def drain_guests(replicas: Sequence[ReplicaInfo], idle_drain_s: float, decision: Decision,
                 owner_reason: OwnerRule) -> None:
    """Drain every guest idle for ``idle_drain_s``, and every guest one of whose devices' owners
    (the non-guest replicas of another model there) ``owner_reason(guest, owner, device)`` names a
    reason for; the reason goes into the decision (``drain_idle``, or the rule's code)."""
    owners: dict[str, list[ReplicaInfo]] = {}
    for r in replicas:
        if not r.guest:
            for d in r.device_ids:
                owners.setdefault(d, []).append(r)
    for r in replicas:
        if not r.guest or r.draining:
            continue
        if r.waiting + r.running == 0 and r.idle_s >= idle_drain_s:
            decision.drain.append(r.replica_id)
            decision.reasons.append(DecisionReason("drain_idle", r.model_uid, r.tenant_id, r.device_ids,
                                                   r.replica_id, {"idle_s": r.idle_s}))
            continue
        why = next((why for d in r.device_ids for o in owners.get(d, ()) if o.model_uid != r.model_uid
                    and (why := owner_reason(r, o, d)) is not None), None)
        if why is not None:
            decision.drain.append(r.replica_id)
            decision.reasons.append(DecisionReason(why[0], r.model_uid, r.tenant_id, r.device_ids, r.replica_id, why[1]))


def pressing_models(replicas: Sequence[ReplicaInfo], min_backlog: int, max_guests: int
                    ) -> tuple[list[str], dict[str, str]]:
    """Models with at least ``min_backlog`` waiting requests and fewer than ``max_guests`` guests,
    most waiting first, and each model's family."""
    backlog: dict[str, int] = {}
    family_of: dict[str, str] = {}
    guests: dict[str, int] = {}
    for r in replicas:
        if r.draining:
            continue
        backlog[r.model_uid] = backlog.get(r.model_uid, 0) + r.waiting
        family_of[r.model_uid] = r.family
        guests[r.model_uid] = guests.get(r.model_uid, 0) + int(r.guest)
    pressing = sorted((m for m, n in backlog.items() if n >= min_backlog and guests.get(m, 0) < max_guests),
                      key=lambda m: -backlog[m])
    return pressing, family_of


# ---- the score part ------------------------------------------------------------------------------
WhatIfScore = Callable[[WhatIfOutcome, WhatIfOutcome], tuple[float, float]]
"""``(baseline, changed) -> score``: how much good a safe change does, compared as a tuple (more
is better); a change does good when its score is above ``(0, 0)``."""


def late_then_tokens(baseline: WhatIfOutcome, changed: WhatIfOutcome) -> tuple[float, float]:
    """Requests spared lateness within the horizon, then output tokens gained within it: the
    score of ``replica`` and ``slice-fixed``."""
    return (float(baseline.late - changed.late), float(changed.output_tokens - baseline.output_tokens))


def sustained_then_tokens(baseline: WhatIfOutcome, changed: WhatIfOutcome) -> tuple[float, float]:
    """Sustained lateness spared (:attr:`WhatIfOutcome.sustained_lateness`: the requests late
    within the horizon plus those in flight at its end that end late when the what-if runs on
    without arrivals), then output tokens gained within the horizon: the score of ``slice``
    (whose what-ifs run on for ``lateness_drain_s``; without that run it is
    :func:`late_then_tokens`).

    Why not :func:`late_then_tokens`: plans that spare as many late requests within the horizon
    were ranked by tokens, which favours a plan that admits less and decodes faster and leaves
    a queue behind the horizon that is late soon after it (last session, a100-4tenants seed 7:
    a whole guest, +21 tokens, chosen over a sliced plan, +11; the run ended with 9.3% of
    requests late against 7.0% with the sliced plan), and a plan that spares one late request
    within the horizon over one that leaves none late after it (seed 8 at 0.2x: the plan chosen
    spared 1 within the horizon and left 2 late after it, 3 in all; a coarser cut spared none
    within it and left none after, 2 in all against the baseline's 4)."""
    return (float(baseline.sustained_lateness - changed.sustained_lateness),
            float(changed.output_tokens - baseline.output_tokens))


class WhatIfChoice(NamedTuple):
    """The change :func:`best_by_what_if` chose: its token gain, the requests predicted late
    without and with it, and its score."""

    gain: float
    change: ReplicaChange
    late_before: int
    late_after: int
    score: tuple[float, float] = (0.0, 0.0)
    lateness_before: int = 0  # sustained lateness without and with it
    lateness_after: int = 0

    def sla_note(self) -> str:
        """What the change's what-if predicts for the SLAs, for a decision's line."""
        return sla_words({"late_before": self.late_before, "late_after": self.late_after,
                          "lateness_before": self.lateness_before, "lateness_after": self.lateness_after})


def change_reason(choice: WhatIfChoice, horizon_s: float, tenant: str | None, *, ahead: bool = False,
                  mode_in_words: bool = False) -> DecisionReason:
    """The :class:`DecisionReason` of a chosen change (``add`` a whole guest, ``slice`` a sliced
    one) with the what-if's figures."""
    change = choice.change
    figures: Figures = {"tokens_gain": int(choice.gain), "horizon_s": horizon_s, "late_before": choice.late_before,
                        "late_after": choice.late_after, "lateness_before": choice.lateness_before,
                        "lateness_after": choice.lateness_after, "score": list(choice.score)}
    if ahead:
        figures["ahead"] = True
    if mode_in_words:
        figures["mode_in_words"] = True
    if not change.stages:
        return DecisionReason("add", change.model_uid, tenant, change.device_ids, figures=figures)
    figures.update(num_slices=len(change.stages), slice_layers=sorted({b - a + 1 for _, a, b in change.stages}),
                   turns=change.turns, stages=[list(s) for s in change.stages])
    return DecisionReason("slice", change.model_uid, tenant, change.device_ids, figures=figures)


def describe(change: ReplicaChange) -> str:
    """A change in a line, for a decision's line and a what-if's ``beaten_by``."""
    where = ",".join(change.device_ids)
    if not change.stages:
        return f"add {change.model_uid} on {where} (whole, turns)"
    sizes = sorted({b - a + 1 for _, a, b in change.stages})
    layers = "/".join(str(n) for n in sizes)
    mode = "turns" if change.turns else "owner priority"
    return f"slice {change.model_uid}: {len(change.stages)} slices of {layers} layers on {where} ({mode})"


def unsafe_reason(outcome: WhatIfOutcome, baseline: WhatIfOutcome) -> WhatIfReason | None:
    """Why a change is unsafe (:func:`is_safe`), in fields: ``memory``, or ``tenant_worse`` naming
    the tenant with most added late requests; ``None`` when it is safe."""
    gain = outcome.output_tokens - baseline.output_tokens
    spared = baseline.sustained_lateness - outcome.sustained_lateness
    if outcome.memory_violations > baseline.memory_violations:
        return WhatIfReason("memory", baseline.late, outcome.late, gain, spared)
    worse = {t: n - baseline.violations_by_tenant.get(t, 0) for t, n in outcome.violations_by_tenant.items()}
    tenant, delta = max(sorted(worse.items()), key=lambda kv: kv[1], default=(None, 0))
    if tenant is not None and delta > 0:
        return WhatIfReason("tenant_worse", baseline.late, outcome.late, gain, spared, tenant=tenant, late_delta=delta)
    return None


def best_by_what_if(state: ClusterView, changes: Iterable[ReplicaChange], horizon_s: float,
                    decision: Decision, *, ahead: bool = False, score: WhatIfScore = late_then_tokens,
                    drain_s: float = 0.0, out_of_time: Callable[[], bool] | None = None) -> WhatIfChoice | None:
    """The safe change (:func:`is_safe`) that does most good over ``horizon_s`` by the what-if
    simulator; ``None`` when none does any (``ahead``: a change placed ahead of a backlog need
    do no good over the horizon, only no harm). Good is ``score`` (default
    :func:`late_then_tokens`: SLAs first, then tokens: fewer requests predicted late, or as
    many and more output tokens); the first change with the highest score wins. A change that
    turns late requests of a saturated tenant into timely ones may produce fewer tokens *within
    the horizon* (the idle tenant it shares with serves a burst more slowly: deferred, not
    lost, while within its own SLA), yet it is the one that raises throughput at the SLA.

    ``drain_s`` > 0 asks each what-if to run on that long without arrivals after the horizon
    (what :func:`sustained_then_tokens` scores). Counts the what-ifs it runs and keeps each in
    the decision with its structured reason
    (:class:`WhatIfReason`). ``out_of_time`` (the policy's wall-time cap) is asked before each
    what-if but the first; once it answers True the changes left are counted in
    ``decision.whatifs_skipped`` and not judged."""
    best: WhatIfChoice | None = None
    runs: list[WhatIfRun] = []
    candidates: list[int] = []  # indexes into runs of the safe changes that did good
    iterator: Iterator[ReplicaChange] = iter(changes)
    for change in iterator:
        if runs and out_of_time is not None and out_of_time():
            decision.whatifs_skipped += 1 + sum(1 for _ in iterator)
            break
        baseline, outcome = state.what_if(change, horizon_s, drain_s=drain_s) if drain_s > 0.0 else \
            state.what_if(change, horizon_s)
        decision.num_whatifs += 1
        if outcome is None:
            runs.append(WhatIfRun(change, baseline, outcome, WhatIfReason("no_fit", late_before=baseline.late)))
            continue
        unsafe = unsafe_reason(outcome, baseline)
        if unsafe is not None:
            runs.append(WhatIfRun(change, baseline, outcome, unsafe))
            continue
        value = score(baseline, outcome)
        choice = WhatIfChoice(outcome.output_tokens - baseline.output_tokens, change, baseline.late, outcome.late,
                              value, baseline.sustained_lateness, outcome.sustained_lateness)
        good = value > (0.0, 0.0) or ahead
        reason = WhatIfReason("beaten" if good else "no_gain", late_before=choice.late_before,
                              late_after=choice.late_after, tokens_gain=int(choice.gain),
                              lateness_gain=choice.lateness_before - choice.lateness_after)
        runs.append(WhatIfRun(change, baseline, outcome, reason))
        if good:
            candidates.append(len(runs) - 1)
            if best is None or value > best.score:
                best = choice
    if best is not None:
        chosen = describe(best.change)
        for i in candidates:
            run = runs[i]
            assert run.reason is not None
            if run.change == best.change:
                runs[i] = replace(run, reason=replace(run.reason, verdict="accepted"))
            else:
                runs[i] = replace(run, reason=replace(run.reason, beaten_by=chosen))
    decision.whatifs.extend(runs)
    return best


def is_safe(outcome: WhatIfOutcome, baseline: WhatIfOutcome) -> bool:
    """No memory violation, and no tenant with more (predicted) SLA violations than without."""
    if outcome.memory_violations > baseline.memory_violations:
        return False
    return all(outcome.violations_by_tenant.get(t, 0) <= n for t, n in baseline.violations_by_tenant.items()) and \
        all(t in baseline.violations_by_tenant or n == 0 for t, n in outcome.violations_by_tenant.items())

"""Each device's timeline in a live run, from the GMG: who held it, owner or guest, and when.

:func:`collect_timeline` reads, through the service's API as the admin, every device's live
Slices (the ``device_timeline`` inspection: one Slice per lease, ON each device of the replica
that served it, its window from the grant to the completion, epoch seconds) and each device's
owner (the tenant whose home replica is on it, from ``/v1/stats``). A lease's window is the time
its request held a place in that device's batch, not the device's compute alone: leases of one
replica overlap. The executors' own slice observations (``<lease>/<stage>`` Slices, no model)
are left out: their windows end at the request's completion, not when the slice ran.

:func:`plot_timelines` draws one panel per placement, a lane per device and, within it, a row
per tenant (the owner's first; a guest's hatched), so container, replica and slice placement
show side by side whose work each device carried and when (``live_timeline.png``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


@dataclass(frozen=True)
class Span:
    """One lease on one device: its tenant, its window (epoch seconds) and its end state."""

    tenant: str
    start: float
    end: float
    state: str


@dataclass
class DeviceLane:
    device_id: str
    owner: str | None  # the tenant whose home replica is on the device; None: no home there
    spans: list[Span] = field(default_factory=list)

    def held_s(self, tenants: set[str] | None = None, *, guests: bool = False) -> float:
        """Seconds in which at least one lease (of ``tenants``, or of any tenant but the owner
        with ``guests``) held the device: the union of their windows."""
        chosen = [s for s in self.spans if (tenants is None or s.tenant in tenants)
                  and (not guests or s.tenant != self.owner)]
        return _union_s([(s.start, s.end) for s in chosen])


@dataclass
class DeviceTimeline:
    """A live run's devices, from ``since`` (epoch seconds) to ``until``."""

    since: float
    until: float
    lanes: list[DeviceLane]
    truncated: bool = False  # a device had more Slices than an inspection answer holds

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per device: its owner, the share of the run any lease held it, and the share a
        guest's lease held it (a tenant other than its owner)."""
        span = max(1e-9, self.until - self.since)
        return {lane.device_id: {"owner": lane.owner, "held_share": round(lane.held_s() / span, 4),
                                 "guest_share": round(lane.held_s(guests=True) / span, 4),
                                 "guests": sorted({s.tenant for s in lane.spans if s.tenant != lane.owner}),
                                 "leases": len(lane.spans)}
                for lane in self.lanes}


def _union_s(windows: Sequence[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(windows):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def collect_timeline(client: httpx.Client, since: float, *, headers: Mapping[str, str] | None = None,
                     until: float | None = None) -> DeviceTimeline:
    """Every device's live leases that ended at or after ``since`` (epoch seconds), read through
    the API with ``client`` (the admin's key, in the client or in ``headers``). A lease still
    running ends at ``until`` (default: now)."""
    until = time.time() if until is None else until
    hdrs = dict(headers or {})

    def ok(r: httpx.Response) -> Any:
        if r.status_code >= 400:
            raise RuntimeError(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:200]}")
        return r.json()

    devices = ok(client.get("/v1/devices", headers=hdrs))
    owners: dict[str, str] = {}
    for rep in ok(client.get("/v1/stats", headers=hdrs))["replicas"]:
        if not rep["guest"]:
            for dev in rep["devices"]:
                owners.setdefault(dev, rep["model"].split("/", 1)[0])
    lanes, truncated = [], False
    for dev in sorted(d["device_id"] for d in devices):
        body = {"name": "device_timeline", "params": {"device_id": dev, "since_s": since, "tenant_id": None}}
        table = ok(client.post("/v1/inspect", json=body, headers=hdrs))
        truncated |= bool(table.get("truncated"))
        cols = {c: i for i, c in enumerate(table["columns"])}
        spans = []
        for row in table["rows"]:
            if row[cols["model"]] is None or row[cols["tenant"]] is None:
                continue  # an executor's observation of one stage (module docstring)
            start = max(since, float(row[cols["start_s"]]))
            end = row[cols["end_s"]]
            end = until if end is None or row[cols["state"]] == "running" else min(float(end), until)
            if end > start:
                spans.append(Span(str(row[cols["tenant"]]), start, end, str(row[cols["state"]])))
        lanes.append(DeviceLane(dev, owners.get(dev), spans))
    return DeviceTimeline(since, until, lanes, truncated)


def plot_timelines(path: Path, timelines: Mapping[str, DeviceTimeline]) -> None:
    """One panel per placement (module docstring); time from each run's start."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tenants = sorted({s.tenant for t in timelines.values() for lane in t.lanes for s in lane.spans}
                     | {lane.owner for t in timelines.values() for lane in t.lanes if lane.owner})
    colours = {t: plt.get_cmap("tab10")(i % 10) for i, t in enumerate(tenants)}
    fig, axes = plt.subplots(len(timelines), 1, figsize=(12, 1.2 + 1.1 * max(
        (len(t.lanes) for t in timelines.values()), default=1) * len(timelines)), squeeze=False)
    for ax, (placement, tl) in zip(axes[:, 0], timelines.items(), strict=True):
        ticks, labels = [], []
        for i, lane in enumerate(reversed(tl.lanes)):
            rows = ([lane.owner] if lane.owner else []) + sorted({s.tenant for s in lane.spans} - {lane.owner})
            height = 0.8 / max(1, len(rows))
            for j, tenant in enumerate(rows):
                y = i + 0.4 - (j + 1) * height
                bars = [(s.start - tl.since, s.end - s.start) for s in lane.spans if s.tenant == tenant]
                if bars:
                    ax.broken_barh(bars, (y, height * 0.9), facecolors=colours[tenant], alpha=0.35,
                                   hatch=None if tenant == lane.owner else "///", edgecolor=colours[tenant],
                                   linewidth=0.2)
            share = lane.held_s(guests=True) / max(1e-9, tl.until - tl.since)
            ticks.append(i)
            labels.append(f"{lane.device_id}\nowner {lane.owner or '-'}" + (f", guests {100 * share:.0f}%"
                                                                             if share > 0 else ""))
        ax.set_yticks(ticks, labels, fontsize=7)
        ax.set_xlim(0, tl.until - tl.since)
        ax.set_title(f"{placement}: leases per device (hatched: a guest's, in a device another tenant owns)",
                     fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("seconds from the first arrival")
    fig.legend(handles=[Patch(facecolor=colours[t], alpha=0.5, label=t) for t in tenants], loc="upper right",
               fontsize=8, ncol=len(tenants))
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)

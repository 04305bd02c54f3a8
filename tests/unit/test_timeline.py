"""Device timelines of live runs (service.harness.timeline): the held and guest-held shares are
unions of lease windows, and the plot draws every placement."""

from __future__ import annotations

from pathlib import Path

from service.harness.timeline import DeviceLane, DeviceTimeline, Span, _union_s, plot_timelines


def test_union_counts_overlapping_windows_once() -> None:
    assert _union_s([]) == 0.0
    assert _union_s([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == 4.0
    assert _union_s([(1.0, 4.0), (2.0, 3.0)]) == 3.0  # nested


def test_shares_separate_the_owner_from_its_guests() -> None:
    lane = DeviceLane("e/cpu:1", "initech", [Span("initech", 0.0, 4.0, "done"), Span("acme", 2.0, 6.0, "done"),
                                             Span("acme", 3.0, 5.0, "done"), Span("globex", 8.0, 9.0, "done")])
    assert lane.held_s() == 7.0
    assert lane.held_s(guests=True) == 5.0  # acme 2-6 and globex 8-9
    assert lane.held_s({"acme"}) == 4.0
    tl = DeviceTimeline(0.0, 10.0, [lane, DeviceLane("e/cpu:0", None)])
    summary = tl.summary()
    assert summary["e/cpu:1"] == {"owner": "initech", "held_share": 0.7, "guest_share": 0.5,
                                  "guests": ["acme", "globex"], "leases": 4}
    assert summary["e/cpu:0"] == {"owner": None, "held_share": 0.0, "guest_share": 0.0, "guests": [], "leases": 0}


def test_plot_draws_one_panel_per_placement(tmp_path: Path) -> None:
    lane = DeviceLane("e/cpu:0", "acme", [Span("acme", 1.0, 3.0, "done"), Span("globex", 2.0, 4.0, "running")])
    out = tmp_path / "timeline.png"
    plot_timelines(out, {"container": DeviceTimeline(0.0, 5.0, [lane]),
                         "slice": DeviceTimeline(10.0, 15.0, [DeviceLane("e/cpu:0", "acme")])})
    assert out.stat().st_size > 10_000

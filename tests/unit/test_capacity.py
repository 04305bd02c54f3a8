"""Sizing the live demo's load from a measured capacity (the probe itself runs in the demo and
the live_e2e benchmark; what is checked here is the arithmetic and the workload it produces)."""

from __future__ import annotations

import http.server
import json
import os
import threading
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from service.domain.error import InvalidInputError
from service.harness.capacity import (
    BURSTY_IDLE_SHARE,
    LIGHT_FLOOR,
    ROLES,
    SLA_SHARE,
    SPEED_DRIFT,
    Background,
    ProbeLevel,
    TenantCapacity,
    _probe_level,
    calibrated_loads,
    container_weights,
    fit_to_machine,
    load_scale,
    machine_busy,
    machine_speed,
    speed_drift,
)
from service.harness.live_run import DEMO_TENANTS, demo_workload, offered_work
from service.workload.synthetic import TenantLoad, synthetic_workload


def _capacity(tenant: str, rate: float) -> TenantCapacity:
    level = ProbeLevel(1, 10, rate, rate * 30, 0.2, 0.02, 1.0)
    return TenantCapacity(tenant, "tiny", "standard", [level], rate, True)


def test_each_tenant_is_offered_its_roles_multiple_of_its_own_capacity() -> None:
    capacity = {"acme": _capacity("acme", 2.0), "globex": _capacity("globex", 10.0), "initech": _capacity("initech", 4.0)}
    offered = {t.tenant_id: t for t in calibrated_loads(DEMO_TENANTS, capacity, 60.0)}
    for tenant, (_, multiple) in ROLES.items():
        assert offered[tenant].rate_rps == pytest.approx(multiple * capacity[tenant].requests_per_s)
    assert ROLES["acme"][1] > 1.0  # the busy tenant is offered more than its own devices serve
    assert offered["initech"].start_s == pytest.approx(BURSTY_IDLE_SHARE * 60.0)
    assert offered["initech"].burstiness_cv > 1.0 and offered["globex"].burstiness_cv < 1.0
    # lengths and models stay the demo's
    for base in DEMO_TENANTS:
        assert offered[base.tenant_id].model == base.model
        assert offered[base.tenant_id].output_median_tokens == base.output_median_tokens


def test_a_faster_machine_gets_a_proportionally_heavier_workload() -> None:
    slow = {t.tenant_id: _capacity(t.tenant_id, 1.0) for t in DEMO_TENANTS}
    fast = {t.tenant_id: _capacity(t.tenant_id, 3.0) for t in DEMO_TENANTS}
    n_slow = demo_workload(0, 120.0, calibrated_loads(DEMO_TENANTS, slow, 120.0)).num_requests
    n_fast = demo_workload(0, 120.0, calibrated_loads(DEMO_TENANTS, fast, 120.0)).num_requests
    assert 2.3 < n_fast / n_slow < 3.7


def test_an_idle_tenant_arrives_only_after_its_start() -> None:
    load = TenantLoad("late", "tiny", 5.0, start_s=40.0)
    arrivals = [r.arrival_s for r in synthetic_workload(np.random.default_rng(1), tenants=[load], duration_s=100.0).requests]
    assert arrivals and min(arrivals) >= 40.0 and max(arrivals) < 100.0
    assert 0.6 * 300 < len(arrivals) < 1.4 * 300  # its rate holds over the 60 s it is awake
    with pytest.raises(InvalidInputError, match="start_s"):
        TenantLoad("bad", "tiny", 1.0, start_s=-1.0)


def test_the_machine_reading_has_its_fields() -> None:
    m = machine_busy(sample_s=0.2)
    assert m["cores"] >= 1 and m["load_avg_1m"] >= 0.0
    assert m["busy_share"] is None or 0.0 <= m["busy_share"] <= 1.0
    assert isinstance(m["busy"], bool)
    assert 0.5 < SLA_SHARE <= 1.0


def test_a_run_is_paced_by_the_machines_speed_only_past_the_drift_the_measure_spreads_by() -> None:
    assert load_scale(100.0, 100.0 * (1 + SPEED_DRIFT)) == 1.0  # within the measure's spread: as calibrated
    assert load_scale(100.0, 100.0 * (1 - SPEED_DRIFT)) == 1.0
    assert load_scale(100.0, 50.0) == pytest.approx(0.5)  # half as fast: half the arrival rate
    assert load_scale(100.0, 140.0) == pytest.approx(1.4)
    assert load_scale(None, 50.0) == 1.0 and load_scale(100.0, None) == 1.0 and load_scale(0.0, 50.0) == 1.0


def test_the_machine_speed_is_a_positive_rate_and_its_drift_a_share_of_the_probes() -> None:
    speed = machine_speed(rounds=3, round_s=0.02)
    assert speed > 0.0
    assert speed_drift(100.0, 75.0) == pytest.approx(-0.25)
    assert speed_drift(100.0, 150.0) == pytest.approx(0.5)
    assert speed_drift(None, 75.0) is None and speed_drift(0.0, 75.0) is None and speed_drift(100.0, None) is None


class _InstantService(http.server.BaseHTTPRequestHandler):
    """Answers the probe's two calls: every request is done at once with two tokens."""

    posted: ClassVar[list[dict[str, object]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).posted.append(body)
        self._json({"request_id": f"r{len(type(self).posted)}"})

    def do_GET(self) -> None:
        self._json({"status": "done", "ttft_s": 0.01, "e2e_s": 0.02, "output_tokens": [1, 2]})

    def _json(self, obj: object) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def _instant_level(concurrency: int, rounds: int = 1) -> ProbeLevel:
    """A probe level of no duration against :class:`_InstantService` (its posts recorded afresh),
    with a tenant whose requests are 5 prompt tokens and 2 output tokens."""
    _InstantService.posted = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _InstantService)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        load = TenantLoad("acme", "tiny", 1.0, "interactive", prompt_median_tokens=5, prompt_sigma=0.0,
                          output_median_tokens=2, output_sigma=0.0)
        return _probe_level(f"http://127.0.0.1:{server.server_port}", "k", load, concurrency, 0.0, rounds)
    finally:
        server.shutdown()


def test_a_zero_length_probe_level_still_sends_one_request() -> None:
    """The probe's warm-up is a level of no duration: it must still send (and wait for) one
    request, or the first measured level pays the model's load and warm-up."""
    level = _instant_level(1)
    assert level.requests == 1 and len(_InstantService.posted) == 1
    assert len(_InstantService.posted[0]["prompt_tokens"]) == 5  # type: ignore[arg-type]
    assert level.sla_met_share == 1.0
    # The rate is the service's by Little's law (one in flight over its 20 ms end to end), not the
    # client's loop, which spends most of its time here polling and parsing.
    assert level.requests_per_s == pytest.approx(50.0) and level.tokens_per_s == pytest.approx(100.0)


def test_a_probe_level_reads_how_many_of_the_machines_cores_were_busy() -> None:
    level = _instant_level(2, rounds=3)
    if not Path("/proc/stat").exists():
        assert level.cores_busy is None
        return
    assert level.cores_busy is not None and 0.0 <= level.cores_busy <= (os.cpu_count() or 1)


def test_a_probe_level_lasts_its_rounds_of_requests_however_short_its_seconds() -> None:
    """A level of two seconds saw two rounds of acme's requests (8 at concurrency 4) and read
    2.5-3.3 req/s across probes: a level also waits for its rounds, counted over all its clients."""
    level = _instant_level(3, rounds=5)
    assert level.requests == len(_InstantService.posted)
    assert 15 <= level.requests <= 15 + 3  # the rounds, and at most one more request per client in flight


def test_calibrated_loads_offer_exactly_their_rates_count_whatever_the_seed() -> None:
    capacity = {"acme": _capacity("acme", 2.0), "globex": _capacity("globex", 10.0), "initech": _capacity("initech", 4.0)}
    loads = calibrated_loads(DEMO_TENANTS, capacity, 60.0)
    expected = {t.tenant_id: round(t.rate_rps * (60.0 - t.start_s)) for t in loads}
    for seed in range(4):
        w = demo_workload(seed, 60.0, loads)
        counts = {t: sum(r.tenant_id == t for r in w.requests) for t in expected}
        assert counts == expected
        arrivals = [r.arrival_s for r in w.requests if r.tenant_id == "initech"]
        assert min(arrivals) >= BURSTY_IDLE_SHARE * 60.0 and max(arrivals) < 60.0
    # ... and they are still bursty: the gaps' CV is near the role's, not regular.
    gaps = np.diff(sorted(r.arrival_s for r in demo_workload(0, 600.0, loads).requests if r.tenant_id == "acme"))
    assert 1.5 < gaps.std() / gaps.mean() < 2.5


def test_the_mean_length_of_a_clamped_lognormal() -> None:
    from service.workload.synthetic import lognormal_mean_tokens

    rng = np.random.default_rng(0)
    for median, sigma, cap in ((32.0, 0.5, 128), (64.0, 1.0, 100), (10.0, 0.0, 5)):
        draws = np.clip(median * np.exp(sigma * rng.standard_normal(400_000)), None, cap)
        assert lognormal_mean_tokens(median, sigma, cap) == pytest.approx(draws.mean(), rel=0.01)


def test_the_background_load_posts_open_arrivals_at_its_rate_and_reports_failures() -> None:
    """The saturated tenant is probed beside the others' offered loads: open Poisson arrivals of
    each one's mean shape, posted without waiting for them, stopped with the block."""
    import time

    _InstantService.posted = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _InstantService)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    loads = [TenantLoad("globex", "tiny", 1.0, prompt_median_tokens=7, prompt_sigma=0.0, output_median_tokens=3,
                        output_sigma=0.0), TenantLoad("idle", "tiny", 1.0)]
    try:
        with Background(url, {"globex": "k", "idle": "k2"}, loads, {"globex": 40.0}) as bg:
            time.sleep(1.0)
    finally:
        server.shutdown()
    n = len(_InstantService.posted)
    assert bg.posted == {"globex": n} and 20 <= n <= 70  # 40/s for a second; no rate, no load
    assert all(b["prompt_tokens"] == list(range(32, 39)) and b["max_tokens"] == 3 for b in _InstantService.posted)
    with pytest.raises(RuntimeError, match="background load failed: globex"), \
            Background("http://127.0.0.1:9", {"globex": "k"}, loads, {"globex": 50.0}):
        time.sleep(0.5)


def test_the_probe_sizes_container_homes_as_the_comparison_does() -> None:
    capacity = {t.tenant_id: _capacity(t.tenant_id, 2.0) for t in DEMO_TENANTS}
    offered = calibrated_loads(DEMO_TENANTS, capacity, 60.0)
    record = {"duration_s": 60.0, "offered": {o.tenant_id: {"multiple_of_capacity": ROLES[o.tenant_id][1],
                                                            "start_s": o.start_s} for o in offered}}
    assert container_weights(DEMO_TENANTS) == pytest.approx(offered_work(record))


def _cpu_s(pid: int) -> float:
    """The CPU seconds a process has used (user + system), from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.subprocess
def test_the_cpu_meter_counts_the_cores_each_part_of_the_stack_kept_busy() -> None:
    """The meter's reading of a spinning process is the CPU time it used over the interval (read
    independently here), whatever share of a core other work on the machine left it; this
    process, waiting, reads about none; a part whose process is gone is left out; the machine's
    total is at least the spinner's."""
    import subprocess
    import sys
    import time

    from service.harness.live_run import CpuMeter

    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 5: pass"])
    try:
        time.sleep(0.3)  # past its start-up
        meter = CpuMeter({"spinner": spin.pid, "gone": 2**22 + 7})
        used_s, t0 = _cpu_s(spin.pid), time.monotonic()
        meter.start()
        time.sleep(1.0)
        cores = meter.stop()
        used_s, elapsed_s = _cpu_s(spin.pid) - used_s, time.monotonic() - t0
    finally:
        spin.kill()
        spin.wait()
    assert "gone" not in cores and cores["this process (clients)"] < 0.3
    assert used_s > 0
    assert cores["spinner"] == pytest.approx(used_s / elapsed_s, abs=0.1)
    assert cores["machine"] >= cores["spinner"] - 0.1


def test_a_comparison_offers_both_placements_its_first_runs_pace(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """The speed is read before each run, but the pace is set once: the placements side by side
    are offered the same rates, whatever the second reading says."""
    import service.harness.live_run as live_run

    calls = []

    def run(placement: str, workload: object, *, probe_speed: float | None = None, pace: float | None = None,
            **_: object) -> live_run.LiveRunResult:
        calls.append((placement, probe_speed, pace))
        speed = 2000.0 if placement == "container" else 1100.0  # the second reading alone would not pace
        scale = pace if pace is not None else load_scale(probe_speed, speed)
        return live_run.LiveRunResult(placement, 1.0, 10, 10.0, 0.0, [], {"p50": 0.0, "p99": 0.0}, {},
                                      machine_speed=speed, load_scale=scale)

    monkeypatch.setattr(live_run, "run_live", run)
    monkeypatch.setattr(live_run, "plot_live", lambda *_: None)
    calibration = {"machine": {"speed": 1000.0}, "duration_s": 5.0,
                   "offered": {"acme": {"multiple_of_capacity": 1.2, "start_s": 0.0}}}
    record = live_run.compare_placements(demo_workload(0, 5.0), tmp_path, calibration=calibration)
    assert calls == [("container", 1000.0, None), ("replica", 1000.0, 2.0)]
    assert {p: r["load_scale"] for p, r in record["runs"].items()} == {"container": 2.0, "replica": 2.0}
    assert record["runs"]["replica"]["machine_speed"] == 1100.0  # still read and recorded


def _probed(rate: float, cores: float | None, background: dict[str, float] | None = None,
            idle: float | None = None, beside: float | None = None) -> TenantCapacity:
    level = ProbeLevel(4, 24, rate, rate * 30, 0.2, 0.02, 1.0, cores)
    return TenantCapacity("t", "tiny", "standard", [level], rate, True, background or {}, idle, beside)


def _mix(acme_cores: float | None, idle: float | None = 0.1, beside: float | None = 0.7) -> dict[str, TenantCapacity]:
    return {"globex": _probed(10.0, 1.0, idle=idle), "initech": _probed(20.0, 1.0, idle=idle),
            "acme": _probed(3.0, acme_cores, {"globex": 2.0, "initech": 4.8}, idle, beside)}


def test_loads_that_would_fill_the_shared_cores_scale_the_light_tenants_down_to_the_budget() -> None:
    """The stack idle kept 0.1 of 2 cores busy, the others' loads alone 0.7 (so 0.6 are theirs),
    and acme at its capacity beside them 1.9: the light loads are scaled so that the projection
    is 80% of the cores, and acme keeps its multiple."""
    fit = fit_to_machine(_mix(1.9), cores=2, share=0.8)
    assert fit["projected_cores"] == pytest.approx(1.9) and fit["light_cores"] == pytest.approx(0.6)
    scale = fit["light_scale"]
    assert scale == pytest.approx(0.5)  # 1.3 + 0.5 x 0.6 is the budget, 0.8 x 2 cores
    capacity = _mix(1.9)
    loads = {t.tenant_id: t for t in calibrated_loads(DEMO_TENANTS, capacity, 60.0, light_scale=scale)}
    assert loads["acme"].rate_rps == pytest.approx(ROLES["acme"][1] * 3.0)
    assert loads["globex"].rate_rps == pytest.approx(ROLES["globex"][1] * 10.0 * scale)
    assert loads["initech"].rate_rps == pytest.approx(ROLES["initech"][1] * 20.0 * scale)


def test_loads_within_the_budget_or_unmeasured_are_offered_as_their_roles_say() -> None:
    assert fit_to_machine(_mix(1.5), cores=2, share=0.8)["light_scale"] == 1.0
    # the busy tenant alone fills the cores: the light loads are cut to their floor, not to nothing
    assert fit_to_machine(_mix(2.0, beside=0.3), cores=2, share=0.8)["light_scale"] == LIGHT_FLOOR
    for unread in (_mix(None), _mix(1.9, idle=None), _mix(1.9, beside=None)):
        fit = fit_to_machine(unread, cores=2, share=0.8)
        assert fit["light_scale"] == 1.0 and fit["projected_cores"] is None

"""Workload readers on the real public traces, their error handling, and the seeded generators."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from service.data import fetch_hint
from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec, Workload
from service.workload import (
    ClientStats,
    LengthWindow,
    Pmf,
    RateWindow,
    TenantLoad,
    read_azure,
    read_mooncake,
    read_servegen_clients,
    servegen_workload,
    synthetic_workload,
)
from service.workload.client import GapLaw
from tests.conftest import data_absent, data_path, needs_data

needs_azure = needs_data("azure-llm-2023")
needs_mooncake = needs_data("mooncake-synthetic")
needs_servegen = needs_data("servegen")
AZURE_CODE = data_path("azure-llm-2023/AzureLLMInferenceTrace_code.csv")
AZURE_CONV = data_path("azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
MOONCAKE = data_path("mooncake-synthetic/synthetic_trace.jsonl")
DEEPSEEK = data_path("servegen/reason/deepseek-r1")
MM_IMAGE = data_path("servegen/multimodal/mm-image")

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_GOOD = ["2023-11-16 18:15:46.6805900,374,44\n", "2023-11-16 18:15:50.9951690,396,109\n",
              "2023-11-16 18:15:51.0000000,12,7\n"]


def _assert_sorted(requests: list[RequestSpec]) -> None:
    arrivals = np.array([r.arrival_s for r in requests])
    assert (np.diff(arrivals) >= 0).all()


# --- request traces on the real files ------------------------------------------------------


@needs_azure
@pytest.mark.parametrize(("path", "rows", "span_s", "prompt_range", "output_range", "prompt_median"), [
    (AZURE_CODE, 8819, 3436, (3, 7437), (6, 1899), 1469),
    (AZURE_CONV, 19366, 3502, (2, 14050), (7, 1000), 1020),
])
def test_read_azure_gives_the_documented_rows_and_ranges(path: Path, rows: int, span_s: float,
                                                         prompt_range: tuple[int, int], output_range: tuple[int, int],
                                                         prompt_median: int) -> None:
    result = read_azure(path, tenant_id="t1", model="llama2-7b", sla_class="batch")
    reqs = result.requests
    assert (len(reqs), result.num_bad, result.bad_lines) == (rows, 0, [])
    assert reqs[0].arrival_s == 0.0 and reqs[-1].arrival_s == pytest.approx(span_s, abs=1.0)
    _assert_sorted(reqs)
    prompts = [r.prompt_tokens for r in reqs]
    outputs = [r.output_tokens for r in reqs]
    assert (min(prompts), max(prompts)) == prompt_range
    assert (min(outputs), max(outputs)) == output_range
    assert np.median(prompts) == pytest.approx(prompt_median, abs=1)
    assert {(r.tenant_id, r.model, r.sla_class) for r in reqs} == {("t1", "llama2-7b", "batch")}
    assert len({r.request_id for r in reqs}) == rows
    # 100-ns timestamps survive: line 3 of the code trace is 0.052 s after line 2
    if path == AZURE_CODE:
        assert reqs[1].arrival_s == pytest.approx(0.052, abs=1e-7)


@pytest.mark.slow
@needs_azure
def test_read_azure_conv_reads_every_row() -> None:
    """(Reading speed is measured by benchmarks/sim_speed.py, not asserted here.)"""
    result = read_azure(AZURE_CONV, tenant_id="t", model="tiny")
    assert len(result.requests) == 19366


@needs_azure
def test_read_azure_limit_stops_after_n_requests() -> None:
    result = read_azure(AZURE_CONV, tenant_id="t", model="tiny", limit=100)
    assert len(result.requests) == 100
    assert result.requests[-1].request_id == "t:101"  # line 101 = the 100th data row after the header


@needs_mooncake
def test_read_mooncake_gives_rows_prefix_blocks_and_ms_to_s() -> None:
    result = read_mooncake(MOONCAKE, tenant_id="m", model="tiny")
    reqs = result.requests
    assert (len(reqs), result.num_bad) == (3993, 0)
    assert reqs[0].arrival_s == 0.0 and reqs[-1].arrival_s == pytest.approx(1022.025)
    _assert_sorted(reqs)
    assert len({r.arrival_s for r in reqs}) == 3982  # 11 zero gaps, as documented
    assert max(r.prompt_tokens for r in reqs) == 191378 and min(r.prompt_tokens for r in reqs) == 13
    assert max(r.output_tokens for r in reqs) == 893 and min(r.output_tokens for r in reqs) == 1
    assert all(len(r.prefix_hashes) == math.ceil(r.prompt_tokens / 512) for r in reqs)
    blocks = [h for r in reqs for h in r.prefix_hashes]
    assert (len(blocks), len(set(blocks))) == (121877, 43924)


# --- malformed request traces --------------------------------------------------------------


@pytest.mark.parametrize(("bad_row", "reason"), [
    ("2023-11-16 18:15:52.0000000,374\n", "expected 3 columns"),
    ("2023-11-16 18:15:52.0000000,abc,44\n", "ContextTokens is not an integer"),
    ("2023-11-16 18:15:52.0000000,374,0\n", "GeneratedTokens must be >= 1"),
    ("2023-11-16 18:15:52.0000000,-5,44\n", "ContextTokens must be >= 1"),
    ("2023-11-16 18:15:40.0000000,374,44\n", "goes backwards"),
    ("yesterday,374,44\n", "TIMESTAMP"),
    ("2023-11-16 25:15:52.0000000,374,44\n", "out of range"),
])
def test_read_azure_names_file_and_line_of_a_bad_row(tmp_path: Path, bad_row: str, reason: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(AZURE_HEADER + AZURE_GOOD[0] + AZURE_GOOD[1] + bad_row + AZURE_GOOD[2])
    with pytest.raises(InvalidInputError) as info:
        read_azure(path, tenant_id="t", model="tiny")
    assert f"{path}:4:" in str(info.value) and reason in str(info.value)

    result = read_azure(path, tenant_id="t", model="tiny", skip_bad=True)
    assert result.num_bad == 1 and result.bad_lines[0][0] == 4 and reason in result.bad_lines[0][1]
    assert [r.request_id for r in result.requests] == ["t:2", "t:3", "t:5"]


def test_read_azure_skip_bad_counts_all_but_reports_the_first_ten(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(AZURE_HEADER + AZURE_GOOD[0] + "x,1,1\n" * 25 + AZURE_GOOD[1])
    result = read_azure(path, tenant_id="t", model="tiny", skip_bad=True)
    assert result.num_bad == 25
    assert [line for line, _ in result.bad_lines] == list(range(3, 13))
    assert len(result.requests) == 2 and result.requests[1].arrival_s == pytest.approx(4.314579)


def test_read_azure_rejects_a_wrong_header_even_when_skipping(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("time,in,out\n" + AZURE_GOOD[0])
    with pytest.raises(InvalidInputError, match=r":1: expected header"):
        read_azure(path, tenant_id="t", model="tiny", skip_bad=True)


def test_read_azure_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="cannot read"):
        read_azure(tmp_path / "absent.csv", tenant_id="t", model="tiny")


MOON_GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
MOON_LATER = '{"timestamp": 2500, "input_length": 100, "output_length": 9, "hash_ids": [1]}\n'


@pytest.mark.parametrize(("bad_row", "reason"), [
    ('{"timestamp": 10, "input_length": 100, "hash_ids": [1]}\n', "output_length is missing"),
    ('{"timestamp": 10, "input_length": "100", "output_length": 5, "hash_ids": [1]}\n', "input_length is missing or not"),
    ('{"timestamp": 10, "input_length": 0, "output_length": 5, "hash_ids": []}\n', "input_length must be >= 1"),
    ('{"timestamp": -1, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n', "timestamp"),
    ('{"timestamp": 10, "input_length": 100, "output_length": 5, "hash_ids": [1, 2]}\n', "hash_ids for 100 tokens"),
    ('{"timestamp": 10, "input_length": 100\n', "not JSON"),
    ('{"timestamp": 3000, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n', "goes backwards"),
])
def test_read_mooncake_names_file_and_line_of_a_bad_row(tmp_path: Path, bad_row: str, reason: str) -> None:
    path = tmp_path / "trace.jsonl"
    # the backwards case needs a later row before it
    first_rows = MOON_GOOD + (MOON_LATER.replace("2500", "5000") if "3000" in bad_row else MOON_LATER)
    path.write_text(first_rows + bad_row + MOON_LATER.replace("2500", "6000"))
    with pytest.raises(InvalidInputError) as info:
        read_mooncake(path, tenant_id="m", model="tiny")
    assert f"{path}:3:" in str(info.value) and reason in str(info.value)

    result = read_mooncake(path, tenant_id="m", model="tiny", skip_bad=True)
    assert (result.num_bad, result.bad_lines[0][0], len(result.requests)) == (1, 3, 3)
    assert result.requests[0].prefix_hashes == (1, 2) and result.requests[-1].arrival_s == 6.0


@pytest.mark.parametrize("fmt", ["azure", "mooncake"])
def test_a_row_that_is_not_utf8_is_one_bad_line(tmp_path: Path, fmt: str) -> None:
    if fmt == "azure":
        path, reader, bad_line = tmp_path / "trace.csv", read_azure, 3
        good = [AZURE_HEADER.encode(), AZURE_GOOD[0].encode(), b"2023-11-16 18:15:47.0000000,3\xff4,44\n",
                AZURE_GOOD[1].encode(), AZURE_GOOD[2].encode()]
    else:
        path, reader, bad_line = tmp_path / "trace.jsonl", read_mooncake, 2
        good = [MOON_GOOD.encode(), b'{"timestamp": 10, "input_length": 100, "output_length": 5, "x": "\xc3("}\n',
                MOON_LATER.encode()]
    path.write_bytes(b"".join(good))
    with pytest.raises(InvalidInputError) as info:
        reader(path, tenant_id="t", model="tiny")
    assert f"{path}:{bad_line}: not UTF-8" in str(info.value) and "\n" not in str(info.value)

    result = reader(path, tenant_id="t", model="tiny", skip_bad=True)
    assert result.num_bad == 1 and result.bad_lines[0][0] == bad_line and "not UTF-8" in result.bad_lines[0][1]
    assert len(result.requests) == len(good) - 1 - (fmt == "azure")
    assert f"t:{bad_line}" not in [r.request_id for r in result.requests]


def test_read_azure_header_that_is_not_utf8_fails_even_when_skipping(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_bytes(b"TIME\xffSTAMP,ContextTokens,GeneratedTokens\n" + AZURE_GOOD[0].encode())
    with pytest.raises(InvalidInputError, match=r":1: not UTF-8"):
        read_azure(path, tenant_id="t", model="tiny", skip_bad=True)


# --- ServeGen client statistics ------------------------------------------------------------


@pytest.fixture(scope="module")
def deepseek_clients() -> list[ClientStats]:
    if missing := data_absent("servegen"):
        pytest.skip(fetch_hint(*missing))
    return read_servegen_clients(DEEPSEEK)


@needs_servegen
def test_read_servegen_deepseek_matches_the_documented_counts(deepseek_clients: list[ClientStats]) -> None:
    clients = deepseek_clients
    assert [c.client_id for c in clients] == [f"chunk-{i}" for i in range(73)]
    assert all(len(c.rate_windows) == 144 and c.window_s == 600 and c.day_s == 86400 for c in clients)
    assert all(c.length_window_s == 21600 and len(c.length_windows) == 4 for c in clients)
    windows = [w for c in clients for w in c.rate_windows]
    assert sum(w.rate_rps > 0 for w in windows) == 3111
    assert Counter(w.law for w in windows if w.law) == {"gamma": 2589, "weibull": 522}
    assert sum(not lw.is_empty for c in clients for lw in c.length_windows) == 184
    assert {c.input_fields for c in clients} == {("input_tokens",)}
    rates = [w.rate_rps for w in windows if w.rate_rps > 0]
    assert min(rates) == pytest.approx(0.017, abs=1e-3) and max(rates) == pytest.approx(18.8, abs=0.05)
    # a fitted gamma's CV is 1/sqrt(shape): the cv column agrees with the law
    gamma = [w for w in windows if w.law == "gamma"]
    assert np.allclose([w.cv for w in gamma], [1 / math.sqrt(w.shape) for w in gamma], rtol=0.02)
    means = [lw.pmfs["output_tokens"].mean for c in clients for lw in c.length_windows if not lw.is_empty]
    assert min(means) > 80 and max(means) < 17000


@needs_servegen
def test_read_servegen_mm_image_sums_text_image_audio_video_as_prompt() -> None:
    clients = read_servegen_clients(MM_IMAGE)
    assert len(clients) == 35 and clients[0].source == "mm-image"
    assert sum(w.rate_rps > 0 for c in clients for w in c.rate_windows) == 2094
    assert sum(not lw.is_empty for c in clients for lw in c.length_windows) == 140
    assert {c.input_fields for c in clients} == {("audio_tokens", "image_tokens", "text_tokens", "video_tokens")}
    first = next(lw for lw in clients[0].length_windows if not lw.is_empty)
    assert first.pmfs["image_count"].values == (1.0,)  # extra fields are kept, not used for lengths


def _write_chunk(folder: Path, trace_rows: str, dataset: str | None) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "chunk-0-trace.csv").write_text(trace_rows)
    if dataset is not None:
        (folder / "chunk-0-dataset.json").write_text(dataset)


GOOD_DATASET = '{"0": {"input_tokens": "{10: 0.5, 20: 0.5}", "output_tokens": "{5: 1.0}"}}'


@pytest.mark.parametrize(("trace_rows", "dataset", "message"), [
    ("0,1,1,Gamma,1,1\n600,x,1,Gamma,1,1\n", GOOD_DATASET, ":2: a numeric column"),
    ("0,1,1,Gamma,1,1\n600,1,1,Gamma,1\n", GOOD_DATASET, ":2: expected 6 columns"),
    ("0,1,1,Gamma,1,1\n600,1,1,Pareto,1,1\n", GOOD_DATASET, ":2: unknown inter-arrival pattern"),
    ("0,1,1,Gamma,1,1\n600,2,1,,0,0\n", GOOD_DATASET, ":2: rate window at 600.0 s"),
    ("0,1,1,Gamma,1,1\n600,0,0,,0,0\n", None, "chunk-0-dataset.json: missing"),
    ("0,1,1,Gamma,1,1\n600,0,0,,0,0\n", '{"0": {"input_tokens": "{10: 0.5}", "output_tokens": "{5: 1.0}"}}',
     "sum to 0.5"),
    ("0,1,1,Gamma,1,1\n600,0,0,,0,0\n", '{"0": {"input_tokens": "[10]", "output_tokens": "{5: 1.0}"}}',
     "field input_tokens: not a"),
    ("0,1,1,Gamma,1,1\n600,0,0,,0,0\n", '{"0": {"text_tokens": "{10: 1.0}", "image_count": "{1: 1.0}"}}',
     "chunk-0-trace.csv: client model/chunk-0: PMF fields"),
])
def test_read_servegen_rejects_malformed_files(tmp_path: Path, trace_rows: str, dataset: str | None,
                                               message: str) -> None:
    folder = tmp_path / "model"
    _write_chunk(folder, trace_rows, dataset)
    with pytest.raises(InvalidInputError) as info:
        read_servegen_clients(folder)
    assert message in str(info.value)


def test_read_servegen_reads_a_small_valid_folder(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    _write_chunk(folder, "0,1,1,Gamma,1,1\n600,0,0,,0,0\n", GOOD_DATASET)
    (client,) = read_servegen_clients(folder)
    assert (client.client_id, client.source, client.window_s, client.day_s) == ("chunk-0", "model", 600, 1200)
    assert client.length_windows[0].pmfs["input_tokens"] == Pmf((10.0, 20.0), (0.5, 0.5))
    assert client.rate_rps_at(700) == 0 and client.rate_rps_at(1200 + 10) == 1  # the day wraps


# --- domain: requests and workloads ----------------------------------------------------------


def test_request_spec_rejects_empty_lengths_and_negative_arrivals() -> None:
    with pytest.raises(InvalidInputError, match="r1"):
        RequestSpec("r1", "t", "tiny", 0.0, 0, 5)
    with pytest.raises(InvalidInputError, match="arrival_s"):
        RequestSpec("r2", "t", "tiny", float("nan"), 5, 5)


def test_workload_helpers_scale_and_cut() -> None:
    reqs = [RequestSpec(f"r{i}", t, "tiny", float(i), 10, 30) for i, t in enumerate(["b", "a", "b", "a", "c"])]
    wl = Workload("w", reqs)
    assert (wl.num_requests, wl.duration_s, wl.tenants()) == (5, 4.0, ["a", "b", "c"])
    assert wl.offered_tokens_per_s == pytest.approx(5 * 40 / 4.0)
    fast = wl.scaled(2.0)
    assert [r.arrival_s for r in fast.requests] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert fast.offered_tokens_per_s == pytest.approx(2 * wl.offered_tokens_per_s)
    assert wl.head(2).requests == reqs[:2] and wl.head(99) is wl
    with pytest.raises(InvalidInputError, match="not sorted"):
        Workload("bad", list(reversed(reqs)))
    with pytest.raises(InvalidInputError, match="rate_factor"):
        wl.scaled(0.0)


# --- synthetic generators --------------------------------------------------------------------

TENANTS = [
    TenantLoad("steady", "tiny", rate_rps=4.0, prompt_median_tokens=300, prompt_sigma=0.8,
               output_median_tokens=60, output_sigma=0.5),
    TenantLoad("bursty", "llama2-7b", rate_rps=1.5, sla_class="premium", arrival="gamma", burstiness_cv=3.0,
               prompt_median_tokens=2000, prompt_sigma=1.5, prompt_max_tokens=4096, output_max_tokens=256),
]


def test_synthetic_workload_is_deterministic_per_seed() -> None:
    first = synthetic_workload(np.random.default_rng(7), tenants=TENANTS, duration_s=600)
    again = synthetic_workload(np.random.default_rng(7), tenants=TENANTS, duration_s=600)
    other = synthetic_workload(np.random.default_rng(8), tenants=TENANTS, duration_s=600)
    assert first.requests == again.requests and first.num_requests > 1000
    assert first.requests != other.requests


def test_synthetic_workload_matches_its_parameters() -> None:
    wl = synthetic_workload(np.random.default_rng(1), tenants=TENANTS, duration_s=3600)
    assert wl.horizon_s == 3600 and wl.tenants() == ["bursty", "steady"]
    _assert_sorted(wl.requests)
    steady = [r for r in wl.requests if r.tenant_id == "steady"]
    bursty = [r for r in wl.requests if r.tenant_id == "bursty"]
    assert len(steady) / 3600 == pytest.approx(4.0, rel=0.05)
    assert np.median([r.prompt_tokens for r in steady]) == pytest.approx(300, rel=0.05)
    assert np.median([r.output_tokens for r in steady]) == pytest.approx(60, rel=0.05)
    steady_gaps = np.diff([r.arrival_s for r in steady])
    assert steady_gaps.std() / steady_gaps.mean() == pytest.approx(1.0, abs=0.05)  # Poisson
    # a CV-3 process is noisy over an hour: the rate within 20%, the CV within 15%
    assert len(bursty) / 3600 == pytest.approx(1.5, rel=0.2)
    bursty_gaps = np.diff([r.arrival_s for r in bursty])
    assert bursty_gaps.std() / bursty_gaps.mean() == pytest.approx(3.0, rel=0.15)
    assert max(r.prompt_tokens for r in bursty) == 4096 and max(r.output_tokens for r in bursty) <= 256
    assert min(r.prompt_tokens for r in wl.requests) >= 1
    assert {(r.model, r.sla_class) for r in bursty} == {("llama2-7b", "premium")}
    assert all(0 <= r.arrival_s < 3600 for r in wl.requests)


def test_synthetic_workload_rejects_duplicate_tenants_and_bad_parameters() -> None:
    with pytest.raises(InvalidInputError, match="unique"):
        synthetic_workload(np.random.default_rng(0), tenants=[TENANTS[0], TENANTS[0]], duration_s=10)
    with pytest.raises(InvalidInputError, match="burstiness_cv"):
        TenantLoad("x", "tiny", 1.0, arrival="gamma", burstiness_cv=0.0)
    with pytest.raises(InvalidInputError, match="duration_s"):
        synthetic_workload(np.random.default_rng(0), tenants=TENANTS, duration_s=0)


def _two_level_client(law: GapLaw, shape: float) -> ClientStats:
    """A 4-window day (100 s windows): rates 5, 0, 20, 5; two length windows with disjoint PMFs."""
    rates = [5.0, 0.0, 20.0, 5.0]
    windows = tuple(RateWindow(i * 100.0, r, 1.0, law if r else None, shape if r else 0.0, 1.0 if r else 0.0)
                    for i, r in enumerate(rates))
    lengths = (LengthWindow(0.0, {"input_tokens": Pmf((100.0, 200.0), (0.5, 0.5)), "output_tokens": Pmf((7.0,), (1.0,))}),
               LengthWindow(200.0, {"input_tokens": Pmf((5000.0,), (1.0,)), "output_tokens": Pmf((0.0, 50.0), (0.5, 0.5))}))
    return ClientStats("chunk-x", "test", 100.0, windows, 200.0, lengths)


@pytest.mark.slow
def test_servegen_workload_follows_rates_laws_and_window_lengths() -> None:
    client = _two_level_client("weibull", 0.5)
    wl = servegen_workload(np.random.default_rng(3), [client], tenant_ids=["a"], models="tiny",
                           duration_s=400 * 50)  # 50 days of the 400-s day
    arrivals = np.array([r.arrival_s for r in wl.requests])
    counts = np.bincount(((arrivals % 400) // 100).astype(int), minlength=4) / 50
    assert counts[1] == 0
    assert counts[[0, 2, 3]] == pytest.approx([500, 2000, 500], rel=0.05)
    # Weibull(c=0.5) gaps have CV sqrt(Gamma(5)/Gamma(3)**2 - 1) = sqrt(5)
    gaps = np.diff(arrivals[(arrivals % 400) // 100 == 2])
    gaps = gaps[gaps < 100]  # drop the jumps between days
    assert gaps.std() / gaps.mean() == pytest.approx(math.sqrt(5), rel=0.15)
    first_half = [r for r in wl.requests if r.arrival_s % 400 < 200]
    second_half = [r for r in wl.requests if r.arrival_s % 400 >= 200]
    assert {r.prompt_tokens for r in first_half} == {100, 200} and {r.output_tokens for r in first_half} == {7}
    assert {r.prompt_tokens for r in second_half} == {5000} and {r.output_tokens for r in second_half} == {1, 50}


def test_servegen_workload_pooled_lengths_clamps_start_and_scale() -> None:
    client = _two_level_client("gamma", 1.0)
    wl = servegen_workload(np.random.default_rng(4), [client], tenant_ids=["a"], models=["tiny"], duration_s=4000,
                           length_source="pooled", max_prompt_tokens=1000)
    # pooled: window 0 expects 500 requests a day, window 1 expects 2500, so 1/6 come from window 0's PMF
    share_short = np.mean([r.output_tokens == 7 for r in wl.requests])
    assert share_short == pytest.approx(1 / 6, abs=0.03)
    assert max(r.prompt_tokens for r in wl.requests) == 1000
    # starting at 200 s of the day: the first 100 s run at 20 rps, scaled by 2
    late = servegen_workload(np.random.default_rng(4), [client], tenant_ids=["a"], models="tiny", duration_s=100,
                             start_s=200, rate_scale=2.0)
    assert late.num_requests == pytest.approx(4000, rel=0.1)
    assert all(0 <= r.arrival_s < 100 for r in late.requests)


@needs_servegen
def test_servegen_workload_reproduces_a_real_clients_day(deepseek_clients: list[ClientStats]) -> None:
    clients = [deepseek_clients[1], deepseek_clients[5]]
    wl, again = (servegen_workload(np.random.default_rng(11), clients, tenant_ids=["t1", "t5"],
                                   models=["tiny", "llama2-7b"], duration_s=86400.0) for _ in range(2))
    assert wl.requests == again.requests
    _assert_sorted(wl.requests)
    for client, tenant_id in zip(clients, ["t1", "t5"], strict=True):
        arrivals = np.array([r.arrival_s for r in wl.requests if r.tenant_id == tenant_id])
        counts = np.bincount((arrivals // 600).astype(int), minlength=144)
        expected = np.array([w.rate_rps * 600 for w in client.rate_windows])
        assert counts[expected == 0].sum() == 0  # idle windows stay idle
        assert counts.sum() == pytest.approx(expected.sum(), rel=0.05)
        assert np.corrcoef(counts, expected)[0, 1] > 0.9
    outputs = [r.output_tokens for r in wl.requests if r.tenant_id == "t5"]
    pmf_means = [lw.pmfs["output_tokens"].mean for lw in clients[1].length_windows if not lw.is_empty]
    assert min(pmf_means) * 0.8 < np.mean(outputs) < max(pmf_means) * 1.2

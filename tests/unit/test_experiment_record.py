"""The experiment record's comparisons (service/domain/experiment.py): what counts as the same
result, and how a rerun's differences are named."""

from __future__ import annotations

import math
from typing import Any

import pytest

from service.domain.error import InvalidInputError
from service.domain.experiment import (
    CodeVersion,
    Experiment,
    differences,
    flatten,
    headline_rows,
    reproduction,
    result_differences,
)

RESULT: dict[str, Any] = {"policy": "fifo/container", "load_scale": 1.0, "num_requests": 60,
                          "token_throughput_tps": 281.85, "sla_violation_rate": 0.0, "wall_s": 0.21,
                          "e2e_s": {"p50": 0.015, "p99": math.nan}, "decisions": ["t=5s none"]}


def _experiment(**changes: Any) -> Experiment:
    base: dict[str, Any] = {
        "uid": "replay-a", "kind": "replay", "config": {"seed": 0}, "results": [dict(RESULT)],
        "code": CodeVersion("a" * 40, False, "0.1.0"), "created_at": "2026-01-01T00:00:00.000Z", "seed": 0,
        "data_digests": {"builtin:mix/synthetic-3": "1" * 64}, "cost_model": {"kind": "roofline", "sha256": None}}
    return Experiment(**(base | changes))


def test_flatten_names_nested_values_by_dotted_keys_and_lists_of_maps_by_index() -> None:
    assert flatten({"e2e_s": {"p50": 1.0}, "by_load": [{"load": 1.0}], "loads": [1.0, 2.0]}) == \
        {"e2e_s.p50": 1.0, "by_load[0].load": 1.0, "loads": [1.0, 2.0]}


def test_the_same_results_compare_equal_with_nan_equal_and_wall_clock_left_out() -> None:
    rerun = dict(RESULT, wall_s=9.9, e2e_s={"p50": 0.015, "p99": math.nan})
    assert result_differences([RESULT], [rerun]) == []
    assert reproduction(_experiment(), _experiment(results=[rerun])).exact


def test_a_moved_number_is_named_with_both_values() -> None:
    rerun = dict(RESULT, token_throughput_tps=281.86)
    (d,) = result_differences([RESULT], [rerun])
    assert (d.key, d.a, d.b) == ("fifo/container x1: token_throughput_tps", 281.85, 281.86)


def test_reproduction_names_the_code_the_data_and_the_cost_model_that_changed() -> None:
    rerun = _experiment(code=CodeVersion("b" * 40, True, "0.1.0", "c" * 64),
                        data_digests={"builtin:mix/synthetic-3": "2" * 64, "/tmp/new.csv": "3" * 64},
                        cost_model={"kind": "table", "sha256": "d" * 64})
    check = reproduction(_experiment(), rerun)
    assert not check.exact and check.results == []
    assert check.lines() == [
        f"code version: commit was {'a' * 40!r}, now {'b' * 40!r}",
        "code version: dirty was False, now True",
        f"code version: diff_sha256 was None, now {'c' * 64!r}",
        "data: /tmp/new.csv was not read by the recorded run (now sha256 3333333333333333…)",
        "data digest: builtin:mix/synthetic-3 was sha256 1111111111111111…, now sha256 2222222222222222…",
        "cost model: kind was 'roofline', now 'table'",
        f"cost model: sha256 was None, now {'d' * 64!r}",
    ]


def test_without_a_commit_the_package_version_is_the_code_version() -> None:
    old, new = CodeVersion(None, None, "0.1.0"), CodeVersion(None, None, "0.2.0")
    check = reproduction(_experiment(code=old), _experiment(code=new))
    assert check.lines() == ["code version: package_version was '0.1.0', now '0.2.0'"]


def test_headline_rows_put_a_policy_in_one_run_only_beside_none() -> None:
    other = dict(RESULT, policy="fifo/slice", token_throughput_tps=300.0)
    rows = headline_rows([RESULT], [other])
    assert ("fifo/container x1", "tokens/s", 281.85, None) in rows
    assert ("fifo/slice x1", "tokens/s", None, 300.0) in rows
    assert [d.key for d in differences({"a": 1}, {"a": 1, "b": 2})] == ["b"]


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="experiment kind must be one of replay, whatif, benchmark"):
        _experiment(kind="notebook")

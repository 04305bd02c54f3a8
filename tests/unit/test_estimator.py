"""Output-length estimation: classes, the static fit, online calibration on a shifted stream,
and the calibration study on the real Azure traces (fit on code, applied to conv)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from learned.estimator import OutputLengthEstimator, calibration_study, classify, prompt_bucket
from service.domain.error import InvalidInputError
from service.domain.request import RequestSpec
from tests.conftest import data_path, needs_data


def _stream(rng: np.random.Generator, n: int, *, tenant: str, scale: float, start_s: float = 0.0,
            sigma: float = 0.3) -> list[RequestSpec]:
    """Requests whose output median is ``scale * sqrt(prompt)``: long prompts, long answers."""
    prompts = np.exp(rng.uniform(math.log(50), math.log(8000), n)).astype(int)
    outputs = np.maximum(1, np.rint(scale * np.sqrt(prompts) * np.exp(sigma * rng.standard_normal(n)))).astype(int)
    return [RequestSpec(f"{tenant}:{i}", tenant, "m", start_s + i * 0.5, int(p), int(o))
            for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))]


def test_classes_name_tenant_model_and_prompt_bucket() -> None:
    assert [prompt_bucket(p) for p in (1, 127, 128, 255, 256, 4096, 40_000)] == [0, 0, 1, 1, 2, 6, 9]
    assert classify(RequestSpec("r", "t1", "llama", 0.0, 300, 5)) == "t1/llama/p2"


def test_estimate_before_fit_is_refused() -> None:
    est = OutputLengthEstimator()
    with pytest.raises(InvalidInputError, match="fit"):
        est.estimate(RequestSpec("r", "t", "m", 0.0, 10, 5))
    with pytest.raises(InvalidInputError):
        OutputLengthEstimator(alpha=0.0)


def test_the_static_fit_follows_prompt_length_and_tenant() -> None:
    rng = np.random.default_rng(1)
    est = OutputLengthEstimator().fit(_stream(rng, 3000, tenant="t", scale=2.0))
    for prompt in (100, 1000, 6000):
        got = est.estimate(RequestSpec("x", "t", "m", 0.0, prompt, 1))
        # median 2*sqrt(p); the default budget leans a little towards the mean (mean_weight=0.5)
        assert got == pytest.approx(2.0 * math.sqrt(prompt), rel=0.15)
    assert 1 <= est.estimate(RequestSpec("x", "unseen", "other", 0.0, 1, 1)) <= est.max_output_tokens


def test_observe_moves_the_estimate_of_that_class_towards_what_was_observed() -> None:
    rng = np.random.default_rng(2)
    est = OutputLengthEstimator().fit(_stream(rng, 2000, tenant="t", scale=2.0))
    probe = RequestSpec("p", "t", "m", 0.0, 1000, 1)
    before = est.estimate(probe)
    for i in range(50):  # the tenant now answers 4x longer in this prompt band
        est.observe(RequestSpec(f"o{i}", "t", "m", 0.0, 1000, 1), 4 * before)
    after = est.estimate(probe)
    assert 3 * before < after < 5 * before
    assert est.num_observed == 50
    est.reset_calibration()
    assert est.estimate(probe) == before


def test_estimates_are_deterministic() -> None:
    train = _stream(np.random.default_rng(3), 500, tenant="t", scale=1.0)
    test = _stream(np.random.default_rng(4), 300, tenant="t", scale=5.0)
    assert calibration_study(train, test) == calibration_study(train, test)


def test_calibration_cuts_error_on_a_shifted_stream() -> None:
    rng = np.random.default_rng(5)
    train = _stream(rng, 2000, tenant="a", scale=0.5)
    test = _stream(rng, 3000, tenant="b", scale=6.0)  # a new tenant with 12x longer answers
    got = calibration_study(train, test)
    assert got["mae_calibrated"] < got["mae_static"] and got["rmse_calibrated"] < got["rmse_static"]
    assert got["mae_reduction"] >= 0.35 and got["rmse_reduction"] >= 0.35


def test_calibration_study_refuses_an_empty_test_set() -> None:
    with pytest.raises(InvalidInputError):
        calibration_study(_stream(np.random.default_rng(0), 10, tenant="t", scale=1.0), [])


@needs_data("azure-llm-2023")
def test_calibration_on_azure_code_to_conv_cuts_mae_and_rmse_by_a_third() -> None:
    from service.workload.readers import read_azure

    folder = data_path("azure-llm-2023")
    code = read_azure(folder / "AzureLLMInferenceTrace_code.csv", tenant_id="azure-code", model="llama2-7b")
    conv = read_azure(folder / "AzureLLMInferenceTrace_conv.csv", tenant_id="azure-conv", model="llama2-7b")
    got = calibration_study(code.requests, conv.requests)
    assert got["num_test"] == len(conv.requests)
    assert got["mae_reduction"] >= 0.35 and got["rmse_reduction"] >= 0.35

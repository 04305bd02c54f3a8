"""A stage on another node: a real stage server on loopback runs part of the layers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from executor.batcher import ContinuousBatcher, GenerationRequest, generate_alone
from executor.remote import StageServer
from executor.runner import Stage, load_staged
from service.domain.model_config import model_config
from service.models.family import build_model


@pytest.fixture
def server() -> Iterator[StageServer]:
    s = StageServer().start()
    yield s
    s.close()


@pytest.mark.parametrize("family", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("split", ["second", "first", "all"])
def test_remote_stages_generate_the_same_tokens(server: StageServer, family: str, split: str) -> None:
    stages = {"second": [Stage("cpu:0", 0, 1), Stage("cpu:0", 1, 2, server.url)],
              "first": [Stage("cpu:0", 0, 1, server.url), Stage("cpu:1", 1, 2)],
              "all": [Stage("cpu:0", 0, 2, server.url)]}[split]
    model = load_staged(family, 11, stages)
    batcher = ContinuousBatcher(model, max_batch=4)
    prompts = [[5, 6, 7], [9], [1, 2, 3, 4, 5, 6], [42, 43]]
    for i, p in enumerate(prompts):
        batcher.submit(GenerationRequest(str(i), p, 6))
    while not batcher.idle:
        batcher.step()
    reference = build_model(model_config(family), seed=11)
    got = {r.request_id: r.tokens for r in batcher.finished}
    assert all(got[str(i)] == generate_alone(reference, p, 6) for i, p in enumerate(prompts))
    assert server.calls > 0
    # every stage's prefill and decode is timed, a remote one by its server
    for r in batcher.finished:
        for times in (r.prefill_stage_s, r.decode_stage_s):
            assert len(times) == len(stages) and all(t > 0 for t in times), (r.request_id, times)


def test_bad_stage_requests_are_refused(server: StageServer) -> None:
    import httpx

    from executor.remote import PATH, pack

    assert httpx.post(server.url + PATH, content=b"not a tensor file").status_code == 400
    body = pack({"family": "nope", "seed": 1, "start": 0, "end": 1, "device": "cpu:0", "x": None, "rope": None,
                 "cache": None, "bias": None})
    assert httpx.post(server.url + PATH, content=body).status_code == 400
    assert httpx.post(server.url + "/elsewhere", content=b"x").status_code == 404

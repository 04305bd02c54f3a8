"""Real continuous batching on the CPU: batching never changes what a request generates."""

from __future__ import annotations

import pytest
import torch

from executor.batcher import ContinuousBatcher, GenerationRequest, generate_alone
from service.domain.model_config import model_config
from service.models.family import build_model


@pytest.mark.parametrize("name", ["tiny", "tiny-llama"])
def test_batched_generation_equals_running_each_request_alone(name: str) -> None:
    torch.set_num_threads(1)
    model = build_model(model_config(name), seed=5)
    gen = torch.Generator().manual_seed(1)
    specs = [(torch.randint(0, 256, (int(n),), generator=gen).tolist(), int(m))
             for n, m in ((5, 7), (17, 3), (2, 11), (9, 6), (30, 4), (1, 9))]
    batcher = ContinuousBatcher(model, max_batch=3, max_context=64)
    for i, (prompt, m) in enumerate(specs[:4]):
        batcher.submit(GenerationRequest(f"r{i}", prompt, m))
    steps = 0
    while not batcher.idle:
        batcher.step()
        steps += 1
        if steps == 2:  # late arrivals join a running batch
            for i, (prompt, m) in enumerate(specs[4:], start=4):
                batcher.submit(GenerationRequest(f"r{i}", prompt, m))
    done = {r.request_id: r for r in batcher.finished}
    assert len(done) == len(specs)
    for i, (prompt, m) in enumerate(specs):
        assert done[f"r{i}"].tokens == generate_alone(model, prompt, m), f"r{i}"
    assert max(len(it.decode_contexts) for it in batcher.iterations) == 3  # the batch really filled
    assert all(it.duration_s > 0 for it in batcher.iterations)


def test_request_timings_are_ordered() -> None:
    batcher = ContinuousBatcher(build_model(model_config("tiny"), seed=0), max_batch=2, max_context=32)
    batcher.submit(GenerationRequest("a", [1, 2, 3], 4))
    while not batcher.idle:
        batcher.step()
    (r,) = batcher.finished
    assert r.admitted_s is not None and r.first_token_s is not None and r.finished_s is not None
    assert r.admitted_s <= r.first_token_s <= r.finished_s
    assert len(r.token_times_s) == 4 and r.token_times_s == sorted(r.token_times_s)


def test_bad_requests_are_refused() -> None:
    batcher = ContinuousBatcher(build_model(model_config("tiny"), seed=0), max_batch=2, max_context=16)
    with pytest.raises(ValueError, match="exceeds"):
        batcher.submit(GenerationRequest("big", [1] * 10, 10))
    with pytest.raises(ValueError, match="non-empty"):
        batcher.submit(GenerationRequest("empty", [], 3))

"""The executor's sampler: greedy is the argmax, a seeded request draws the same tokens whatever it
is batched with, the nucleus keeps the smallest most-likely set reaching ``top_p``, and a stop id
ends a request early."""

from __future__ import annotations

import pytest
import torch

from executor.batcher import ContinuousBatcher, GenerationRequest, generate_alone
from executor.sampler import TokenSampler, nucleus
from service.domain.error import InvalidInputError
from service.domain.model_config import model_config
from service.domain.sampling import Sampling
from service.models.family import build_model

PROMPT = [72, 101, 108, 108, 111]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.set_num_threads(1)
    return build_model(model_config("tiny"), seed=11)


def run_batched(model: torch.nn.Module, requests: list[GenerationRequest], max_batch: int = 4) -> dict[str, list[int]]:
    batcher = ContinuousBatcher(model, max_batch=max_batch, max_context=128)  # type: ignore[arg-type]
    for r in requests:
        batcher.submit(r)
    while not batcher.idle:
        batcher.step()
    return {r.request_id: r.tokens for r in batcher.finished}


def test_greedy_is_the_argmax_whatever_the_seed() -> None:
    logits = torch.tensor([0.1, 2.0, -1.0, 1.9])
    assert TokenSampler(Sampling(0.0, 0.5, 123)).pick(logits) == 1
    assert TokenSampler(Sampling()).pick(logits) == 1


def test_a_seeded_request_draws_the_same_tokens_alone_and_with_any_batch_mates(model: torch.nn.Module) -> None:
    seeded = Sampling(temperature=0.9, top_p=0.95, seed=42)
    alone = generate_alone(model, PROMPT, 24, seeded)  # type: ignore[arg-type]
    mates = [GenerationRequest("greedy", [1, 2, 3], 30), GenerationRequest("other-seed", [9] * 7, 20,
                                                                        sampling=Sampling(1.0, 1.0, 7)),
             GenerationRequest("same-prompt", list(PROMPT), 24, sampling=Sampling(0.9, 0.95, 43))]
    batched = run_batched(model, [*mates, GenerationRequest("x", list(PROMPT), 24, sampling=seeded)])
    assert batched["x"] == alone
    assert batched["same-prompt"] != alone  # another seed, other draws
    assert run_batched(model, [GenerationRequest("x", list(PROMPT), 24, sampling=seeded)])["x"] == alone
    assert batched["greedy"] == generate_alone(model, [1, 2, 3], 30)  # type: ignore[arg-type]


def test_the_nucleus_is_the_smallest_likely_set_reaching_top_p() -> None:
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    order, kept = nucleus(probs, 0.75)
    assert order.tolist() == [1, 3, 2, 0] and kept.tolist() == pytest.approx([0.5, 0.3, 0.0, 0.0])
    assert nucleus(probs, 0.8)[1].tolist() == pytest.approx([0.5, 0.3, 0.0, 0.0])  # 0.8 is reached by two
    assert nucleus(probs, 0.81)[1].tolist() == pytest.approx([0.5, 0.3, 0.15, 0.0])
    assert nucleus(probs, 0.01)[1].tolist() == pytest.approx([0.5, 0.0, 0.0, 0.0])  # the top token always
    sampler = TokenSampler(Sampling(temperature=1.0, top_p=0.75, seed=3))
    draws = [sampler.pick(probs.log()) for _ in range(4000)]
    assert set(draws) == {1, 3}
    assert draws.count(1) / len(draws) == pytest.approx(0.5 / 0.8, abs=0.03)  # renormalised within the nucleus


def test_a_stop_id_ends_a_request_early(model: torch.nn.Module) -> None:
    greedy = generate_alone(model, PROMPT, 20)  # type: ignore[arg-type]
    stop = greedy[4]
    n = greedy.index(stop) + 1
    assert generate_alone(model, PROMPT, 20, stop_ids=frozenset({stop})) == greedy[:n]  # type: ignore[arg-type]
    batched = run_batched(model, [GenerationRequest("s", list(PROMPT), 20, stop_ids=frozenset({stop})),
                                  GenerationRequest("long", [5, 6], 20, stop_ids=frozenset({999}))])
    assert batched["s"] == greedy[:n] and len(batched["long"]) == 20


@pytest.mark.parametrize(("temperature", "top_p", "seed"), [(-0.1, 1.0, 0), (2.5, 1.0, 0), (1.0, 0.0, 0),
                                                            (1.0, 1.5, 0), (1.0, 1.0, -1), (float("nan"), 1.0, 0)])
def test_bad_sampling_is_refused(temperature: float, top_p: float, seed: int) -> None:
    with pytest.raises(InvalidInputError):
        Sampling(temperature, top_p, seed)

"""How a request's next token is chosen from the model's logits: its sampling parameters.

``temperature == 0`` is greedy (the most likely token; ``top_p`` and ``seed`` change nothing).
Otherwise the token is drawn from ``softmax(logits / temperature)`` restricted to the nucleus:
the most likely tokens whose probabilities add up to at least ``top_p`` (``1.0``: all), with a
random generator of the request's own seeded by ``seed``, so that a seeded request yields the
same tokens whatever it is batched with. The executor's sampler is
:class:`executor.sampler.TokenSampler`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.domain.error import InvalidInputError

MAX_TEMPERATURE = 2.0  # OpenAI's bound
MAX_SEED = 2**63 - 1  # fits Neo4j's 64-bit integers


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0  # nucleus mass, in (0, 1]
    seed: int = 0  # the request's generator seed (unused when greedy)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= MAX_TEMPERATURE):
            raise InvalidInputError(f"temperature must be in [0, {MAX_TEMPERATURE}], got {self.temperature}")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise InvalidInputError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (0 <= self.seed <= MAX_SEED):
            raise InvalidInputError(f"seed must be in [0, 2**63), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = Sampling()

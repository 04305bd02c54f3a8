"""Batching limits of a replica: the one home of every batching and KV-reserve constant.

Pure data. The simulator, trace replay and the live service read these objects (or their own
copy of one made with ``dataclasses.replace``) instead of repeating the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.domain.error import InvalidInputError

__all__ = ["LIVE_BATCHING", "SIM_BATCHING", "BatchingConfig"]


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """How a replica batches (continuous batching with chunked prefill) and how much KV a new
    replica must be able to hold to be worth placing."""

    max_num_seqs: int = 256  # admitted sequences at most (prefilling plus decoding)
    max_batched_tokens: int = 2048  # token budget of one iteration (a decode counts one)
    kv_reserve_tokens: int = 8192  # KV tokens a replica needs besides its weights to be useful
    chunk_choices_tokens: tuple[int, ...] = (128, 256, 512, 1024, 2048)  # prefill chunk sizes tried per tenant
    # False: chunked prefill, decodes and prompt chunks in one iteration (vLLM v1, Sarathi).
    # True: vLLM v0's default: an iteration either prefills whole prompts (when any waiting
    # request fits; decodes pause) or decodes every running request.
    prefill_first: bool = False

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_batched_tokens", "kv_reserve_tokens"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value > 0):
                raise InvalidInputError(f"batching: {name} must be a positive integer, got {value!r}", culprit=name)
        if not self.chunk_choices_tokens or any(c <= 0 for c in self.chunk_choices_tokens) \
                or list(self.chunk_choices_tokens) != sorted(self.chunk_choices_tokens):
            raise InvalidInputError(f"batching: chunk_choices_tokens must be positive and ascending, got "
                                    f"{self.chunk_choices_tokens}", culprit="chunk_choices_tokens")


# The simulator and trace replay (replica sizing, guest replicas, what-ifs).
SIM_BATCHING = BatchingConfig()
# The live service: the same batching, a smaller KV reserve per placed replica.
LIVE_BATCHING = BatchingConfig(kv_reserve_tokens=2048)

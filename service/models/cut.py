"""A built-in model's phase traced on the ``meta`` device and cut into slices
(:func:`service.core.cut.cut_graph`): what replay's simulator prices, the in-memory twin of the
GMG's Cypher cut (:mod:`service.graph.cut_store`)."""

from __future__ import annotations

from functools import lru_cache

from service.core.cut import Granularity, SliceCut, cut_graph
from service.domain.error import InvalidInputError
from service.domain.model_config import ModelConfig
from service.domain.opgraph import PHASES, OperatorGraph

#: The traced shape of :func:`cut_model` (clipped to the model's context length).
TRACE_TOKENS = 128
TRACE_CONTEXT = 512


@lru_cache(maxsize=256)
def cut_model(config: ModelConfig, phase: str, granularity: Granularity) -> tuple[SliceCut, ...]:
    """The cut of a built-in model's phase, traced on the ``meta`` device at one sequence of
    :data:`TRACE_TOKENS` tokens (prefill) or one token over :data:`TRACE_CONTEXT` cached ones
    (decode), both clipped to the model's context; cached per ``(config, phase, granularity)``.
    Shape-only configs (Llama-2 70B) trace in a few seconds, once."""
    if phase not in PHASES:
        raise InvalidInputError(f"unknown phase {phase!r} (expected one of {PHASES})")
    granularity.check(config.n_layers, config.name)
    return tuple(cut_graph(traced_graph(config, phase), granularity))


@lru_cache(maxsize=16)
def traced_graph(config: ModelConfig, phase: str) -> OperatorGraph:
    """The phase's operator graph that :func:`cut_model` cuts, traced once per process."""
    from service.models.trace import trace_phase  # torch: imported on first use only

    return trace_phase(config, phase, batch=1, tokens=min(TRACE_TOKENS, config.max_seq_len),
                       context=min(TRACE_CONTEXT, config.max_seq_len - 1))

"""What tail-aware decisions ask of a distributional predictor: the features of a call and the
quantiles it answers.

Pure: no I/O, no torch. ``learned.distributional`` implements :class:`TailPredictor` with a
learned model; :class:`NaivePredictor` is a fixed reference (and the fallback of tests).

A model call is described by its prompt (length, step type, position in its workflow, its
tenant's history), the runtime state of the replica it would run on (queue length, running
batch, KV load) and its model (size). The predictor answers, at :data:`QUANTILES`, its output
length in tokens and its latency in seconds from the moment it joins that replica's queue to
its last token. A tool call is described by its tool and input size; the answer is its
duration quantiles. Every answer is non-decreasing along the quantiles (a contract: tests hold
the learned model to it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["P50", "P90", "P99", "QUANTILES", "CallFeatures", "NaivePredictor", "TailPredictor", "ToolFeatures",
           "mean_of"]

QUANTILES: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
P50, P90, P99 = QUANTILES.index(0.5), QUANTILES.index(0.9), QUANTILES.index(0.99)


@dataclass(frozen=True, slots=True)
class CallFeatures:
    """One model call on one candidate replica."""

    role: str  # the step type (planner, coder, ...)
    model: str
    model_params_b: float  # model size, billions of parameters
    prompt_tokens: int
    depth: int  # position in the workflow: 0 for a root
    num_uses: int  # steps it waits for
    workflow_steps: int  # steps of its workflow
    tenant_log_output: float  # the tenant's mean log output length of this role so far (history; 0: none)
    queue_len: int  # requests waiting on the replica (queued plus preempted)
    running: int  # requests admitted on the replica (prefilling plus decoding)
    kv_frac: float  # KV in use over the replica's device memory
    queued_prompt_tokens: int = 0  # prompt tokens waiting ahead on the replica


@dataclass(frozen=True, slots=True)
class ToolFeatures:
    tool: str
    input_tokens: int


class TailPredictor(Protocol):
    def call_quantiles(self, feats: Sequence[CallFeatures]) -> np.ndarray:
        """Shape ``(len(feats), 2, len(QUANTILES))``: ``[:, 0]`` output tokens, ``[:, 1]`` latency s."""
        ...

    def tool_quantiles(self, feats: Sequence[ToolFeatures]) -> np.ndarray:
        """Shape ``(len(feats), len(QUANTILES))``: duration seconds."""
        ...


def mean_of(q: np.ndarray) -> np.ndarray:
    """The mean of a distribution given by its quantiles at :data:`QUANTILES` (last axis): the
    quantile function integrated piecewise linearly, flat beyond the first and last quantile."""
    levels = np.asarray((0.0, *QUANTILES, 1.0))
    values = np.concatenate([q[..., :1], q, q[..., -1:]], axis=-1)
    widths = np.diff(levels)
    return np.asarray(((values[..., 1:] + values[..., :-1]) / 2 * widths).sum(axis=-1))


# z-scores of QUANTILES under a standard normal
_Z = np.array([-1.2816, -0.6745, 0.0, 0.6745, 1.2816, 1.6449, 2.3263])


class NaivePredictor:
    """A fixed reference: lognormal output lengths of median ``output_median`` and sigma 1,
    latency from a per-token decode time scaled by the replica's queue; tools lognormal around
    ``tool_median_s``. Monotone by construction; not learned."""

    def __init__(self, output_median: float = 150.0, decode_s_per_token: float = 0.02,
                 tool_median_s: float = 1.0) -> None:
        self.output_median = output_median
        self.decode_s = decode_s_per_token
        self.tool_median_s = tool_median_s

    def call_quantiles(self, feats: Sequence[CallFeatures]) -> np.ndarray:
        out = np.empty((len(feats), 2, len(QUANTILES)))
        for i, f in enumerate(feats):
            tokens = self.output_median * np.exp(_Z)
            wait = 1.0 + f.queue_len / max(1, f.running + 1)
            out[i, 0] = tokens
            out[i, 1] = (tokens * self.decode_s + f.prompt_tokens * 1e-4) * wait
        return out

    def tool_quantiles(self, feats: Sequence[ToolFeatures]) -> np.ndarray:
        return np.array([self.tool_median_s * np.exp(0.6 * _Z) + 4e-4 * f.input_tokens for f in feats]).reshape(
            len(feats), len(QUANTILES))


def log1p_tokens(n: float) -> float:
    return math.log1p(max(0.0, n))

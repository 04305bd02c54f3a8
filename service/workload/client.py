"""ServeGen client statistics: one anonymised tenant's arrival-rate curve and length PMFs.

Pure data with validation; ``service.workload.readers.read_servegen_clients`` builds these from
files and ``service.workload.synthetic.servegen_workload`` samples requests from them.

A client's day is cut into rate windows (600 s in the public data), each with a mean rate and a
fitted inter-arrival law (gamma or Weibull; ``None`` when idle), and into coarser length windows
(21,600 s) each holding PMFs per field: ``input_tokens``/``output_tokens`` for language and
reasoning models, ``text_tokens``/``image_tokens``/``audio_tokens``/``video_tokens`` plus counts
for multimodal ones. A length window with no traffic holds no PMFs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from service.domain.error import InvalidInputError

GapLaw = Literal["gamma", "weibull"]

#: The PMF field that gives output length; every other ``*_tokens`` field is part of the prompt.
OUTPUT_FIELD = "output_tokens"
_PMF_SUM_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class Pmf:
    """A discrete distribution: ``values[i]`` has probability ``probs[i]``; probs sum to 1."""

    values: tuple[float, ...]
    probs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values or len(self.values) != len(self.probs):
            raise InvalidInputError(f"PMF needs equally many values and probabilities (>= 1), "
                                    f"got {len(self.values)} and {len(self.probs)}")
        if any(not (p >= 0.0) for p in self.probs):
            raise InvalidInputError("PMF has a negative or NaN probability")
        total = sum(self.probs)
        if abs(total - 1.0) > _PMF_SUM_TOLERANCE:
            raise InvalidInputError(f"PMF probabilities sum to {total}, not 1")

    @property
    def mean(self) -> float:
        return sum(v * p for v, p in zip(self.values, self.probs, strict=True))


@dataclass(frozen=True, slots=True)
class RateWindow:
    """Arrivals in ``[start_s, start_s + window_s)`` of the client's day.

    ``rate_rps`` is the mean rate; ``cv`` the coefficient of variation of inter-arrival gaps;
    ``law``/``shape``/``scale`` the fitted gap distribution (scipy's ``gamma(a=shape, scale=scale)``
    or ``weibull_min(c=shape, scale=scale)``). Sampling keeps the law's shape (its burstiness)
    and rescales it to the window's rate. ``law is None`` exactly when ``rate_rps == 0``.
    """

    start_s: float
    rate_rps: float
    cv: float
    law: GapLaw | None
    shape: float
    scale: float

    def __post_init__(self) -> None:
        if not (self.rate_rps >= 0.0) or math.isinf(self.rate_rps):
            raise InvalidInputError(f"rate window at {self.start_s} s: rate_rps must be finite and >= 0")
        if (self.law is None) != (self.rate_rps == 0.0):
            raise InvalidInputError(f"rate window at {self.start_s} s: a fitted law is required exactly "
                                    f"when the rate is positive (rate {self.rate_rps}, law {self.law})")
        if self.law is not None and not (self.shape > 0.0 and self.scale > 0.0):
            raise InvalidInputError(f"rate window at {self.start_s} s: shape and scale must be > 0")


@dataclass(frozen=True, slots=True)
class LengthWindow:
    """Length PMFs of requests arriving in ``[start_s, start_s + length_window_s)``; ``pmfs`` is
    empty when the client sent nothing then."""

    start_s: float
    pmfs: dict[str, Pmf] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not self.pmfs


@dataclass(frozen=True, slots=True)
class ClientStats:
    """One ServeGen client over one day (``num_windows * window_s`` seconds).

    ``rate_windows`` are contiguous from 0 in steps of ``window_s``; ``length_windows`` likewise in
    steps of ``length_window_s``. Every non-empty length window has the same PMF fields, one of
    which is ``output_tokens``; ``input_fields`` are the other ``*_tokens`` fields, whose
    independent samples add up to the prompt length.
    """

    client_id: str
    source: str
    window_s: float
    rate_windows: tuple[RateWindow, ...]
    length_window_s: float
    length_windows: tuple[LengthWindow, ...]

    def __post_init__(self) -> None:
        name = f"client {self.source}/{self.client_id}"
        if not self.rate_windows or not self.length_windows:
            raise InvalidInputError(f"{name}: needs at least one rate window and one length window")
        for i, w in enumerate(self.rate_windows):
            if not math.isclose(w.start_s, i * self.window_s):
                raise InvalidInputError(f"{name}: rate window {i} starts at {w.start_s} s, expected {i * self.window_s}")
        for i, lw in enumerate(self.length_windows):
            if not math.isclose(lw.start_s, i * self.length_window_s):
                raise InvalidInputError(f"{name}: length window {i} starts at {lw.start_s} s, "
                                        f"expected {i * self.length_window_s}")
        fields = {tuple(sorted(lw.pmfs)) for lw in self.length_windows if not lw.is_empty}
        if len(fields) > 1:
            raise InvalidInputError(f"{name}: length windows disagree on their PMF fields: {sorted(fields)}")
        if not fields:
            raise InvalidInputError(f"{name}: every length window is empty")
        (names,) = fields
        if OUTPUT_FIELD not in names or not any(n.endswith("_tokens") and n != OUTPUT_FIELD for n in names):
            raise InvalidInputError(f"{name}: PMF fields {list(names)} lack {OUTPUT_FIELD} or an input *_tokens field")

    @property
    def day_s(self) -> float:
        """Length of the described period (the rate curve repeats after it)."""
        return len(self.rate_windows) * self.window_s

    @property
    def input_fields(self) -> tuple[str, ...]:
        """PMF fields whose samples add up to the prompt length, sorted."""
        lw = next(lw for lw in self.length_windows if not lw.is_empty)
        return tuple(sorted(n for n in lw.pmfs if n.endswith("_tokens") and n != OUTPUT_FIELD))

    @property
    def mean_rate_rps(self) -> float:
        """Mean arrival rate over the whole day."""
        return sum(w.rate_rps for w in self.rate_windows) / len(self.rate_windows)

    def rate_rps_at(self, t_s: float) -> float:
        """Rate at time ``t_s`` of the day (wraps around after ``day_s``)."""
        return self.rate_windows[int((t_s % self.day_s) // self.window_s)].rate_rps

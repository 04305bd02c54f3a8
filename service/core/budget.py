"""Output-token budgets at admission, calibrated online from observed output lengths.

Pure: no I/O, no wall clock.
"""

from __future__ import annotations

from collections import deque


class BudgetCalibrator:
    """Output-token budget at admission, calibrated online per (tenant, model).

    A request's budget is its ``max_tokens`` scaled by the running mean of observed output over
    ``max_tokens`` for its tenant's model (EWMA with ``alpha``; 1.0 before any observation).
    """

    def __init__(self, alpha: float = 0.1) -> None:
        self.alpha = alpha
        self.ratio: dict[str, float] = {}
        self.abs_errors: deque[float] = deque(maxlen=10_000)  # |budget - observed| of recent completions

    def budget(self, model_uid: str, max_tokens: int) -> int:
        return max(1, min(max_tokens, round(max_tokens * self.ratio.get(model_uid, 1.0))))

    def observe(self, model_uid: str, max_tokens: int, budget: int, output_tokens: int) -> None:
        self.abs_errors.append(abs(budget - output_tokens))
        r = self.ratio.get(model_uid, 1.0)
        self.ratio[model_uid] = r + self.alpha * (output_tokens / max_tokens - r)

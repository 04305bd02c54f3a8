"""SLA classes: the latency targets a request is held to, by name.

A request meets its SLA when its time to first token, its mean time between tokens (time per
output token, TPOT, as serving SLOs state it; a single slow iteration does not fail a request)
and its end-to-end latency are all at or under the class's targets. The TTFT target may grow
with the prompt (a base plus a per-prompt-token allowance: a long prompt cannot be prefilled as
fast as a short one); ``math.inf`` means no target. Slack is target minus achieved (seconds;
negative means violated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class SlaClass:
    name: str
    ttft_s: float = math.inf  # time to first token, from arrival: the base target
    tbt_s: float = math.inf  # TPOT: mean gap between consecutive output tokens
    e2e_s: float = math.inf  # end-to-end deadline, arrival to last token
    ttft_per_prompt_token_s: float = 0.0  # added to the TTFT target per prompt token

    def ttft_target_s(self, prompt_tokens: int) -> float:
        """The TTFT target for a prompt of ``prompt_tokens`` tokens."""
        return self.ttft_s + self.ttft_per_prompt_token_s * prompt_tokens

    def deadline_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """Seconds after arrival by which a request of these lengths should be finished: its
        TTFT target plus a TPOT target for every later token, or the end-to-end target if
        sooner (``math.inf`` when the class sets none)."""
        later = max(0, output_tokens - 1)
        paced = self.ttft_target_s(prompt_tokens) + (self.tbt_s * later if later else 0.0)  # inf * 0 is nan
        return min(self.e2e_s, paced)

    def slack_s(self, ttft_s: float, tbt_mean_s: float, e2e_s: float, prompt_tokens: int = 0) -> float:
        """The smallest of the three slacks (negative: the SLA is missed)."""
        return min(self.ttft_target_s(prompt_tokens) - ttft_s, self.tbt_s - tbt_mean_s, self.e2e_s - e2e_s)

    def with_targets(self, ttft_s: float | None = None, tbt_s: float | None = None) -> SlaClass:
        """This class with a request's own TTFT and TPOT targets in place of its own (``None``:
        the class's). A TTFT given is the whole target, with no per-prompt-token allowance. The
        result is named after its targets, so equal targets make equal classes."""
        if ttft_s is None and tbt_s is None:
            return self
        parts = [self.name] + [f"{what}={1e3 * value:g}ms" for what, value in (("ttft", ttft_s), ("tpot", tbt_s))
                               if value is not None]
        return replace(self, name="+".join(parts), ttft_s=self.ttft_s if ttft_s is None else ttft_s,
                       ttft_per_prompt_token_s=self.ttft_per_prompt_token_s if ttft_s is None else 0.0,
                       tbt_s=self.tbt_s if tbt_s is None else tbt_s)


SLA_CLASSES: dict[str, SlaClass] = {
    s.name: s
    for s in (
        SlaClass("interactive", ttft_s=1.0, tbt_s=0.1, e2e_s=60.0),
        SlaClass("standard", ttft_s=3.0, tbt_s=0.2, e2e_s=300.0),
        SlaClass("batch", ttft_s=60.0, tbt_s=1.0, e2e_s=3600.0),
    )
}

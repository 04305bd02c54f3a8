"""The executor's token sampler: one per request, so a seeded request's draws depend on nothing
but its own logits (its batch mates never touch its generator). The rule is
:class:`service.domain.sampling.Sampling`'s."""

from __future__ import annotations

import torch

from service.domain.sampling import Sampling


class TokenSampler:
    """Picks a request's next tokens. Greedy: the argmax. Otherwise a draw from
    ``softmax(logits / temperature)`` over the nucleus (the most likely tokens whose mass
    reaches ``top_p``), from a ``torch.Generator`` seeded with the request's seed and living on
    the logits' device (made at the first draw)."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self._generator: torch.Generator | None = None

    def pick(self, logits: torch.Tensor) -> int:
        """The next token from ``logits`` (one row: ``[vocab]``)."""
        s = self.sampling
        if s.greedy:
            return int(logits.argmax())
        probs = torch.softmax(logits.float() / s.temperature, dim=-1)
        generator = self._generator_on(probs.device)
        if s.top_p >= 1.0:
            return int(torch.multinomial(probs, 1, generator=generator))
        order, kept = nucleus(probs, s.top_p)
        return int(order[torch.multinomial(kept, 1, generator=generator)])

    def _generator_on(self, device: torch.device) -> torch.Generator:
        if self._generator is None:
            self._generator = torch.Generator(device=device).manual_seed(self.sampling.seed)
        return self._generator


def nucleus(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, kept)``: token ids by falling probability, and their probabilities with every
    token outside the nucleus zeroed (the smallest prefix whose mass reaches ``top_p``; the
    most likely token is always in it). Not renormalised: ``torch.multinomial`` need not."""
    kept, order = probs.sort(descending=True)
    before = kept.cumsum(-1) - kept  # mass of the more likely tokens
    return order, kept.masked_fill(before >= top_p, 0.0)


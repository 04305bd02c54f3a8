"""Real continuous batching of one model on one torch device.

Requests join at iteration boundaries. Each iteration prefills the requests admitted in it
(one forward pass per prompt, causal attention) and then runs one decode step for every
request that already had its prefill, batched, over a KV pool with one slot per running
request. Sequences of different lengths share a decode batch: the pool is left-aligned and an
additive attention bias masks each sequence's unused positions. Greedy decoding; a request
finishes after ``max_new_tokens`` tokens (no EOS: lengths come from the workload).

The outputs are bit-for-bit independent of batching up to float rounding: a request decoded in
a batch yields the same tokens as the same request run alone (tested).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from service.models.family import DecoderLM

Clock = Callable[[], float]


@dataclass
class GenerationRequest:
    request_id: str
    prompt: list[int]
    max_new_tokens: int
    arrival_s: float = 0.0
    # filled in while running
    tokens: list[int] = field(default_factory=list)
    admitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.max_new_tokens


@dataclass(frozen=True)
class IterationRecord:
    """One measured iteration: what it held and how long it took (seconds, wall clock)."""

    start_s: float
    duration_s: float
    prefill_tokens: tuple[int, ...]  # prompt length of each request prefilled
    decode_contexts: tuple[int, ...]  # cached tokens of each request decoded (before this step)


class ContinuousBatcher:
    """Runs requests through one model with continuous batching.

    ``max_batch`` bounds the running requests (KV slots); ``max_context`` bounds prompt plus
    generated tokens of one request. ``submit`` queues a request; ``step`` runs one iteration
    and returns its record (``None`` when there was nothing to do).
    """

    def __init__(self, model: DecoderLM, *, max_batch: int = 8, max_context: int | None = None,
                 clock: Clock = time.perf_counter) -> None:
        c = model.config
        self.model = model
        self.max_batch = max_batch
        self.max_context = max_context or c.max_seq_len
        self.clock = clock
        device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.device = device
        self.pool = torch.zeros(c.n_layers, 2, max_batch, c.n_kv_heads, self.max_context, c.head_dim,
                                dtype=self.dtype, device=device)
        self.waiting: deque[GenerationRequest] = deque()
        self.running: list[GenerationRequest] = []  # slot i of the pool holds running[i]
        self.lengths: list[int] = []  # cached tokens per slot
        self.finished: list[GenerationRequest] = []
        self.iterations: list[IterationRecord] = []

    def submit(self, request: GenerationRequest) -> None:
        total = len(request.prompt) + request.max_new_tokens
        if not request.prompt or request.max_new_tokens <= 0:
            raise ValueError(f"{request.request_id}: needs a non-empty prompt and max_new_tokens > 0")
        if total > self.max_context:
            raise ValueError(f"{request.request_id}: prompt + max_new_tokens = {total} exceeds {self.max_context}")
        self.waiting.append(request)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @torch.inference_mode()
    def step(self) -> IterationRecord | None:
        if self.idle:
            return None
        start = self.clock()
        decode_contexts = tuple(self.lengths)
        decoding = list(range(len(self.running)))
        admitted: list[GenerationRequest] = []
        while self.waiting and len(self.running) + len(admitted) < self.max_batch:
            admitted.append(self.waiting.popleft())
        for req in admitted:
            self._prefill(req, start)
        if decoding:
            self._decode(decoding)
        end = self.clock()
        for i in decoding:
            self.running[i].token_times_s.append(end)
        for req in admitted:
            req.first_token_s = end
            req.token_times_s.append(end)
        self._retire(end)
        record = IterationRecord(start, end - start, tuple(len(r.prompt) for r in admitted), decode_contexts)
        self.iterations.append(record)
        return record

    def _prefill(self, req: GenerationRequest, now: float) -> None:
        req.admitted_s = now
        ids = torch.tensor([req.prompt], device=self.device)
        pos = torch.arange(len(req.prompt), device=self.device)[None]
        logits, kv = self.model(ids, pos, last_logits_only=True)
        slot = len(self.running)
        self.pool[:, :, slot, :, : len(req.prompt)] = kv[:, :, 0]
        self.running.append(req)
        self.lengths.append(len(req.prompt))
        req.tokens.append(int(logits[0, -1].argmax()))

    def _decode(self, slots: list[int]) -> None:
        n = len(slots)  # slots 0..n-1: running requests admitted before this iteration
        longest = max(self.lengths[i] for i in slots)
        ids = torch.tensor([[self.running[i].tokens[-1]] for i in slots], device=self.device)
        pos = torch.tensor([[self.lengths[i]] for i in slots], device=self.device)
        cache = self.pool[:, :, :n, :, :longest]
        lengths = torch.tensor([self.lengths[i] for i in slots], device=self.device)
        # Position j of sequence b is visible iff j < length_b; the new token (last column) always is.
        visible = torch.arange(longest + 1, device=self.device)[None, :] < lengths[:, None]
        visible[:, -1] = True
        bias = torch.zeros(n, 1, 1, longest + 1, dtype=self.dtype, device=self.device)
        bias.masked_fill_(~visible[:, None, None, :], float("-inf"))
        logits, new_kv = self.model(ids, pos, kv_cache=cache, attn_bias=bias)
        for b, i in enumerate(slots):
            self.pool[:, :, i, :, self.lengths[i]] = new_kv[:, :, b, :, 0]
            self.lengths[i] += 1
            self.running[i].tokens.append(int(logits[b, -1].argmax()))

    def _retire(self, now: float) -> None:
        """Free the slots of finished requests, compacting the pool (last slot moves into the hole)."""
        i = 0
        while i < len(self.running):
            req = self.running[i]
            if not req.done:
                i += 1
                continue
            req.finished_s = now
            self.finished.append(req)
            last = len(self.running) - 1
            if i != last:
                self.pool[:, :, i, :, : self.lengths[last]] = self.pool[:, :, last, :, : self.lengths[last]]
                self.running[i] = self.running[last]
                self.lengths[i] = self.lengths[last]
            self.running.pop()
            self.lengths.pop()


def generate_alone(model: DecoderLM, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Reference: greedy generation of one request with a growing KV cache, no batching."""
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        logits, kv = model(ids, torch.arange(len(prompt))[None], last_logits_only=True)
        tokens = [int(logits[0, -1].argmax())]
        while len(tokens) < max_new_tokens:
            pos = torch.tensor([[kv.shape[4]]])
            logits, new_kv = model(torch.tensor([[tokens[-1]]]), pos, kv_cache=kv)
            kv = torch.cat([kv, new_kv], dim=4)
            tokens.append(int(logits[0, -1].argmax()))
    return tokens

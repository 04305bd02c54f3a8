"""Real continuous batching of one model, on one torch device or staged over several.

Requests join at iteration boundaries. Each iteration prefills the requests admitted in it
(one forward pass per prompt, causal attention) and then runs one decode step for every
request that already had its prefill, batched, over a KV pool with one slot per running
request. Sequences of different lengths share a decode batch: the pool is left-aligned and an
additive attention bias masks each sequence's unused positions. Each request chooses its tokens
with its own :class:`~executor.sampler.TokenSampler` (greedy by default; seeded sampling
otherwise); it finishes after ``max_new_tokens`` tokens, or earlier when it produces one of its
``stop_ids`` (kept as its last token).

The outputs are independent of batching up to float rounding: a request decoded in a batch
yields the same tokens as the same request run alone (tested, greedy and seeded).

The model is a :class:`~executor.runner.StagedModel` (a plain ``DecoderLM`` is run as one
stage on its own device): the pool keeps one KV tensor per stage, on that stage's device.
Every iteration is measured: its wall-clock duration and its peak memory (see
:meth:`ContinuousBatcher.step`); each request accumulates the iterations it took part in.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from executor.runner import Stage, StagedModel, activation_bytes
from executor.sampler import TokenSampler
from service.domain.sampling import GREEDY, Sampling
from service.models.family import DecoderLM

Clock = Callable[[], float]


@dataclass
class GenerationRequest:
    request_id: str
    prompt: list[int]
    max_new_tokens: int
    arrival_s: float = 0.0
    sampling: Sampling = GREEDY
    stop_ids: frozenset[int] = frozenset()  # producing one ends the request (finish reason "stop")
    # filled in while running
    tokens: list[int] = field(default_factory=list)
    admitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    iterations: int = 0  # iterations this request took part in (its prefill and its decode steps)
    busy_s: float = 0.0  # sum of the durations of those iterations
    peak_bytes: int = 0  # largest peak memory of those iterations
    prefill_stage_s: tuple[float, ...] = ()  # its prefill's seconds per stage of the model (nan: not timed)
    # one decode iteration it took part in, timed per stage (its first): the batch's sequences,
    # the longest context attended (the batch is padded to it) and the seconds per stage
    decode_stage_s: tuple[float, ...] = ()
    decode_batch: int = 0
    decode_context: int = 0
    sampler: TokenSampler = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.sampler = TokenSampler(self.sampling)

    @property
    def stopped(self) -> bool:
        """It produced one of its stop ids."""
        return bool(self.tokens) and self.tokens[-1] in self.stop_ids

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.max_new_tokens or self.stopped


@dataclass(frozen=True)
class IterationRecord:
    """One measured iteration: what it held and how long it took (seconds, wall clock)."""

    start_s: float
    duration_s: float
    prefill_tokens: tuple[int, ...]  # prompt length of each request prefilled
    decode_contexts: tuple[int, ...]  # cached tokens of each request decoded (before this step)
    peak_bytes: int  # peak memory of the iteration (see ContinuousBatcher.step)


class ContinuousBatcher:
    """Runs requests through one model with continuous batching.

    ``max_batch`` bounds the running requests (KV slots); ``max_context`` bounds prompt plus
    generated tokens of one request. ``submit`` queues a request; ``step`` runs one iteration
    and returns its record (``None`` when there was nothing to do); ``remove`` drops a request
    wherever it is; ``take_finished`` hands over the requests finished so far. ``iterations``
    keeps the last ``history`` records (all by default; a long-running server bounds it).
    """

    def __init__(self, model: DecoderLM | StagedModel, *, max_batch: int = 8, max_context: int | None = None,
                 clock: Clock = time.perf_counter, history: int | None = None) -> None:
        if isinstance(model, DecoderLM):
            model = StagedModel(model, [_whole_model_stage(model)])
        c = model.config
        self.model = model
        self.max_batch = max_batch
        self.max_context = max_context or c.max_seq_len
        self.clock = clock
        self.dtype = next(model.parameters()).dtype
        self.device = model.devices[0]  # where the inputs go
        self.pool = [torch.zeros(s.end - s.start, 2, max_batch, c.n_kv_heads, self.max_context, c.head_dim,
                                 dtype=self.dtype, device=d) for s, d in zip(model.stages, model.devices, strict=True)]
        self.cuda_devices = sorted({d for d in model.devices if d.type == "cuda"}, key=str)
        self.resident_bytes = model.param_bytes() + sum(t.numel() * t.element_size() for t in self.pool)
        self.waiting: deque[GenerationRequest] = deque()
        self.running: list[GenerationRequest] = []  # slot i of the pool holds running[i]
        self.lengths: list[int] = []  # cached tokens per slot
        self.finished: list[GenerationRequest] = []
        self.iterations: deque[IterationRecord] = deque(maxlen=history)

    def submit(self, request: GenerationRequest) -> None:
        total = len(request.prompt) + request.max_new_tokens
        if not request.prompt or request.max_new_tokens <= 0:
            raise ValueError(f"{request.request_id}: needs a non-empty prompt and max_new_tokens > 0")
        if total > self.max_context:
            raise ValueError(f"{request.request_id}: prompt + max_new_tokens = {total} exceeds {self.max_context}")
        vocab = self.model.config.vocab_size
        if not all(0 <= t < vocab for t in request.prompt):
            raise ValueError(f"{request.request_id}: prompt token ids must lie in [0, {vocab})")
        self.waiting.append(request)

    def remove(self, request_id: str) -> GenerationRequest | None:
        """Drop a waiting or running request (its KV slot is freed); ``None`` if it holds none."""
        for i, req in enumerate(self.waiting):
            if req.request_id == request_id:
                del self.waiting[i]
                return req
        for i, req in enumerate(self.running):
            if req.request_id == request_id:
                self._free_slot(i)
                return req
        return None

    def take_finished(self) -> list[GenerationRequest]:
        """The requests finished since the last call, in finishing order."""
        done, self.finished = self.finished, []
        return done

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def admitting(self) -> bool:
        """A request waits for its prefill and a KV slot is free for it (the next step admits it)."""
        return bool(self.waiting) and len(self.running) < self.max_batch

    @property
    def pressed(self) -> bool:
        """A request waits for its prefill, or half its KV slots or more are taken (a batch
        that fills up is falling behind its arrivals, and more of them may wait upstream)."""
        return bool(self.waiting) or 2 * len(self.running) >= self.max_batch

    @torch.inference_mode()
    def step(self) -> IterationRecord | None:
        """One iteration: admit and prefill waiting requests, one decode step for the others.

        Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` over the iteration, summed
        over the model's CUDA devices (everything allocated there, other models included; the
        CPU stages of a mixed placement are not counted). On the CPU no
        allocator counts, so it is an estimate: the weights and the whole KV pool (both
        resident) plus :func:`~executor.runner.activation_bytes` of the largest forward pass
        of the iteration.
        """
        if self.idle:
            return None
        for device in self.cuda_devices:
            torch.cuda.reset_peak_memory_stats(device)
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
        prefill_tokens = tuple(len(r.prompt) for r in admitted)
        record = IterationRecord(start, end - start, prefill_tokens, decode_contexts,
                                 self._peak_bytes(prefill_tokens, decode_contexts))
        for i in decoding:
            self.running[i].token_times_s.append(end)
        for req in admitted:
            req.first_token_s = end
            req.token_times_s.append(end)
        for req in [self.running[i] for i in decoding] + admitted:
            req.iterations += 1
            req.busy_s += record.duration_s
            req.peak_bytes = max(req.peak_bytes, record.peak_bytes)
        self._retire(end)
        self.iterations.append(record)
        return record

    def _peak_bytes(self, prefill_tokens: tuple[int, ...], decode_contexts: tuple[int, ...]) -> int:
        """Peak memory of the iteration just run (see :meth:`step`)."""
        if self.cuda_devices:
            return sum(torch.cuda.max_memory_allocated(d) for d in self.cuda_devices)
        c = self.model.config
        forwards = [activation_bytes(c, batch=1, tokens=n, context=0) for n in prefill_tokens]
        if decode_contexts:
            forwards.append(activation_bytes(c, batch=len(decode_contexts), tokens=1, context=max(decode_contexts)))
        return self.resident_bytes + max(forwards)

    def _prefill(self, req: GenerationRequest, now: float) -> None:
        req.admitted_s = now
        ids = torch.tensor([req.prompt], device=self.device)
        pos = torch.arange(len(req.prompt), device=self.device)[None]
        stage_s: list[float] = []
        logits, kv = self.model(ids, pos, last_logits_only=True, stage_times=stage_s)
        req.prefill_stage_s = tuple(stage_s)
        slot = len(self.running)
        for part, new in zip(self.pool, kv, strict=True):
            part[:, :, slot, :, : len(req.prompt)] = new[:, :, 0]
        self.running.append(req)
        self.lengths.append(len(req.prompt))
        req.tokens.append(req.sampler.pick(logits[0, -1]))

    def _decode(self, slots: list[int]) -> None:
        n = len(slots)  # slots 0..n-1: running requests admitted before this iteration
        longest = max(self.lengths[i] for i in slots)
        ids = torch.tensor([[self.running[i].tokens[-1]] for i in slots], device=self.device)
        pos = torch.tensor([[self.lengths[i]] for i in slots], device=self.device)
        cache = [part[:, :, :n, :, :longest] for part in self.pool]
        lengths = torch.tensor([self.lengths[i] for i in slots], device=self.device)
        # Position j of sequence b is visible iff j < length_b; the new token (last column) always is.
        visible = torch.arange(longest + 1, device=self.device)[None, :] < lengths[:, None]
        visible[:, -1] = True
        bias = torch.zeros(n, 1, 1, longest + 1, dtype=self.dtype, device=self.device)
        bias.masked_fill_(~visible[:, None, None, :], float("-inf"))
        # A decode iteration is timed per stage when one of its requests has no timed decode yet
        # (one per request: a CUDA sync per stage on every iteration would cost throughput).
        untimed = [self.running[i] for i in slots if not self.running[i].decode_stage_s]
        stage_s: list[float] | None = [] if untimed else None
        logits, new_kv = self.model(ids, pos, kv_cache=cache, attn_bias=bias, stage_times=stage_s)
        if stage_s:
            for req in untimed:
                req.decode_stage_s, req.decode_batch, req.decode_context = tuple(stage_s), n, longest
        best = logits[:, -1].argmax(-1).tolist()  # every greedy row's token in one call (one device sync)
        for b, i in enumerate(slots):
            for part, new in zip(self.pool, new_kv, strict=True):
                part[:, :, i, :, self.lengths[i]] = new[:, :, b, :, 0]
            self.lengths[i] += 1
            req = self.running[i]
            req.tokens.append(int(best[b]) if req.sampling.greedy else req.sampler.pick(logits[b, -1]))

    def _retire(self, now: float) -> None:
        """Move finished requests to ``finished`` and free their slots."""
        i = 0
        while i < len(self.running):
            req = self.running[i]
            if not req.done:
                i += 1
                continue
            req.finished_s = now
            self.finished.append(req)
            self._free_slot(i)

    def _free_slot(self, i: int) -> None:
        """Free slot ``i``, compacting the pool (the last slot moves into the hole)."""
        last = len(self.running) - 1
        if i != last:
            n = self.lengths[last]
            for part in self.pool:
                part[:, :, i, :, :n] = part[:, :, last, :, :n]
            self.running[i] = self.running[last]
            self.lengths[i] = self.lengths[last]
        self.running.pop()
        self.lengths.pop()


def _whole_model_stage(model: DecoderLM) -> Stage:
    """One stage holding all of ``model``'s layers on the device its weights are on."""
    device = next(model.parameters()).device
    device_id = f"{device.type}:{device.index or 0}"
    return Stage(device_id, 0, model.config.n_layers)


def generate_alone(model: DecoderLM, prompt: list[int], max_new_tokens: int, sampling: Sampling = GREEDY,
                   stop_ids: frozenset[int] = frozenset()) -> list[int]:
    """Reference: generation of one request with a growing KV cache, no batching (greedy unless
    ``sampling`` says otherwise; it ends early at a stop id, kept as its last token)."""
    sampler = TokenSampler(sampling)
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        logits, kv = model(ids, torch.arange(len(prompt))[None], last_logits_only=True)
        tokens = [sampler.pick(logits[0, -1])]
        while len(tokens) < max_new_tokens and tokens[-1] not in stop_ids:
            pos = torch.tensor([[kv.shape[4]]])
            logits, new_kv = model(torch.tensor([[tokens[-1]]]), pos, kv_cache=kv)
            kv = torch.cat([kv, new_kv], dim=4)
            tokens.append(sampler.pick(logits[0, -1]))
    return tokens

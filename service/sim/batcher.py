"""Continuous batching of simulated replicas: admission (through the one
:func:`service.core.admission.admit`), iterations, paged KV growth and preemption.

See :mod:`service.sim.replica` for the model: what a replica and a request in it hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np

from service.core.admission import admit
from service.core.memory import MemoryLedger
from service.core.queue import QueuedRequest, WaitingQueue
from service.domain.request import RequestSpec
from service.sim.engine import IterationFinished, StageReady
from service.sim.iteration import weight_bytes
from service.sim.replica import Live, Replica, remaining_after, run_max_gap
from service.sim.resource import DeviceTimelines

__all__ = ["Batcher"]


_UNKEYED = QueuedRequest("", "", "", 0.0, 0, 0)  # a FifoQueue ignores keys


class Batcher:
    """Continuous batching and KV admission of the replicas sharing one ledger and one set of
    device timelines. ``served`` (tokens per tenant) is counted only when ``track_served``.
    ``paged``: KV grows with the tokens (``block_tokens`` of rounding per sequence) and the
    newest request is preempted (recompute) when it cannot grow; else the whole request is
    reserved at admission."""

    __slots__ = ("block_tokens", "kv_watermark_fraction", "ledger", "paged", "preemptions", "recomputed_tokens",
                 "served", "timelines", "token_gaps", "track_served")

    def __init__(self, ledger: MemoryLedger, timelines: DeviceTimelines, served: dict[str, float], *,
                 track_served: bool, kv_watermark_fraction: float, paged: bool = False,
                 block_tokens: int = 16, record_token_gaps: bool = False) -> None:
        self.ledger = ledger
        self.timelines = timelines
        self.served = served
        self.track_served = track_served
        self.kv_watermark_fraction = kv_watermark_fraction
        self.paged = paged
        self.block_tokens = block_tokens
        self.preemptions = 0
        self.recomputed_tokens = 0  # prefill tokens spent again on preempted requests
        # (gap seconds, tokens): every output token but a request's first, when recording
        self.token_gaps: list[tuple[float, int]] | None = [] if record_token_gaps else None

    def kv_need(self, live: Live) -> int:
        """KV tokens a request holds from admission: its prefill target and one block of
        rounding (paged), or its prompt and whole output (reserve)."""
        if self.paged:
            return live.target + self.block_tokens
        return live.spec.prompt_tokens + live.spec.output_tokens

    def start_iteration(self, r: Replica, now: float, also_from: Sequence[WaitingQueue[Live]] = ()
                        ) -> IterationFinished | StageReady | None:
        """Admit what fits and start the replica's next iteration; ``None`` when it has no work.
        After its own queues, admission takes from ``also_from`` (other replicas' waiting queues,
        each head-of-line) what fits now: a sliced guest's share of its tenant's queue."""
        if r.spec.prefill_first:
            return self._start_prefill_first(r, now, also_from)
        budget = r.spec.max_batched_tokens - r.num_decodes
        chunks: list[tuple[Live, int]] = []
        p = pairs = kv_p = 0
        for live in r.prefilling:
            if budget <= 0:
                break
            cached = live.prefilled
            n = min(budget, live.target - cached)
            chunks.append((live, n))
            budget -= n
            p += n
            pairs += n * (cached + n)
            kv_p += cached + n
        num_seqs = len(r.prefilling) + r.num_decodes
        served = self.served

        def fits(live: Live) -> bool:  # batch room, then the request's KV under the watermark
            return (budget > 0 and num_seqs < r.spec.max_num_seqs
                    and self.resize_kv(r, r.kv_tokens + self.kv_need(live), now, force=False, watermark=True))

        for queue in _queues(r, also_from):  # preempted requests first, as vLLM does
            for live in admit(queue, served, fits):
                target = self._admitted(r, live, now)
                num_seqs += 1
                n = min(budget, target)
                chunks.append((live, n))
                budget -= n
                p += n
                pairs += n * n
                kv_p += n
        if not chunks and not r.num_decodes:
            return None
        return self._run(r, now, chunks, p, pairs, kv_p, r.num_decodes)

    def _admitted(self, r: Replica, live: Live, now: float) -> int:
        """Book a request admission has just taken (its KV is reserved): it starts prefilling
        its target, which is returned."""
        target = live.target
        if self.track_served and not live.generated:
            self.served[live.spec.tenant_id] = self.served.get(live.spec.tenant_id, 0.0) + target
        if math.isnan(live.admitted_s):
            live.admitted_s = now
        live.kv_base = self.kv_need(live)
        r.prefilling.append(live)
        return target

    def _start_prefill_first(self, r: Replica, now: float, also_from: Sequence[WaitingQueue[Live]] = ()
                             ) -> IterationFinished | StageReady | None:
        """vLLM v0's scheduling: whole prompts of the requests that fit (token budget, sequence
        limit, KV), in an iteration of their own; a decode iteration when none does."""
        budget = r.spec.max_batched_tokens
        num_seqs = r.num_decodes
        chunks: list[tuple[Live, int]] = []
        p = pairs = 0
        served = self.served

        def fits(live: Live) -> bool:
            return (live.target <= budget and num_seqs < r.spec.max_num_seqs
                    and self.resize_kv(r, r.kv_tokens + self.kv_need(live), now, force=False, watermark=True))

        for queue in _queues(r, also_from):
            for live in admit(queue, served, fits):
                target = self._admitted(r, live, now)
                num_seqs += 1
                chunks.append((live, target))
                budget -= target
                p += target
                pairs += target * target
        if chunks:
            return self._run(r, now, chunks, p, pairs, p, 0, decodes_paused=True)
        if not r.num_decodes:
            return None
        return self._run(r, now, [], 0, 0, 0, r.num_decodes)

    def _run(self, r: Replica, now: float, chunks: list[tuple[Live, int]], p: int, pairs: int, kv_p: int,
             decodes: int, *, decodes_paused: bool = False) -> IterationFinished | StageReady:
        """Start an iteration of ``chunks`` prefill work and ``decodes`` decodes: a whole
        iteration on the replica's devices, or (sliced) its first slice, ready now."""
        duration = r.table.latency_s(p, pairs, kv_p, len(chunks), decodes, r.decode_context_sum if decodes else 0)
        act = int((p + decodes) * r.act_bytes_per_token)
        r.act_allocs = [self.ledger.overflow(d, "activation", r.spec.replica_id, act, at_s=now)
                        for d in r.device_ids]
        r.current = chunks
        r.decodes_paused = decodes_paused
        r.busy = True
        if r.spec.stages:
            r.iteration_s = duration
            r.current_start_s = now
            return StageReady(time_s=now, replica_id=r.spec.replica_id, iteration=r.iteration, stage=0)
        start = self.timelines.earliest_window(r.device_ids, now, duration)
        end = start + duration
        r.current_start_s = start
        self.timelines.occupy(r.device_ids, end)
        return IterationFinished(time_s=end, replica_id=r.spec.replica_id, iteration=r.iteration)

    def finish_iteration(self, r: Replica, now: float) -> tuple[list[Live], int, int]:
        """Account the iteration that ends at ``now``: ``(finished requests in order, KV token
        change, output tokens produced)``. The replica is idle afterwards."""
        ledger = self.ledger
        for a in r.act_allocs:
            ledger.free(a)
        r.act_allocs = []
        if r.spec.stages:
            r.gap_wait_s = max(0.0, now - r.current_start_s - r.iteration_s)
        # Decode steps are numbered (``r.iteration``; ``r.ends`` holds their end times): a
        # running request's tokens come at consecutive steps. A prefill-only iteration of
        # ``prefill_first`` is not a step: running decodes wait through it.
        paused = r.decodes_paused
        j = r.iteration - 1 if paused else r.iteration  # the step just ended (or the last one)
        finished: list[Live] = []
        track = self.track_served
        served = self.served
        paged = self.paged
        kv_delta = tokens = 0
        if not paused:
            if j >= len(r.ends):
                r.ends = np.concatenate([r.ends, np.zeros(len(r.ends))])
            r.ends[j] = now
            # Every running decode produced one token; its next step sees one more cached token.
            # Reserve: decodes grow into their admission's reservation. Paged: KV grows by a token
            # per decode (the block rounding of :meth:`kv_need` covers partial blocks).
            kv_delta = r.num_decodes if paged else 0
            tokens = r.num_decodes
            if self.token_gaps is not None and tokens:
                self._record_gaps(r, j, now)
            r.decode_context_sum += r.num_decodes
            if track:
                for t, n in r.decoding_by_tenant.items():
                    served[t] = served.get(t, 0.0) + n
            for live in r.finishing.pop(j, ()):
                spec = live.spec
                r.num_decodes -= 1
                r.decode_context_sum -= spec.prompt_tokens + spec.output_tokens - 1
                kv_delta -= self._held(live, j)
                if track:
                    r.decoding_by_tenant[spec.tenant_id] -= 1
                finished.append(live)
        prefilling = r.prefilling
        for live, n in r.current:
            live.prefilled += n
            if live.prefilled < live.target:
                continue
            prefilling.popleft()  # completed prompts form a prefix of the admission order
            tokens += 1
            spec = live.spec
            target = live.target
            if not live.generated:
                live.first_token_s = now
                live.first_iter = j
            else:  # the stall of a preemption: from its last token before it to this one
                live.max_gap_s = max(live.max_gap_s, now - live.preempted_s)
            live.generated += 1
            live.decode_iter = j  # its next tokens come at steps j + 1, j + 2, ...
            live.run_start_s = now
            if self.token_gaps is not None and remaining_after(live) > 0:
                r.run_starts.append((now, 1))
            if track:
                served[spec.tenant_id] = served.get(spec.tenant_id, 0.0) + 1
            remaining = spec.output_tokens - live.generated
            if remaining <= 0:
                kv_delta -= live.kv_base
                finished.append(live)
            else:
                if track:
                    r.decoding_by_tenant[spec.tenant_id] = r.decoding_by_tenant.get(spec.tenant_id, 0) + 1
                r.num_decodes += 1
                r.decode_context_sum += target  # its context: the target, the new token not yet cached
                r.finishing.setdefault(j + remaining, []).append(live)
        r.tokens_out += tokens
        r.current = []
        if kv_delta > 0 and not self._fits(r, r.kv_tokens + kv_delta):
            kv_delta -= self._preempt(r, r.kv_tokens + kv_delta, j, now)
        if kv_delta:
            self.resize_kv(r, r.kv_tokens + kv_delta, now, force=True)
        if not paused:
            r.iteration = j + 1
        r.decodes_paused = False
        r.busy = False
        return finished, kv_delta, tokens

    def _record_gaps(self, r: Replica, j: int, now: float) -> None:
        """The gaps of this step's tokens: since the previous step for running decodes, since
        their first token for decode runs begun after it."""
        gaps = self.token_gaps
        assert gaps is not None
        fresh = 0
        for start, n in r.run_starts:
            gaps.append((now - start, n))
            fresh += n
        r.run_starts = []
        old = r.num_decodes - fresh
        if old > 0 and j > 0:
            gaps.append((now - float(r.ends[j - 1]), old))

    def _held(self, live: Live, j: int) -> int:
        """KV tokens a decoding request holds at the end of iteration ``j``."""
        return live.kv_base + (j - live.decode_iter if self.paged else 0)

    def _preempt(self, r: Replica, want: int, j: int, now: float) -> int:
        """Preempt the newest running requests (recompute: their KV is dropped, they wait at
        the head of the replica's queue) until ``want`` KV tokens minus what they held fits;
        returns the tokens freed."""
        running = [(x, False) for x in r.prefilling]
        running += [(x, True) for lives in r.finishing.values() for x in lives]
        running.sort(key=lambda e: (e[0].admitted_s, e[0].spec.arrival_s, e[0].spec.request_id))
        freed = 0
        victims: list[Live] = []
        while running and not self._fits(r, want - freed):
            victim, decoding = running.pop()  # newest
            spec = victim.spec
            if decoding:
                produced = victim.generated + (j - victim.decode_iter)  # tokens so far
                r.finishing[victim.decode_iter + spec.output_tokens - victim.generated].remove(victim)
                r.num_decodes -= 1
                r.decode_context_sum -= spec.prompt_tokens + produced - 1
                if self.track_served:
                    r.decoding_by_tenant[spec.tenant_id] -= 1
                freed += self._held(victim, j)
                if produced > victim.generated:
                    victim.max_gap_s = max(victim.max_gap_s, run_max_gap(r, victim, j - victim.decode_iter))
                victim.generated = produced
                victim.preempted_s = now
            else:  # still prefilling: its chunks so far are lost
                r.prefilling.remove(victim)
                freed += victim.kv_base
            self.recomputed_tokens += victim.prefilled
            victim.prefilled = 0
            victim.decode_iter = -1
            victims.append(victim)
            self.preemptions += 1
        for victim in reversed(victims):  # the oldest is readmitted first
            r.preempted.push(_UNKEYED, victim)
        return freed

    def _fits(self, r: Replica, tokens: int) -> bool:
        """Whether the replica's KV can be ``tokens`` tokens with room left for the activations
        of a full iteration (growth may use the admission watermark, as vLLM's does)."""
        act = int(r.spec.max_batched_tokens * r.act_bytes_per_token)
        return all(size - a.size_bytes <= self.ledger.free_bytes(d) - act
                   for d, a, size in zip(r.device_ids, r.kv_allocs, _kv_sizes(r, tokens), strict=True))

    def resize_kv(self, r: Replica, tokens: int, now: float, *, force: bool, watermark: bool = False) -> bool:
        """Set the replica's KV to ``tokens`` tokens on all its devices; False (unchanged) if
        it does not fit (under the watermark too, for admissions) and ``force`` is off."""
        sizes = _kv_sizes(r, tokens)
        ledger = self.ledger
        if not force:
            for d, a, size in zip(r.device_ids, r.kv_allocs, sizes, strict=True):
                # Admission keeps room for the watermark and this iteration's activations.
                reserve = (int(self.kv_watermark_fraction * ledger.capacity_bytes(d))
                           + int(r.spec.max_batched_tokens * r.act_bytes_per_token)) if watermark else 0
                if size - a.size_bytes > ledger.free_bytes(d) - reserve:
                    return False
        r.kv_allocs = [ledger.resize(a, size, at_s=now, force=True) or a
                       for a, size in zip(r.kv_allocs, sizes, strict=True)]
        r.kv_tokens = tokens
        return True

    def fits_ever(self, req: RequestSpec, r: Replica) -> bool:
        """Could the whole request's KV fit on an otherwise empty replica like ``r``?"""
        need = ((req.prompt_tokens + req.output_tokens) * r.kv_bytes_per_token
                + r.spec.max_batched_tokens * r.act_bytes_per_token
                + self.kv_watermark_fraction * self.ledger.capacity_bytes(r.device_ids[0]))
        if r.kv_scale:  # sliced: each device holds its layers' weights and share of the KV
            act = r.spec.max_batched_tokens * r.act_bytes_per_token
            kv = (req.prompt_tokens + req.output_tokens) * r.kv_bytes_per_token
            return all(kv * k + act + self.kv_watermark_fraction * self.ledger.capacity_bytes(d)
                       <= self.ledger.limit_bytes(d) - w
                       for d, k, w in zip(r.device_ids, r.kv_scale, r.weights_on, strict=True))
        weights = -(-weight_bytes(r.config) // r.tp)
        return all(need <= self.ledger.limit_bytes(d) - weights for d in r.device_ids)


def _kv_sizes(r: Replica, tokens: int) -> list[int]:
    """KV bytes on each of the replica's devices for ``tokens`` tokens (tensor parallel: an
    equal shard each; sliced: each device's share of the layers)."""
    if r.kv_scale:
        total = tokens * r.kv_bytes_per_token
        return [math.ceil(total * k) for k in r.kv_scale]
    return [math.ceil(tokens * r.kv_bytes_per_token)] * len(r.device_ids)


def _queues(r: Replica, also_from: Sequence[WaitingQueue[Live]]) -> Iterator[WaitingQueue[Live]]:
    """The queues admission takes from, in order: preempted, waiting, then ``also_from`` only
    once the replica's own queues are empty (a head of its own that does not fit is not
    overtaken by another replica's)."""
    yield r.preempted
    yield r.waiting
    for queue in also_from:
        if r.preempted or r.waiting:
            return
        yield queue

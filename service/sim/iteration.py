"""What one continuous-batching iteration of a model costs, built analytically.

An iteration runs ``num_prefill_tokens`` new prompt tokens (chunks of one or more sequences,
each chunk possibly on top of already cached context) and one token for each decoding
sequence, as one forward pass. :func:`iteration_ops` lists its operators as
:class:`~service.core.cost.OpFeatures` with the kinds, dimensions and FLOP conventions of
:func:`service.models.trace.trace_phase` (linear ``2*rows*in*out`` plus bias, attention
``4 * heads * head_dim * queries * keys`` over the full score matrix, norms 5 FLOPs per element,
GELU 8, SiLU 4, other elementwise 1). View and copy ("memory") operators of the traced reference
code are left out: they carry no FLOPs and a serving kernel does not make them.

:class:`IterationCostTable` asks a :class:`~service.core.cost.CostModel` for the latency once
per bucket of batch features and answers later queries from a dict (the simulator's hot path).
Token counts are rounded *up* to buckets with 5 significant bits (at most 6.25 % high), so
the memoised latency is a slightly pessimistic, deterministic function of the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from service.core.cost import (
    NO_OVERHEAD,
    CostModel,
    HostOverheadModel,
    IterationOverhead,
    OpFeatures,
    floored,
)
from service.core.cut import Granularity
from service.core.scheduler import SliceSize
from service.domain.cluster import Device, Link
from service.domain.model_config import ModelConfig
from service.domain.opgraph import DTYPE_BYTES
from service.models.cut import cut_model


def dtype_bytes(config: ModelConfig) -> int:
    return DTYPE_BYTES.get(config.dtype, 4)


def weight_bytes(config: ModelConfig) -> int:
    """Bytes of all parameters of the model (tied weights counted once)."""
    return config.num_params() * dtype_bytes(config)


def layers_weight_bytes(config: ModelConfig, first_layer: int, last_layer: int) -> int:
    """Weight bytes a slice of layers ``first_layer..last_layer`` (inclusive) needs resident:
    its layers' parameters, plus the token (and position) embedding when it starts the model and
    the final norm and output projection when it ends it (a tied head is a second copy of
    the embedding there when the two ends sit on different devices)."""
    d, v, n = config.d_model, config.vocab_size, config.n_layers
    gpt2, tied = config.style == "gpt2", config.tie_embeddings
    embed = v * d + (config.max_seq_len * d if gpt2 else 0)
    # the final norm (GPT-2's LayerNorm: plus its bias) and the output projection unless tied
    head = (2 * d if gpt2 else d) + (0 if tied else d * v)
    params = (config.num_params() - embed - head) / n * (last_layer - first_layer + 1)
    if first_layer == 0:
        params += embed
    if last_layer == n - 1:
        params += head + (d * v if tied and first_layer != 0 else 0)
    return math.ceil(params) * dtype_bytes(config)


def slice_sizes(config: ModelConfig, layers_per_slice: int) -> list[SliceSize]:
    """The model's decode graph cut into slices of ``layers_per_slice`` consecutive layers
    (:func:`service.models.cut.cut_model`, the in-memory twin of the GMG's Cypher cut): the weight
    bytes each slice reads, and its layers' KV per cached token (``InvalidInputError`` when the
    quantum does not divide the layers)."""
    kv = kv_bytes_per_token(config) // config.n_layers * layers_per_slice
    return [SliceSize(c.first_layer, c.last_layer, c.weight_bytes, kv)
            for c in cut_model(config, "decode", Granularity(layers_per_slice))]


def kv_bytes_per_token(config: ModelConfig) -> int:
    """KV-cache bytes one token occupies across all layers (keys and values)."""
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * dtype_bytes(config)


def activation_bytes_per_token(config: ModelConfig) -> int:
    """Peak live activation bytes per batched token within an iteration (an estimate: the
    residual stream, one layer's QKV and MLP intermediates, and fp32 logits)."""
    d, f, kv = config.d_model, config.d_ff, config.n_kv_heads * config.head_dim
    return (3 * d + 2 * kv + 2 * f) * dtype_bytes(config) + 4 * config.vocab_size


@dataclass(frozen=True, slots=True)
class BatchFeatures:
    """Aggregate size of one iteration's batch (all counts in tokens or sequences).

    ``prefill_pairs`` = sum over prefill chunks of ``new * (cached + new)`` (query-key pairs),
    ``prefill_kv_tokens`` = sum of ``cached + new``; ``decode_context_sum`` = sum of the cached
    tokens of the decoding sequences (each also attends to its own new token).
    ``logits_rows`` = rows the LM head runs on (one per sequence, or every token).
    """

    num_prefill_tokens: int = 0
    prefill_pairs: int = 0
    prefill_kv_tokens: int = 0
    num_prefill_seqs: int = 0
    num_decodes: int = 0
    decode_context_sum: int = 0
    logits_rows: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decodes

    @staticmethod
    def of(prefill_chunks: Sequence[tuple[int, int]], decode_contexts: Sequence[int], *,
           all_logits: bool = False) -> BatchFeatures:
        """From chunks ``(new_tokens, cached_context)`` and decode context lengths."""
        p = sum(n for n, _ in prefill_chunks)
        pairs = sum(n * (c + n) for n, c in prefill_chunks)
        kv = sum(c + n for n, c in prefill_chunks)
        d = len(decode_contexts)
        rows = p + d if all_logits else len(prefill_chunks) + d
        return BatchFeatures(p, pairs, kv, len(prefill_chunks), d, int(sum(decode_contexts)), rows)


def iteration_ops(config: ModelConfig, batch: BatchFeatures) -> list[OpFeatures]:
    """The operators of one iteration, in execution order (layers unrolled)."""
    head, layer, tail = iteration_parts(config, batch)
    return head + layer * config.n_layers + tail


def iteration_parts(config: ModelConfig, batch: BatchFeatures
                    ) -> tuple[list[OpFeatures], list[OpFeatures], list[OpFeatures]]:
    """(head, one layer, tail) of :func:`iteration_ops`; the layer runs ``config.n_layers`` times."""
    c = config
    dt = dtype_bytes(c)
    d, f, v, h, dh = c.d_model, c.d_ff, c.vocab_size, c.n_heads, c.head_dim
    kvd = c.n_kv_heads * dh
    n = batch.num_tokens
    seqs = max(1, batch.num_prefill_seqs + batch.num_decodes)
    gpt2 = c.style == "gpt2"

    def linear(k_in: int, n_out: int, bias: bool, rows: int = n) -> OpFeatures:
        flops = 2 * rows * k_in * n_out + (rows * n_out if bias else 0)
        moved = (k_in * n_out + (n_out if bias else 0) + rows * (k_in + n_out)) * dt
        return OpFeatures("linear", float(flops), float(moved), tokens=rows, dim_in=k_in, dim_out=n_out,
                          batch=seqs, dtype_bytes=dt)

    def pointwise(kind: str, flops_per_elem: int, width: int, num_inputs: int = 1) -> OpFeatures:
        elems = n * width
        return OpFeatures(kind, float(flops_per_elem * elems), float((num_inputs + 1) * elems * dt),
                          tokens=n, dim_in=width, dim_out=width, batch=seqs, dtype_bytes=dt)

    def norm() -> OpFeatures:
        op = pointwise("norm", 5, d)
        return OpFeatures("norm", op.flops, op.bytes_moved + (2 if gpt2 else 1) * d * dt, tokens=n,
                          dim_in=d, dim_out=d, batch=seqs, dtype_bytes=dt)

    def rope(width: int) -> list[OpFeatures]:
        return [pointwise("elementwise", 1, width // 2), pointwise("elementwise", 1, width, 2),
                pointwise("elementwise", 1, width, 2), pointwise("elementwise", 1, width, 2)]

    layer: list[OpFeatures] = [norm()]
    ab, mb = c.attention_bias, c.mlp_bias
    if gpt2:
        layer.append(linear(d, 3 * d, ab))
    else:
        layer += [linear(d, d, ab), linear(d, kvd, ab), linear(d, kvd, ab)]
        layer += rope(d) + rope(kvd)
    if batch.num_prefill_tokens:
        p = batch.num_prefill_tokens
        moved = (2 * p * d + 2 * batch.prefill_kv_tokens * kvd) * dt
        layer.append(OpFeatures("attention", float(4 * h * dh * batch.prefill_pairs), float(moved),
                                tokens=p, dim_in=d, dim_out=kvd,
                                context=batch.prefill_pairs // p, batch=max(1, batch.num_prefill_seqs),
                                dtype_bytes=dt))
    if batch.num_decodes:
        nd = batch.num_decodes
        keys = batch.decode_context_sum + nd
        moved = (2 * nd * d + 2 * keys * kvd) * dt
        layer.append(OpFeatures("attention", float(4 * h * dh * keys), float(moved), tokens=nd,
                                dim_in=d, dim_out=kvd, context=keys // nd, batch=nd, dtype_bytes=dt))
    layer += [linear(d, d, ab), pointwise("elementwise", 1, d, 2), norm()]
    if gpt2:
        layer += [linear(d, f, mb), pointwise("activation", 8, f), linear(f, d, mb)]
    else:
        layer += [linear(d, f, mb), pointwise("activation", 4, f), linear(d, f, mb),
                  pointwise("elementwise", 1, f, 2), linear(f, d, mb)]
    layer.append(pointwise("elementwise", 1, d, 2))

    head: list[OpFeatures] = [OpFeatures("embedding", 0.0, float(n * (8 + 2 * d * dt)), tokens=n,
                                         dim_in=v, dim_out=d, batch=seqs, dtype_bytes=dt)]
    if gpt2:
        head += [OpFeatures("embedding", 0.0, float(n * (8 + 2 * d * dt)), tokens=n, dim_in=c.max_seq_len,
                            dim_out=d, batch=seqs, dtype_bytes=dt), pointwise("elementwise", 1, d, 2)]
    else:  # rotary angles: positions x inverse frequencies, then cos and sin
        head += [pointwise("elementwise", 1, dh // 2), pointwise("elementwise", 1, dh),
                 pointwise("elementwise", 1, dh)]
    tail = [norm(), linear(d, v, False, rows=max(1, batch.logits_rows))]
    return head, layer, tail


def allreduce_s(num_bytes: float, num_devices: int, link: Link | None) -> float:
    """Ring all-reduce time of ``num_bytes`` over ``num_devices`` peers joined by ``link``."""
    if num_devices <= 1:
        return 0.0
    if link is None:
        raise ValueError("tensor parallelism over devices without a link")
    steps = 2 * (num_devices - 1)
    return steps / num_devices * num_bytes / link.bytes_per_s + steps * link.latency_us * 1e-6


def bucket(x: int) -> int:
    """``x`` rounded up to 5 significant bits (exact up to 32)."""
    if x <= 32:
        return x
    shift = x.bit_length() - 5
    return -((-x) >> shift) << shift


class IterationCostTable:
    """Memoised iteration latency of one model on one replica's devices.

    Tensor parallelism over ``tp_degree`` devices divides the single-device latency by the
    degree and adds two ring all-reduces of the residual stream per layer over ``link``.
    ``overhead`` adds the host-side time per iteration that operator profiles do not see; None
    takes it from the cost model when it is a :class:`HostOverheadModel`, else none.
    ``num_queries`` and ``num_misses`` count this table's lookups and cost-model calls. Every pass
    is priced through :func:`~service.core.cost.floored` ``cost_model``: never below the physical
    floor of its operators (the weights once, every sequence's KV, activations).

    ``memo`` (default: a new dict) maps a bucketed batch to its latency; tables that price the
    same model the same way may share one (:class:`CostTables`): the latency of a bucket is a pure
    function of the table's arguments, so sharing only saves cost-model calls.
    """

    def __init__(self, config: ModelConfig, cost_model: CostModel, device: Device, *,
                 tp_degree: int = 1, link: Link | None = None, overhead: IterationOverhead | None = None,
                 memo: dict[tuple[int, ...], float] | None = None) -> None:
        if tp_degree > 1 and link is None:
            raise ValueError("tp_degree > 1 needs the link between the devices")
        self.config, self.cost_model, self.device = config, cost_model, device
        self._priced = floored(cost_model)
        if overhead is None:
            overhead = cost_model.iteration_overhead(device) if isinstance(cost_model, HostOverheadModel) \
                else NO_OVERHEAD
        self.overhead = overhead
        self.tp_degree, self.link = tp_degree, link
        self._memo: dict[tuple[int, ...], float] = {} if memo is None else memo
        self.num_queries = 0
        self.num_misses = 0

    def latency_s(self, num_prefill_tokens: int, prefill_pairs: int, prefill_kv_tokens: int,
                  num_prefill_seqs: int, num_decodes: int, decode_context_sum: int) -> float:
        """Seconds of one iteration (hot path: a dict lookup after bucketing)."""
        self.num_queries += 1
        key = (bucket(num_prefill_tokens), bucket(prefill_pairs), bucket(prefill_kv_tokens),
               num_prefill_seqs, num_decodes, bucket(decode_context_sum))
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        self.num_misses += 1
        feats = BatchFeatures(key[0], key[1], key[2], key[3], key[4], key[5],
                              logits_rows=key[3] + key[4])
        value = self.exact_s(feats)
        self._memo[key] = value
        return value

    def of_batch(self, batch: BatchFeatures) -> float:
        return self.latency_s(batch.num_prefill_tokens, batch.prefill_pairs, batch.prefill_kv_tokens,
                              batch.num_prefill_seqs, batch.num_decodes, batch.decode_context_sum)

    def _passes(self, batch: BatchFeatures) -> list[tuple[BatchFeatures, int]]:
        """The forward passes one iteration takes, with multiplicities: one fused pass, or (for
        an executor that runs each prompt alone) the decodes together plus one pass per prompt,
        each priced as the batch's mean prompt."""
        n = batch.num_prefill_seqs
        if not self.overhead.separate_prefill_passes or n == 0 or (n == 1 and batch.num_decodes == 0):
            return [(batch, 1)]
        one = BatchFeatures(num_prefill_tokens=max(1, batch.num_prefill_tokens // n),
                            prefill_pairs=max(1, batch.prefill_pairs // n),
                            prefill_kv_tokens=max(1, batch.prefill_kv_tokens // n), num_prefill_seqs=1, logits_rows=1)
        passes = [(one, n)]
        if batch.num_decodes:
            passes.append((BatchFeatures(num_decodes=batch.num_decodes, decode_context_sum=batch.decode_context_sum,
                                         logits_rows=batch.num_decodes), 1))
        return passes

    def exact_s(self, batch: BatchFeatures) -> float:
        """Unmemoised latency of ``batch`` (no bucketing)."""
        compute_s = sum(n * self._pass_s(b) for b, n in self._passes(batch)) / self.tp_degree
        stream_bytes = batch.num_tokens * self.config.d_model * dtype_bytes(self.config)
        comm_s = 2 * self.config.n_layers * allreduce_s(stream_bytes, self.tp_degree, self.link)
        return compute_s + comm_s + self.overhead.seconds(batch.num_prefill_seqs, batch.num_decodes)

    def _pass_s(self, batch: BatchFeatures) -> float:
        """Median seconds of one forward pass on one device (layers priced as a stack when the
        cost model can)."""
        head, layer, tail = iteration_parts(self.config, batch)
        return self._priced.predict_stack(head, layer, self.config.n_layers, tail, self.device).p50_s


class CostTables:
    """Makes the :class:`IterationCostTable` of each replica of one simulation (and of its what-if
    forks), sharing one memo among the tables that price the same thing: the same model config,
    device hardware (kind, memory, peak FLOP/s, bandwidth: a cost model prices hardware, not a
    device's name), tensor-parallel degree, link figures and host overhead. A what-if adds a
    replica on a fork and runs it for seconds; without the shared memo every such replica starts
    cold and asks the cost model again for batches its twins already priced (issue 37: 85 tables
    of 6 kinds and 53,000 cost-model calls in a 30 s replay). Each table keeps its own counters.
    """

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self._memos: dict[tuple[object, ...], dict[tuple[int, ...], float]] = {}

    def table(self, config: ModelConfig, device: Device, *, tp_degree: int = 1, link: Link | None = None,
              overhead: IterationOverhead | None = None) -> IterationCostTable:
        hardware = (device.kind, device.mem_bytes, device.peak_flops, device.mem_bw_bytes_per_s)
        wire = None if link is None else (link.kind, link.gbps, link.latency_us)
        memo = self._memos.setdefault((config, hardware, tp_degree, wire, overhead), {})
        return IterationCostTable(config, self.cost_model, device, tp_degree=tp_degree, link=link, overhead=overhead,
                                  memo=memo)

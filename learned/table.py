"""The profile-table cost model (Vidur-style lookup with interpolation).

Built from :class:`~learned.profile.OpTiming` rows. A table is keyed on
``(device_kind, kind, dim_in, dim_out)``; within it the median is interpolated linearly in
``log(latency)`` over ``log(tokens)`` (and, for attention, over ``context`` at each profiled
token count, then across token counts). At a profiled point the answer is the measured median.

Off the table:

* a shape not profiled: the nearest profiled shape (log distance in dims) of that device and
  kind, read at the point with the same work units: for decode attention, whose kernel works
  per (sequence, KV head), the batch is scaled by the ratio of KV widths (Llama-2-7B's 32 KV
  heads at batch ``b`` read as much KV as the profiled 4-per-GPU Llama-2-70B kernel at ``8b``).
  Of the time read there, the kind's fixed overhead (as the calibrated fallback fits it) stays
  and the rest is scaled by the ratio of the two points' roofline work, ``max(FLOPs / compute,
  bytes / bandwidth)`` at the kind's efficiencies, each by its own layout. (A bare FLOPs ratio,
  the rule before, ignores KV heads: it priced Llama-2-7B's decode as if it read an eighth of
  its KV, below what A100's bandwidth allows.) On the Vidur held-out models (no attention
  there) the work ratio's MAPE is 4.34 / 4.28 / 4.05 % on A100 / A40 / H100 against the FLOPs
  ratio's 4.49 / 4.37 / 4.48 %;
* a device kind not profiled: the nearest profiled kind (log distance in peak FLOP/s and
  bandwidth), scaled by the roofline ratio between the two devices;
* a kind not profiled on any device: the roofline fallback.

Quantiles come from the measured spread: ``p = p50 * (1 + z * std/mean)`` with the normal
``z`` of 0.9 and 0.99, the coefficient of variation interpolated like the median.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from learned.profile import OpTiming, timing_features
from learned.roofline import RooflineCostModel
from service.core.cost import Latency, OpFeatures
from service.domain.cluster import DEVICE_KINDS, Device

Z90, Z99 = 1.2816, 2.3263


@dataclass(frozen=True, slots=True)
class _Curve:
    """log p50 and coefficient of variation against one axis (sorted, distinct x)."""

    x: np.ndarray
    log_p50: np.ndarray
    cv: np.ndarray

    @staticmethod
    def of(points: dict[float, list[OpTiming]]) -> _Curve:
        xs = sorted(points)
        log_p50 = [float(np.mean([math.log(max(t.p50_ms, 1e-6)) for t in points[x]])) for x in xs]
        cv = [float(np.mean([t.std_ms / t.mean_ms if t.mean_ms > 0 else 0.0 for t in points[x]])) for x in xs]
        return _Curve(np.asarray(xs, dtype=float), np.asarray(log_p50), np.asarray(cv))


@dataclass(frozen=True, slots=True)
class _Table:
    """One (device_kind, kind, phase, dim_in, dim_out) table."""

    tokens_curve: _Curve | None  # non-attention kinds: over log(tokens)
    log_tokens: np.ndarray  # attention: profiled log(tokens), sorted
    context_curves: tuple[_Curve, ...]  # attention: one curve over context per profiled token count

    def lookup(self, tokens: int, context: int) -> tuple[float, float]:
        lt = math.log(max(1, tokens))
        if self.tokens_curve is not None:
            c = self.tokens_curve
            if lt > c.x[-1]:  # beyond the profile: latency proportional to tokens
                return float(c.log_p50[-1] + lt - c.x[-1]), float(c.cv[-1])
            return float(np.interp(lt, c.x, c.log_p50)), float(np.interp(lt, c.x, c.cv))
        i = bisect_left(self.log_tokens.tolist(), lt)
        if i <= 0 or i >= len(self.log_tokens):
            j = 0 if i <= 0 else len(self.log_tokens) - 1
            lp, cv = self._context(j, context)
            return (lp + (lt - self.log_tokens[j] if i > 0 else 0.0)), cv
        lo, hi = self._context(i - 1, context), self._context(i, context)
        w = (lt - self.log_tokens[i - 1]) / (self.log_tokens[i] - self.log_tokens[i - 1])
        return lo[0] + w * (hi[0] - lo[0]), lo[1] + w * (hi[1] - lo[1])

    def _context(self, j: int, context: int) -> tuple[float, float]:
        c = self.context_curves[j]
        if context > c.x[-1] and c.x[-1] > 0:  # beyond the profile: proportional to context
            return float(c.log_p50[-1] + math.log(context / c.x[-1])), float(c.cv[-1])
        return float(np.interp(context, c.x, c.log_p50)), float(np.interp(context, c.x, c.cv))


def _phase(kind: str, tokens: int, batch: int) -> str:
    if kind != "attention":
        return ""
    return "decode" if tokens == batch else "prefill"


class ProfileTableCostModel:
    """Interpolating lookup over measured operator timings; see the module docstring."""

    def __init__(self, tables: dict[tuple[str, str, str, int, int], _Table], *,
                 fallback: RooflineCostModel | None = None, dtype_bytes: int = 2, name: str = "table") -> None:
        self.name = name
        self._tables = tables
        self._fallback = fallback or RooflineCostModel()
        self._dtype_bytes = dtype_bytes
        self._shapes: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
        for dev, kind, phase, di, do in tables:
            self._shapes.setdefault((dev, kind, phase), []).append((di, do))
        self._memo: dict[tuple[OpFeatures, Device], Latency] = {}

    @staticmethod
    def from_timings(rows: Iterable[OpTiming], *, fallback: RooflineCostModel | None = None,
                     dtype_bytes: int = 2) -> ProfileTableCostModel:
        grouped: dict[tuple[str, str, str, int, int], list[OpTiming]] = {}
        for t in rows:
            key = (t.device_kind, t.kind, _phase(t.kind, t.tokens, t.batch), t.dim_in, t.dim_out)
            grouped.setdefault(key, []).append(t)
        tables: dict[tuple[str, str, str, int, int], _Table] = {}
        for key, ts in grouped.items():
            if key[1] != "attention":
                pts: dict[float, list[OpTiming]] = {}
                for t in ts:
                    pts.setdefault(math.log(max(1, t.tokens)), []).append(t)
                tables[key] = _Table(_Curve.of(pts), np.empty(0), ())
                continue
            by_tokens: dict[int, dict[float, list[OpTiming]]] = {}
            for t in ts:
                by_tokens.setdefault(t.tokens, {}).setdefault(float(t.context), []).append(t)
            toks = sorted(by_tokens)
            tables[key] = _Table(None, np.log(np.asarray(toks, dtype=float)),
                                 tuple(_Curve.of(by_tokens[k]) for k in toks))
        return ProfileTableCostModel(tables, fallback=fallback, dtype_bytes=dtype_bytes)

    def to_doc(self) -> dict[str, Any]:
        """A JSON-able copy (tables and the fallback's parameters); :meth:`from_doc` reads it."""
        def curve(c: _Curve) -> list[list[float]]:
            return [c.x.tolist(), c.log_p50.tolist(), c.cv.tolist()]

        return {
            "dtype_bytes": self._dtype_bytes, "fallback": asdict(self._fallback),
            "tables": [{"key": list(k), "tokens": None if t.tokens_curve is None else curve(t.tokens_curve),
                        "log_tokens": t.log_tokens.tolist(), "context": [curve(c) for c in t.context_curves]}
                       for k, t in self._tables.items()],
        }

    @staticmethod
    def from_doc(doc: dict[str, Any]) -> ProfileTableCostModel:
        def curve(c: list[list[float]]) -> _Curve:
            return _Curve(np.asarray(c[0], dtype=float), np.asarray(c[1], dtype=float), np.asarray(c[2], dtype=float))

        tables = {(str(e["key"][0]), str(e["key"][1]), str(e["key"][2]), int(e["key"][3]), int(e["key"][4])):
                  _Table(None if e["tokens"] is None else curve(e["tokens"]), np.asarray(e["log_tokens"], dtype=float),
                         tuple(curve(c) for c in e["context"])) for e in doc["tables"]}
        f = doc["fallback"]
        fallback = RooflineCostModel(f["compute_efficiency"], f["memory_efficiency"], f["launch_overhead_s"],
                                     (f["spread"][0], f["spread"][1]), f["overhead_by_kind"], f["name"])
        return ProfileTableCostModel(tables, fallback=fallback, dtype_bytes=int(doc["dtype_bytes"]))

    @property
    def device_kinds(self) -> set[str]:
        return {k[0] for k in self._tables}

    def predict(self, ops: Sequence[OpFeatures], device: Device) -> Latency:
        total = Latency(0.0, 0.0, 0.0)
        for op in ops:
            key = (op, device)
            lat = self._memo.get(key)
            if lat is None:
                lat = self._memo[key] = self._op(op, device)
            total = total + lat
        return total

    def predict_stack(self, prefix: Sequence[OpFeatures], block: Sequence[OpFeatures], repeats: int,
                      suffix: Sequence[OpFeatures], device: Device) -> Latency:
        """:meth:`predict` of ``prefix + block * repeats + suffix``: operators are priced alone,
        so the block's price adds up ``repeats`` times (no unrolling on the simulator's hot path)."""
        return self.predict(prefix, device) + self.predict(block, device).scaled(repeats) + self.predict(suffix, device)

    def _op(self, op: OpFeatures, device: Device) -> Latency:
        phase = _phase(op.kind, op.tokens, op.batch)
        kinds = {dev for dev, kind, ph in self._shapes if kind == op.kind and ph == phase}
        if not kinds:
            return self._fallback.predict([op], device)
        if device.kind in kinds:
            return self._on_device(op, device)
        # Nearest profiled device kind, scaled by the roofline ratio.
        other = min(kinds, key=lambda k: _device_distance(DEVICE_KINDS[k], device) if k in DEVICE_KINDS else math.inf)
        ref = DEVICE_KINDS.get(other)
        if ref is None:  # a kind without datasheet numbers: its shapes are scaled on the target's
            return self._on_device(op, device, other)
        ref_device = Device("ref", "ref", ref.name, ref.mem_bytes, ref.peak_flops, ref.mem_bw_bytes_per_s)
        lat = self._on_device(op, ref_device)
        ratio = self._fallback.op_seconds(op, device) / self._fallback.op_seconds(op, ref_device)
        return lat.scaled(ratio)

    def _on_device(self, op: OpFeatures, device: Device, device_kind: str | None = None) -> Latency:
        """``op`` from the tables of ``device_kind`` (default ``device.kind``), which ``device``'s
        numbers stand for; a shape not profiled as the module docstring says."""
        device_kind = device_kind or device.kind
        phase = _phase(op.kind, op.tokens, op.batch)
        shapes = self._shapes[(device_kind, op.kind, phase)]
        if (op.dim_in, op.dim_out) in shapes:
            di, do = op.dim_in, op.dim_out
        else:
            di, do = min(shapes, key=lambda s: abs(math.log(max(1, op.dim_in) / s[0]))
                         + abs(math.log(max(1, op.dim_out) / s[1])))
        tokens = op.tokens
        if phase == "decode" and do != op.dim_out:
            # A decode kernel's work and parallelism go by (sequence, KV head): at another KV
            # width, the profiled kernel with as many of them reads as much KV.
            tokens = max(1, round(op.tokens * op.dim_out / do))
        log_p50, cv = self._tables[(device_kind, op.kind, phase, di, do)].lookup(tokens, op.context)
        p50_s = math.exp(log_p50) / 1e3
        if (di, do, tokens) != (op.dim_in, op.dim_out, op.tokens):
            p50_s = self._rescaled(p50_s, op, OpTiming(device.kind, "", "", op.kind, tokens, di, do, op.context,
                                                       tokens if phase == "decode" else op.batch, 1, 0, 0, 0, 0, 0),
                                   device)
        cv = max(0.0, cv)
        return Latency(p50_s, p50_s * (1 + Z90 * cv), p50_s * (1 + Z99 * cv))

    def _rescaled(self, p50_s: float, op: OpFeatures, at: OpTiming, device: Device) -> float:
        """``p50_s`` measured at the profiled point ``at`` taken to ``op``: the fitted fixed part
        stays, the rest scales by the two points' roofline work."""
        ref = timing_features(at, self._dtype_bytes)
        mine = timing_features(replace(at, tokens=op.tokens, dim_in=op.dim_in, dim_out=op.dim_out, batch=op.batch),
                               self._dtype_bytes)
        ref_work = self._fallback.work_seconds(ref, device)
        if ref_work <= 0:
            return p50_s
        fixed = min(p50_s, self._fallback.overhead_by_kind.get(op.kind, self._fallback.launch_overhead_s))
        return fixed + (p50_s - fixed) * self._fallback.work_seconds(mine, device) / ref_work


def _device_distance(kind: object, device: Device) -> float:
    peak = getattr(kind, "peak_flops", 1.0)
    bw = getattr(kind, "mem_bw_bytes_per_s", 1.0)
    return abs(math.log(peak / device.peak_flops)) + abs(math.log(bw / device.mem_bw_bytes_per_s))

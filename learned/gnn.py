"""A graph neural network cost model over a slice's operator subgraph (torch-geometric).

Input graph: one node per operator, messages both ways along the slice's data dependencies:
its real producer -> consumer edges (:meth:`GnnCostModel.predict_graph`, e.g. the residual
connections of a transformer layer), or the chain of consecutive operators
(:meth:`GnnCostModel.predict`, a slice known only as an op sequence). Node features: kind one-hot, log FLOPs, log bytes, log
tokens, log dims, log context, log batch, and the two roofline times ``log(flops/peak)`` and
``log(bytes/bw)``; the device (log peak FLOP/s, log bandwidth) is broadcast to every node.
Features are standardised with statistics saved in the artifact.

Output, in log milliseconds: every node predicts its own log latency (by default as a
correction to the default roofline time, so an unseen device is scaled physically); the slice's median is
``logsumexp`` over its nodes (latencies add), so a graph of any size is answered and a node
level loss can use per-operator medians. A training sample may count only some of its nodes
(``GraphSample.counted``): the others pass messages but their time is not in the target (an
operator the profiles do not time, such as attention in a traced layer). A graph head adds ``softplus`` gaps for p90 and p99
(monotone by construction), trained with the pinball loss on a detached median.

Training (:func:`train_gnn`) is a function, never a constructor; artifacts live in a directory
named by a hash of the training data digests and the config (:func:`artifact_dir`), and are
loaded explicitly with :meth:`GnnCostModel.load`. Predictions are memoised on bucketed
features (a 1/64-octave grid of FLOPs and bytes, exact integers for the rest) and computed
from the bucket's representative, so a memoised answer equals a fresh one.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from learned.roofline import RooflineCostModel
from service.core.cost import OP_KINDS, Edge, Latency, OpFeatures, chain_edges, check_edges
from service.domain.cluster import Device

_KIND_INDEX = {k: i for i, k in enumerate(OP_KINDS)}
N_FEATURES = len(OP_KINDS) + 9 + 2
_BUCKETS_PER_OCTAVE = 64
_MEMO_LIMIT = 1 << 18


@dataclass(frozen=True)
class GnnConfig:
    """Hyper-parameters; part of the artifact hash."""

    hidden: int = 64
    layers: int = 2
    epochs: int = 40
    batch_graphs: int = 256
    lr: float = 3e-3
    weight_decay: float = 1e-5
    node_loss_weight: float = 0.5
    seed: int = 0
    threads: int = 1
    device_features: bool = True  # False: device-dependent features are zeroed (device enters via the roofline base)
    roofline_base: bool = True  # node output is a log correction to the default roofline time


@dataclass(frozen=True, slots=True)
class GraphSample:
    """One training example: an operator graph on a device and its measured median (ms).

    ``op_targets_ms``: per-operator medians where known (same length as ``ops``; nan for an
    unknown one), else None. ``edges``: (producer, consumer) positions in ``ops``; None is the
    chain. ``counted``: the operators whose time ``target_ms`` covers (None: all of them).
    """

    ops: tuple[OpFeatures, ...]
    device: Device
    target_ms: float
    op_targets_ms: tuple[float, ...] | None = None
    edges: tuple[Edge, ...] | None = None
    counted: tuple[bool, ...] | None = None


@dataclass
class _Flat:
    """Samples flattened into node arrays (CSR by sample)."""

    x: np.ndarray  # [nodes, N_FEATURES] raw (unstandardised) features
    node_target: np.ndarray  # [nodes] log ms, nan where unknown
    base: np.ndarray  # [nodes] log ms of the default roofline (0 when roofline_base is off)
    weight: np.ndarray  # [nodes] 1 where the node's time is in its sample's target, else 0
    offsets: np.ndarray  # [samples + 1]
    target: np.ndarray  # [samples] log ms
    edges: np.ndarray  # [2, edges] (low, high) node positions within their sample
    edge_offsets: np.ndarray  # [samples + 1]
    graph: np.ndarray  # [samples] True where the sample's edges are not the chain


def _raw_features(ops: Sequence[OpFeatures], device: Device) -> np.ndarray:
    x = np.zeros((len(ops), N_FEATURES), dtype=np.float64)
    n = len(OP_KINDS)
    lp, lb = math.log(device.peak_flops), math.log(device.mem_bw_bytes_per_s)
    for i, op in enumerate(ops):
        x[i, _KIND_INDEX.get(op.kind, _KIND_INDEX["elementwise"])] = 1.0
        x[i, n:n + 9] = (
            math.log1p(op.flops), math.log1p(op.bytes_moved), math.log1p(op.tokens), math.log1p(op.dim_in),
            math.log1p(op.dim_out), math.log1p(op.context), math.log1p(op.batch),
            math.log1p(op.flops) - lp, math.log1p(op.bytes_moved) - lb,
        )
        x[i, n + 9:] = (lp, lb)
    return x


def _flatten(samples: Sequence[GraphSample], config: GnnConfig) -> _Flat:
    xs, node_t, lengths, base, weights, edges, edge_counts, graph = [], [], [], [], [], [], [], []
    roofline = RooflineCostModel()
    for s in samples:
        xs.append(_raw_features(s.ops, s.device))
        chain = chain_edges(len(s.ops))
        pairs = chain if s.edges is None else check_edges(len(s.ops), s.edges)
        graph.append(pairs != chain)
        edges.append(np.asarray(pairs, dtype=np.int64).reshape(-1, 2))
        edge_counts.append(len(pairs))
        weights.append(np.ones(len(s.ops)) if s.counted is None else np.asarray(s.counted, dtype=np.float64))
        if config.roofline_base:
            base.append(np.log([roofline.op_seconds(op, s.device) * 1e3 for op in s.ops]))
        else:
            base.append(np.zeros(len(s.ops)))
        if s.op_targets_ms is not None:
            node_t.append(np.log(np.maximum(np.asarray(s.op_targets_ms, dtype=np.float64), 1e-6)))
        else:
            node_t.append(np.full(len(s.ops), np.nan))
        lengths.append(len(s.ops))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    target = np.log(np.maximum(np.asarray([s.target_ms for s in samples], dtype=np.float64), 1e-6))
    x = np.concatenate(xs)
    if not config.device_features:
        x[:, -4:] = 0.0
    return _Flat(x, np.concatenate(node_t), np.concatenate(base), np.concatenate(weights), offsets, target,
                 np.concatenate(edges).T.copy(), np.concatenate([[0], np.cumsum(edge_counts)]).astype(np.int64),
                 np.asarray(graph, dtype=bool))


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The concatenated index ranges ``starts[i]:ends[i]``."""
    lengths = ends - starts
    return np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(lengths.sum())


class _Net(nn.Module):
    def __init__(self, config: GnnConfig) -> None:
        super().__init__()
        h = config.hidden
        self.encode = nn.Sequential(nn.Linear(N_FEATURES, h), nn.SiLU(), nn.Linear(h, h))
        # imported here, not with the module: torch_geometric takes seconds (it loads torch._dynamo), and
        # a service costing with the roofline or the profile table never builds a network
        from torch_geometric.nn import GraphConv

        self.convs = nn.ModuleList(GraphConv(h, h) for _ in range(config.layers))
        self.norms = nn.ModuleList(nn.LayerNorm(h) for _ in range(config.layers))
        self.node_head = nn.Sequential(nn.Linear(h, h), nn.SiLU(), nn.Linear(h, 1))
        self.gap_head = nn.Sequential(nn.Linear(h + 1, h), nn.SiLU(), nn.Linear(h, 2))

    def forward(self, x: Tensor, base: Tensor, edge_index: Tensor, batch: Tensor, n_graphs: int,
                weight: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(node log ms [nodes], graph log quantiles [graphs, 3], ...) with p50 <= p90 <= p99.

        ``weight`` [nodes]: how many times each node stands in its graph (1 when None); a graph
        whose repeated part is given once with its multiplicity answers as the unrolled graph.
        """
        from torch_geometric.utils import scatter

        h = self.encode(x)
        for conv, norm in zip(self.convs, self.norms, strict=True):
            h = norm(h + torch.nn.functional.silu(conv(h, edge_index)))
        node = base + self.node_head(h).squeeze(-1)
        w = torch.ones_like(node) if weight is None else weight
        # the largest counted node (a node weighted 0 is context only)
        peak = scatter(node.detach().masked_fill(w <= 0, -1e4), batch, dim=0, dim_size=n_graphs, reduce="max")
        log_p50 = peak + torch.log(scatter(w * torch.exp(node - peak[batch]), batch, dim=0, dim_size=n_graphs,
                                           reduce="sum"))
        pooled = scatter(w[:, None] * h, batch, dim=0, dim_size=n_graphs, reduce="sum") \
            / scatter(w, batch, dim=0, dim_size=n_graphs, reduce="sum")[:, None]
        gaps = torch.nn.functional.softplus(self.gap_head(torch.cat([pooled, log_p50.detach()[:, None]], dim=1)))
        log_p90 = log_p50.detach() + gaps[:, 0]
        log_p99 = log_p90 + gaps[:, 1]
        return node, torch.stack([log_p50, log_p90, log_p99], dim=1), gaps


def _pinball(residual: Tensor, q: float) -> Tensor:
    return torch.maximum(q * residual, (q - 1) * residual).mean()


@dataclass
class TrainReport:
    epochs: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0


class GnnCostModel:
    """A trained network plus its feature statistics; implements the CostModel protocol.

    ``quantile_shift``: log offsets added to the network's p90 and p99 for a graph whose edges
    are not the chain (0 as trained; see :mod:`learned.calibration`), p50 <= p90 <= p99 kept. A
    chain (an operator sequence, as the profiles time it) keeps the trained quantiles.
    """

    def __init__(self, net: _Net, config: GnnConfig, mean: np.ndarray, std: np.ndarray,
                 meta: dict[str, object] | None = None, name: str = "gnn",
                 quantile_shift: tuple[float, float] = (0.0, 0.0)) -> None:
        self.name = name
        self.config = config
        self.meta = dict(meta or {})
        self.quantile_shift = (float(quantile_shift[0]), float(quantile_shift[1]))
        self._net = net.eval()
        self._mean = mean.astype(np.float64)
        self._std = std.astype(np.float64)
        self._memo: dict[tuple[object, ...], Latency] = {}
        self.memo_hits = 0

    def with_quantile_shift(self, shift: tuple[float, float]) -> GnnCostModel:
        """The same network answering with ``shift`` (a fresh memo)."""
        return GnnCostModel(self._net, self.config, self._mean, self._std, self.meta, self.name, shift)

    # -- the hot path -----------------------------------------------------------------------
    def predict(self, ops: Sequence[OpFeatures], device: Device) -> Latency:
        """Latency of ``ops`` run as a chain (each feeds the next)."""
        return self._cached(ops, None, device)

    def predict_graph(self, ops: Sequence[OpFeatures], edges: Sequence[Edge], device: Device) -> Latency:
        """Latency of the slice ``ops`` with data dependencies ``edges`` ((producer, consumer)
        positions; messages pass both ways, so direction and repeats do not matter). The chain's
        edges give exactly :meth:`predict`; bad edges are an ``InvalidInputError``."""
        pairs = check_edges(len(ops), edges)
        return self._cached(ops, None if pairs == chain_edges(len(ops)) else pairs, device)

    def _cached(self, ops: Sequence[OpFeatures], edges: tuple[Edge, ...] | None, device: Device) -> Latency:
        if not ops:
            return Latency(0.0, 0.0, 0.0)
        key = _memo_key(ops, device, edges)
        lat = self._memo.get(key)
        if lat is not None:
            self.memo_hits += 1
            return lat
        lat = self._forward([_representative(key)])[0]
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = lat
        return lat

    def predict_many(self, slices: Sequence[tuple[Sequence[OpFeatures], Device]],
                     chunk: int = 4096) -> list[Latency]:
        """Batched :meth:`predict` (same answers, filled into the memo)."""
        keys = [_memo_key(ops, dev) for ops, dev in slices]
        missing = list(dict.fromkeys(k for k in keys if k not in self._memo))
        for i in range(0, len(missing), chunk):
            part = missing[i:i + chunk]
            for k, lat in zip(part, self._forward([_representative(k) for k in part]), strict=True):
                self._memo[k] = lat
        return [self._memo[k] for k in keys]

    def predict_samples(self, samples: Sequence[GraphSample], chunk: int = 1024) -> list[Latency]:
        """For evaluation: the latency of each sample's counted operators, run inside its whole
        graph, as training sees it (``target_ms`` and ``op_targets_ms`` are ignored; no memo)."""
        out: list[Latency] = []
        for i in range(0, len(samples), chunk):
            out += self._forward_samples(samples[i:i + chunk])
        return out

    def predict_stack(self, prefix: Sequence[OpFeatures], block: Sequence[OpFeatures], repeats: int,
                      suffix: Sequence[OpFeatures], device: Device) -> Latency:
        """:meth:`predict` of ``prefix + block * repeats + suffix`` without unrolling the block.

        A node sees ``config.layers`` hops, so when the block is longer than that every inner
        copy has the same neighbourhood: the graph is run with three copies (first, middle,
        last) and the middle one weighted ``repeats - 2``. Same answer as the unrolled graph.
        """
        if repeats <= 3 or len(block) <= self.config.layers:
            return self.predict([*prefix, *(list(block) * repeats), *suffix], device)
        ops = [*prefix, *block, *block, *block, *suffix]
        inner = _memo_key(ops, device, None)
        key = ("stack", repeats, len(prefix), len(block), inner)
        lat = self._memo.get(key)
        if lat is not None:
            self.memo_hits += 1
            return lat
        weight = np.ones(len(ops))
        weight[len(prefix) + len(block):len(prefix) + 2 * len(block)] = repeats - 2
        lat = self._forward([_representative(inner)], weight)[0]
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = lat
        return lat

    def _forward(self, slices: Sequence[tuple[Sequence[OpFeatures], tuple[Edge, ...] | None, Device]],
                 weight: np.ndarray | None = None) -> list[Latency]:
        return self._forward_samples([GraphSample(tuple(ops), dev, 1.0, edges=edges) for ops, edges, dev in slices],
                                     weight)

    def _forward_samples(self, samples: Sequence[GraphSample], weight: np.ndarray | None = None) -> list[Latency]:
        flat = _flatten(samples, self.config)
        # Graphs this small run fastest on one thread (20x faster than two on a busy 2-core machine).
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(self.config.threads)
        try:
            with torch.no_grad():
                _, q, _ = _run(self._net, flat, np.arange(len(samples)), self._mean, self._std, weight)
        finally:
            torch.set_num_threads(previous_threads)
        log_ms = q.double().numpy()
        p90 = np.maximum(log_ms[:, 1] + flat.graph * self.quantile_shift[0], log_ms[:, 0])
        p99 = np.maximum(log_ms[:, 2] + flat.graph * self.quantile_shift[1], p90)
        ms = np.exp(np.stack([log_ms[:, 0], p90, p99], axis=1))
        return [Latency(float(a) / 1e3, float(b) / 1e3, float(c) / 1e3) for a, b, c in ms]

    # -- artifacts ------------------------------------------------------------------------------
    def save(self, directory: Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self._net.state_dict(), directory / "weights.pt")
        (directory / "model.json").write_text(json.dumps({
            "config": asdict(self.config), "mean": self._mean.tolist(), "std": self._std.tolist(),
            "meta": self.meta, "n_features": N_FEATURES, "op_kinds": list(OP_KINDS),
            "quantile_shift": list(self.quantile_shift),
        }, indent=2, default=str) + "\n")
        return directory

    @staticmethod
    def load(directory: Path) -> GnnCostModel:
        directory = Path(directory)
        doc = json.loads((directory / "model.json").read_text())
        if doc["n_features"] != N_FEATURES or doc["op_kinds"] != list(OP_KINDS):
            raise ValueError(f"{directory}: artifact features do not match this code version")
        config = GnnConfig(**doc["config"])
        net = _Net(config)
        net.load_state_dict(torch.load(directory / "weights.pt", weights_only=True))
        shift = doc.get("quantile_shift", (0.0, 0.0))
        return GnnCostModel(net, config, np.asarray(doc["mean"]), np.asarray(doc["std"]), doc.get("meta"),
                            quantile_shift=(float(shift[0]), float(shift[1])))


def _quantise(value: float) -> int:
    return round(math.log2(value + 1.0) * _BUCKETS_PER_OCTAVE)


def _memo_key(ops: Sequence[OpFeatures], device: Device, edges: tuple[Edge, ...] | None = None
              ) -> tuple[object, ...]:
    """Bucketed features; ``edges`` canonical (:func:`check_edges`), None for the chain."""
    return (float(device.peak_flops), float(device.mem_bw_bytes_per_s),
            tuple((op.kind, _quantise(op.flops), _quantise(op.bytes_moved), op.tokens, op.dim_in, op.dim_out,
                   op.context, op.batch, op.dtype_bytes) for op in ops), edges)


def _representative(key: tuple[object, ...]) -> tuple[list[OpFeatures], tuple[Edge, ...] | None, Device]:
    peak, bw, ops, edges = key
    assert isinstance(peak, float) and isinstance(bw, float) and isinstance(ops, tuple)
    assert edges is None or isinstance(edges, tuple)
    dev = Device("memo", "memo", "memo", 1, peak, bw)
    return [OpFeatures(kind, 2.0 ** (qf / _BUCKETS_PER_OCTAVE) - 1.0, 2.0 ** (qb / _BUCKETS_PER_OCTAVE) - 1.0,
                       tokens=t, dim_in=di, dim_out=do, context=c, batch=b, dtype_bytes=db)
            for kind, qf, qb, t, di, do, c, b, db in ops], edges, dev


def _run(net: _Net, flat: _Flat, samples: np.ndarray, mean: np.ndarray, std: np.ndarray,
         weight: np.ndarray | None = None) -> tuple[Tensor, Tensor, np.ndarray]:
    """Forward ``samples`` (indices into ``flat``): (node log ms, graph log quantiles, node indices);
    ``weight``: node multiplicities of the selected nodes, in order (see :meth:`_Net.forward`),
    times the flattened samples' own weights (0 for a node not counted)."""
    starts, ends = flat.offsets[samples], flat.offsets[samples + 1]
    lengths = ends - starts
    batch = np.repeat(np.arange(len(samples)), lengths)
    nodes = _ranges(starts, ends)
    # each selected sample's first node in the batch, repeated for each of its edges
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    e_starts, e_ends = flat.edge_offsets[samples], flat.edge_offsets[samples + 1]
    shift = np.repeat(first, e_ends - e_starts)
    pairs = flat.edges[:, _ranges(e_starts, e_ends)] + shift
    edges = torch.from_numpy(np.concatenate([pairs, pairs[::-1]], axis=1))
    x = torch.from_numpy(((flat.x[nodes] - mean) / std).astype(np.float32))
    base = torch.from_numpy(flat.base[nodes].astype(np.float32))
    w_np = flat.weight[nodes] if weight is None else flat.weight[nodes] * weight
    w = None if bool(np.all(w_np == 1.0)) else torch.from_numpy(w_np.astype(np.float32))
    node, q, _ = net(x, base, edges, torch.from_numpy(batch), len(samples), w)
    return node, q, nodes


def train_gnn(samples: Sequence[GraphSample], config: GnnConfig = GnnConfig(), *,
              progress: Callable[[dict[str, float]], None] | None = None,
              meta: dict[str, object] | None = None) -> tuple[GnnCostModel, TrainReport]:
    """Fit a :class:`GnnCostModel` to ``samples``; deterministic for a given ``config.seed``.

    ``progress`` is called once per epoch with ``{epoch, loss, mape_train, seconds}``. Uses
    ``config.threads`` torch threads while training and restores the previous setting.
    """
    if not samples:
        raise ValueError("train_gnn needs at least one sample")
    started = time.perf_counter()
    flat = _flatten(samples, config)
    mean = flat.x.mean(axis=0)
    std = flat.x.std(axis=0)
    std[std < 1e-6] = 1.0
    rng = np.random.default_rng(config.seed)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(config.seed)  # parameter init only; the global state is restored
            net = _Net(config)
        opt = torch.optim.AdamW(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        steps_per_epoch = max(1, math.ceil(len(samples) / config.batch_graphs))
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=config.epochs * steps_per_epoch,
                                                    pct_start=0.15)
        report = TrainReport()
        target = torch.from_numpy(flat.target.astype(np.float32))
        node_target = torch.from_numpy(flat.node_target.astype(np.float32))
        for epoch in range(config.epochs):
            net.train()
            order = rng.permutation(len(samples))
            total, abs_err, count = 0.0, 0.0, 0
            for i in range(0, len(order), config.batch_graphs):
                idx = order[i:i + config.batch_graphs]
                node, q, nodes = _run(net, flat, idx, mean, std)
                y = target[idx]
                loss = (q[:, 0] - y).abs().mean() + _pinball(y - q[:, 1], 0.9) + _pinball(y - q[:, 2], 0.99)
                nt = node_target[nodes]
                known = ~torch.isnan(nt)
                if config.node_loss_weight > 0 and bool(known.any()):
                    loss = loss + config.node_loss_weight * (node[known] - nt[known]).abs().mean()
                opt.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                opt.step()
                sched.step()
                total += loss.item() * len(idx)
                abs_err += float((torch.exp(q[:, 0].detach() - y) - 1).abs().sum())
                count += len(idx)
            line = {"epoch": epoch + 1, "loss": total / count, "mape_train": abs_err / count,
                    "seconds": time.perf_counter() - started}
            report.epochs.append(line)
            if progress is not None:
                progress(line)
    finally:
        torch.set_num_threads(previous_threads)
    report.seconds = time.perf_counter() - started
    return GnnCostModel(net, config, mean, std, meta), report


def artifact_dir(root: Path, data_digests: Sequence[str], config: GnnConfig, extra: str = "") -> Path:
    """``root/gnn-<hash>``, the hash over sorted data digests, the config and ``extra`` (e.g. split)."""
    h = hashlib.sha256()
    for d in sorted(data_digests):
        h.update(d.encode())
    h.update(json.dumps(asdict(config), sort_keys=True).encode())
    h.update(extra.encode())
    return Path(root) / f"gnn-{h.hexdigest()[:16]}"

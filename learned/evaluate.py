"""Held-out accuracy of the three cost models, and the ``cost-model evaluate`` command.

Splits of the Vidur MLP profiles (each test case = one transformer layer's non-attention
operator chain, target = the sum of its per-operator medians):

* ``model``: train on Llama-2-7b, Llama-2-70b, CodeLlama-34b, Llama-3-8B/70B and phi-2; test on
  internlm-20b (d=5120, MHA) and Qwen-72B (d=8192, MHA, d_ff=24576), on all three GPUs. Both
  test shapes are unseen but inside the training range of widths, which is the case the
  scheduler meets: a tenant's new model on profiled hardware.
* ``device-a40``: train on A100 + H100, test on A40 (a slower, unseen GPU: extrapolation).
* ``device-a40-to-gpus``: the reverse, train on A40 only, test on A100 + H100.
* ``device-a100``: train on A40 + H100, test on A100 (a GPU between the two seen ones).

The CPU profile split holds out a seeded 25 % of our profiler's rows (single operators).

Metrics: MAPE of the median against the measured median; p90 (p99) coverage, the fraction of
held-out measurements at or below the predicted p90 (p99). Vidur publishes per-row summaries,
so a row's median stands for one observation.

Per slice (``per_slice`` in a split's result, when :class:`SliceData` is given): the same
metrics over operator slices of traced models with their real edges, timed by the same rows
(:mod:`learned.slices`); the GNN also trains on the training part's slices.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from learned.calibration import cross_conformal_shift, group_folds
from learned.gnn import GnnConfig, GnnCostModel, GraphSample, train_gnn
from learned.profile import (
    LAYER_CHAIN,
    OpTiming,
    ProfileStore,
    layer_chains,
    read_vidur_attention,
    read_vidur_compute,
    timing_features,
)
from learned.roofline import RooflineCostModel, device_of_kind
from learned.slices import SLICE_KINDS, TimedSlice, timed_slices, vidur_configs
from learned.table import ProfileTableCostModel
from service.core.cost import CostModel, Latency, OpFeatures, floored
from service.data import locate, resolve
from service.domain.cluster import Device
from service.domain.model_config import ModelConfig

VIDUR_DATASET = "vidur-profiling"  # its name in the data manifest (service/data/manifest.json)
VIDUR_ROOT = Path(VIDUR_DATASET) / "profiling"
ATTENTION_CSV = VIDUR_ROOT / "legacy-a100" / "attention.csv"
MODEL_TEST = ("internlm-20b", "Qwen-72B")
SPLITS: tuple[str, ...] = ("model", "device-a40", "device-a40-to-gpus", "device-a100")


def default_data_dir() -> Path:
    """The data folder whose Vidur profiles are complete: ``$SLICESCHED_DATA``, else
    ``../shared/data`` (:func:`service.data.locate`); the cache, where fetch puts them, when neither."""
    return locate(VIDUR_DATASET).parent


@dataclass(frozen=True)
class Split:
    name: str
    description: str
    train: list[OpTiming]
    test: list[OpTiming]


@dataclass(frozen=True)
class SliceData:
    """Per-slice evaluation: model shapes (:func:`learned.slices.vidur_configs`) and how many
    token counts per model the training and the held-out slices take (None: all)."""

    configs: dict[str, ModelConfig]
    train_tokens_per_model: int | None = 24
    test_tokens_per_model: int | None = 32

    @staticmethod
    def of(data_dir: Path, *, train_tokens: int | None = 24, test_tokens: int | None = 32) -> SliceData:
        return SliceData(vidur_configs(data_dir / VIDUR_ROOT / "compute"), train_tokens, test_tokens)


@dataclass(frozen=True, slots=True)
class Case:
    """One held-out measurement: operators, device and the measured median (ms)."""

    ops: tuple[OpFeatures, ...]
    device: Device
    observed_ms: float


def vidur_split(name: str, rows: Sequence[OpTiming]) -> Split:
    """One of :data:`SPLITS` over Vidur rows (see the module docstring)."""
    def by(pred: Callable[[OpTiming], bool], desc: str) -> Split:
        return Split(name, desc, [t for t in rows if not pred(t)], [t for t in rows if pred(t)])

    if name == "model":
        return by(lambda t: t.model in MODEL_TEST, f"test models {', '.join(MODEL_TEST)}; train the rest")
    if name == "device-a40":
        return by(lambda t: t.device_kind == "A40", "train A100-80GB + H100-80GB, test A40")
    if name == "device-a40-to-gpus":
        return by(lambda t: t.device_kind != "A40", "train A40, test A100-80GB + H100-80GB")
    if name == "device-a100":
        return by(lambda t: t.device_kind == "A100-80GB", "train A40 + H100-80GB, test A100-80GB")
    raise ValueError(f"unknown split {name!r} (known: {', '.join(SPLITS)})")


def cpu_split(rows: Sequence[OpTiming], seed: int, test_fraction: float = 0.25) -> Split:
    rng = np.random.default_rng(seed)
    test = rng.random(len(rows)) < test_fraction
    return Split("cpu", f"CPU profile, seeded {test_fraction:.0%} of rows held out",
                 [t for t, m in zip(rows, test, strict=True) if not m], [t for t, m in zip(rows, test, strict=True) if m])


def _device(kind: str, cache: dict[str, Device]) -> Device:
    if kind not in cache:
        cache[kind] = device_of_kind(kind)
    return cache[kind]


def training_samples(rows: Sequence[OpTiming], *, seed: int, subchains: bool = True) -> list[GraphSample]:
    """GNN samples: each layer chain (per-op targets too), one random sub-chain of it, every
    other operator (embedding, attention, our profiler's ops) as a one-node graph."""
    rng = np.random.default_rng(seed)
    devices: dict[str, Device] = {}
    out: list[GraphSample] = []
    in_chain: set[int] = set()
    for chain in layer_chains(rows):
        in_chain.update(id(t) for t in chain)
        dev = _device(chain[0].device_kind, devices)
        ops = tuple(timing_features(t) for t in chain)
        meds = tuple(t.p50_ms for t in chain)
        out.append(GraphSample(ops, dev, math.fsum(meds), meds))
        if subchains and len(chain) > 1:
            n = int(rng.integers(1, len(chain)))
            s = int(rng.integers(0, len(chain) - n + 1))
            out.append(GraphSample(ops[s:s + n], dev, math.fsum(meds[s:s + n]), meds[s:s + n]))
    for t in rows:
        if id(t) not in in_chain:
            out.append(GraphSample((timing_features(t),), _device(t.device_kind, devices), t.p50_ms, (t.p50_ms,)))
    return out


def held_out_cases(rows: Sequence[OpTiming], *, chains: bool) -> list[Case]:
    """Layer chains of ``rows`` (``chains=True``), else every row as a one-operator case."""
    devices: dict[str, Device] = {}
    if chains:
        return [Case(tuple(timing_features(t) for t in c), _device(c[0].device_kind, devices),
                     math.fsum(t.p50_ms for t in c)) for c in layer_chains(rows)]
    return [Case((timing_features(t),), _device(t.device_kind, devices), t.p50_ms) for t in rows]


def score(model: CostModel, cases: Sequence[Case]) -> dict[str, float]:
    """MAPE of the median (%) and p90/p99 coverage over ``cases``."""
    if isinstance(model, GnnCostModel):
        preds = model.predict_many([(c.ops, c.device) for c in cases])
    else:
        preds = [model.predict(c.ops, c.device) for c in cases]
    return _metrics(np.asarray([c.observed_ms for c in cases]), preds)


# The engines' caps the simulator runs: sequences per decode iteration, tokens per prefill.
MAX_DECODE_BATCH = 256
MAX_PREFILL_TOKENS = 4096
NOMINAL_LAYERS = 32  # the stack depth an iteration case is priced at (answers are per layer)


@dataclass(frozen=True, slots=True)
class IterationCase:
    """One held-out iteration of a profiled model as the simulator prices it.

    ``layer``: one layer's non-attention operators as :func:`service.sim.iteration.iteration_parts`
    builds them for the iteration (q, k and v apart, the rotary elementwise operators, both
    residual adds; a decode of ``tokens`` sequences has ``batch = tokens``, a prefill one sequence
    of ``tokens``). ``observed_ms``: that layer's measured time, the Vidur layer chain of the same
    model, device and token count with its residual add counted twice (Vidur times one per layer).
    Attention is left out of both: its only profile is one shape, no held-out model's.
    """

    phase: str
    model: str
    tokens: int
    device: Device
    layer: tuple[OpFeatures, ...]
    observed_ms: float


def held_out_iterations(rows: Sequence[OpTiming], configs: dict[str, ModelConfig]) -> list[IterationCase]:
    """Decode iterations of 1 .. :data:`MAX_DECODE_BATCH` sequences and prefills of up to
    :data:`MAX_PREFILL_TOKENS` tokens, at every token count the TP-1 layer chains of ``rows``
    (of models in ``configs``) were measured at."""
    from service.sim.iteration import BatchFeatures, iteration_parts

    devices: dict[str, Device] = {}
    out: list[IterationCase] = []
    for chain in layer_chains([t for t in rows if t.tp == 1 and t.model in configs]):
        if tuple(t.op for t in chain) != LAYER_CHAIN:
            continue
        first = chain[0]
        observed = math.fsum(t.p50_ms for t in chain) + next(t.p50_ms for t in chain if t.op == "add")
        shapes = [("prefill", BatchFeatures.of([(first.tokens, 0)], []))] if first.tokens <= MAX_PREFILL_TOKENS else []
        if first.tokens <= MAX_DECODE_BATCH:
            shapes.append(("decode", BatchFeatures.of([], [first.tokens] * first.tokens)))
        for phase, batch in shapes:
            _, layer, _ = iteration_parts(configs[first.model], batch)
            out.append(IterationCase(phase, first.model, first.tokens, _device(first.device_kind, devices),
                                     tuple(op for op in layer if op.kind != "attention"), observed))
    return out


def score_iterations(model: CostModel, cases: Sequence[IterationCase]) -> dict[str, Any]:
    """Per phase :func:`score`'s metrics of ``model`` priced as the simulator prices an iteration
    (a stack of :data:`NOMINAL_LAYERS` layers through the physical floor, per layer), and
    ``mape_pct``: the mean of the phases' MAPEs (decode and prefill weigh the same, however many
    token counts each has)."""
    priced = floored(model)
    out: dict[str, Any] = {}
    for phase in ("decode", "prefill"):
        mine = [c for c in cases if c.phase == phase]
        if mine:
            preds = [priced.predict_stack([], c.layer, NOMINAL_LAYERS, [], c.device).scaled(1 / NOMINAL_LAYERS)
                     for c in mine]
            out[phase] = _metrics(np.asarray([c.observed_ms for c in mine]), preds)
    out["mape_pct"] = float(np.mean([out[p]["mape_pct"] for p in ("decode", "prefill") if p in out])) if out \
        else math.nan
    return out


def slice_predictions(model: CostModel, slices: Sequence[TimedSlice]) -> list[Latency]:
    """Each model's latency of a slice's counted operators: the GNN runs the whole slice graph
    (uncounted nodes pass messages); the table and the roofline price operators alone, so the
    counted ones are summed (edges change nothing for them)."""
    if isinstance(model, GnnCostModel):
        return model.predict_samples([s.sample for s in slices])
    return [model.predict([op for op, c in zip(s.sample.ops, s.sample.counted or (), strict=True) if c]
                          if s.sample.counted is not None else s.sample.ops, s.sample.device) for s in slices]


def score_slices(model: CostModel, slices: Sequence[TimedSlice]) -> dict[str, Any]:
    """:func:`score`'s metrics over ``slices``, overall and per slice kind (``by_kind``: MAPE)."""
    preds = slice_predictions(model, slices)
    obs = np.asarray([s.sample.target_ms for s in slices])
    out: dict[str, Any] = _metrics(obs, preds)
    out["by_kind_mape_pct"] = {}
    for kind in SLICE_KINDS:
        mine = [i for i, s in enumerate(slices) if s.kind == kind]
        if mine:
            out["by_kind_mape_pct"][kind] = _metrics(obs[mine], [preds[i] for i in mine])["mape_pct"]
    return out


def _metrics(obs: np.ndarray, preds: Sequence[Latency]) -> dict[str, Any]:
    p50 = np.asarray([p.p50_s for p in preds]) * 1e3
    p90 = np.asarray([p.p90_s for p in preds]) * 1e3
    p99 = np.asarray([p.p99_s for p in preds]) * 1e3
    ape = np.abs(p50 - obs) / obs
    # the median signed error: a bias shared by a held-out model or GPU (negative: too fast)
    return {"mape_pct": float(100 * ape.mean()), "median_ape_pct": float(100 * np.median(ape)),
            "median_error_pct": float(100 * np.median((p50 - obs) / obs)),
            "p90_coverage": float((obs <= p90).mean()), "p99_coverage": float((obs <= p99).mean()),
            "n": len(obs)}


def evaluate_split(split: Split, config: GnnConfig, *, chains: bool = True, max_train_samples: int | None = None,
                   progress: Callable[[dict[str, float]], None] | None = None,
                   slices: SliceData | None = None, calibrate: bool = True) -> dict[str, Any]:
    """Fit roofline (calibrated), table and GNN on ``split.train``; score all on ``split.test``
    (and on its slices, with ``slices``: the GNN then trains on the training part's slices too;
    ``max_train_samples`` caps the other samples only). ``calibrate`` (with ``slices``): the
    GNN's p90 and p99 on slices take the cross-conformal shifts of companion GNNs, each trained
    without one of two folds of the training part's models (device kinds, for a device split)
    and measured on that fold's slices (:mod:`learned.calibration`)."""
    samples = _gnn_samples(split.train, config, max_train_samples, slices)
    devices: dict[str, Device] = {}
    roofline = RooflineCostModel()
    calibrated = roofline.calibrated((timing_features(t), _device(t.device_kind, devices), t.p50_ms / 1e3)
                                     for t in split.train)
    table = ProfileTableCostModel.from_timings(split.train, fallback=calibrated)
    gnn, report = train_gnn(samples, config, progress=progress, meta={"split": split.name})
    calibration: dict[str, Any] = {"folds": [], "shift": [0.0, 0.0]}
    if calibrate and slices is not None:
        by = "device_kind" if split.name.startswith("device") else "model"
        groups = {getattr(t, by) for t in split.train} if by == "device_kind" else set(slices.configs)
        shifts: list[tuple[GnnCostModel, list[GraphSample]]] = []
        for fit, held in group_folds(split.train, by, groups, seed=config.seed):
            companion, _ = train_gnn(_gnn_samples(fit, config, max_train_samples, slices), config)
            shifts.append((companion, [s.sample for s in timed_slices(
                held, slices.configs, tokens_per_model=slices.test_tokens_per_model)]))
            calibration["folds"].append(sorted({getattr(t, by) for t in held}))
        if shifts:
            gnn = gnn.with_quantile_shift(cross_conformal_shift(shifts))
            calibration["shift"] = [round(x, 4) for x in gnn.quantile_shift]
    cases = held_out_cases(split.test, chains=chains)
    models: dict[str, CostModel] = {"roofline": roofline, "roofline-calibrated": calibrated, "table": table,
                                    "gnn": gnn}
    out = {
        "split": split.name, "description": split.description, "train_rows": len(split.train),
        "train_samples": len(samples), "held_out_cases": len(cases), "train_seconds": round(report.seconds, 1),
        "final_train_mape_pct": round(100 * report.epochs[-1]["mape_train"], 2), "gnn_calibration": calibration,
        "models": {name: score(m, cases) for name, m in models.items()},
    }
    if slices is not None:
        test_slices = timed_slices(split.test, slices.configs, tokens_per_model=slices.test_tokens_per_model)
        out["per_slice"] = {
            "held_out_slices": len(test_slices), "held_out_models": sorted({s.model for s in test_slices}),
            "models": {name: score_slices(m, test_slices) for name, m in models.items()},
        }
    return out


def _gnn_samples(rows: Sequence[OpTiming], config: GnnConfig, cap: int | None,
                 slices: SliceData | None) -> list[GraphSample]:
    """Chains and single operators of ``rows`` (at most ``cap``), plus their traced slices."""
    samples = training_samples(rows, seed=config.seed)
    if cap is not None and len(samples) > cap:
        pick = np.random.default_rng(config.seed).choice(len(samples), cap, replace=False)
        samples = [samples[i] for i in sorted(pick)]
    if slices is not None:
        samples += [s.sample for s in timed_slices(rows, slices.configs, tokens_per_model=slices.train_tokens_per_model)]
    return samples


def load_vidur(data_dir: Path, *, attention: bool = True) -> list[OpTiming]:
    rows = read_vidur_compute(data_dir / VIDUR_ROOT / "compute")
    if attention and (data_dir / ATTENTION_CSV).exists():
        rows += read_vidur_attention(data_dir / ATTENTION_CSV)
    return rows


def _print_progress(prefix: str) -> Callable[[dict[str, float]], None]:
    def show(line: dict[str, float]) -> None:
        print(f"[{prefix}] epoch {int(line['epoch']):3d}  loss {line['loss']:.4f}  "
              f"train MAPE {100 * line['mape_train']:.2f}%  {line['seconds']:.0f}s", file=sys.stderr, flush=True)
    return show


def _gnn_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=None,
                   help="folder holding vidur-profiling/ (default: $SLICESCHED_DATA, then ../shared/data)")
    p.add_argument("--epochs", type=int, default=GnnConfig.epochs, help="training epochs")
    p.add_argument("--hidden", type=int, default=GnnConfig.hidden, help="GNN hidden width")
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation, shuffling and splits")
    p.add_argument("--threads", type=int, default=1, help="torch threads while training")
    p.add_argument("--device-invariant", action="store_true",
                   help="train without device features (for devices not in the training data)")
    p.add_argument("--profile", type=Path, default=None,
                   help="an OpTiming CSV (e.g. from `slicesched profile`) to use instead of the Vidur data")


def _config(args: argparse.Namespace) -> GnnConfig:
    return replace(GnnConfig(), epochs=args.epochs, hidden=args.hidden, seed=args.seed, threads=args.threads,
                   device_features=not args.device_invariant)


def evaluate_all(data_dir: Path, splits: Sequence[str], config: GnnConfig, *, profile: Path | None = None,
                 max_train_samples: int | None = None, verbose: bool = True,
                 slices: SliceData | None = None) -> dict[str, Any]:
    """Every requested Vidur split (with per-slice results if ``slices``), plus the CPU split if
    ``profile`` is given.

    Device splits train the GNN with ``device_features=False`` (the held-out device is unseen).
    """
    results: dict[str, Any] = {}
    rows = load_vidur(data_dir) if splits else []
    for name in splits:
        # An unseen device: the GNN sees only device-independent features and scales by the roofline.
        cfg = replace(config, device_features=False) if name.startswith("device") else config
        results[name] = evaluate_split(vidur_split(name, rows), cfg, max_train_samples=max_train_samples,
                                       progress=_print_progress(name) if verbose else None, slices=slices)
    if profile is not None:
        cpu_rows = ProfileStore(profile).load()
        results["cpu"] = evaluate_split(cpu_split(cpu_rows, config.seed), config, chains=False,
                                        progress=_print_progress("cpu") if verbose else None)
    return results


def evaluate_main(argv: Sequence[str] | None = None) -> int:
    """``slicesched cost-model evaluate``: held-out MAPE and p90 coverage of every cost model."""
    p = argparse.ArgumentParser(prog="slicesched cost-model evaluate", description=evaluate_main.__doc__)
    _gnn_args(p)
    p.add_argument("--splits", default=",".join(SPLITS), help=f"comma list of {', '.join(SPLITS)} (or empty)")
    p.add_argument("--max-train-samples", type=int, default=None, help="subsample training graphs")
    args = p.parse_args(argv)
    splits = [s for s in args.splits.split(",") if s]
    data_dir = args.data_dir or (resolve(VIDUR_DATASET).parent if splits else default_data_dir())
    results = evaluate_all(data_dir, splits, _config(args), profile=args.profile,
                           max_train_samples=args.max_train_samples)
    print(json.dumps({"config": asdict(_config(args)), "results": results}))
    return 0

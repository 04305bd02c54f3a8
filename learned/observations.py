"""Live observations as training rows: slices the executors ran, timed, turned into GNN samples.

An executor measures every guest slice it runs (:class:`executor.slices.SliceObservation`: one
micro-batch's prefill through layers ``[layer_start, layer_end)`` of a model on one device) and
the service writes it on the slice's Slice node in the GMG
(``cypher/write/record_slice_observations.cypher``). :func:`observation_samples` turns such rows
into :class:`~learned.gnn.GraphSample` rows the way :mod:`learned.slices` turns profiles into
them: the model's prefill at the observed batch and tokens is traced on the meta device
(:func:`~service.models.trace.trace_phase`), the slice's operators are its layers' (with the
embedding and rotary set-up before layer 0, the final norm and head after the last layer), cut
with their real edges (:func:`~service.core.cost.slice_of`), and the target is the measured
latency. Rows are kept as JSON lines (:func:`save_observations`), a training input whose bytes
name the artifact (``slicesched cost-model train --from-gmg`` writes one and trains with it).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from learned.artifact import ArtifactCostModel, LoadedCostModel, MissingArtifactError, TrainingInputs, artifact_sha256
from learned.artifact import _samples as base_samples  # the default artifact's training samples
from learned.choice import TRAIN_COMMAND
from learned.evaluate import load_vidur
from learned.gnn import GnnCostModel, GraphSample, train_gnn
from learned.profile import ProfileStore, file_digest
from learned.rates import RateCostModel, fit_rates
from learned.roofline import device_of_kind
from learned.table import ProfileTableCostModel
from service.core.cost import CostModel, IterationOverhead, chain_edges, floored, predict_slice, slice_of
from service.domain.error import InvalidInputError, SliceschedError
from service.domain.model_config import ModelConfig, model_config
from service.domain.opgraph import OperatorGraph


@dataclass(frozen=True, slots=True)
class ObservedSlice:
    """One measured slice, as the GMG keeps it (``latency_s`` seconds, ``observed_wall`` epoch s)."""

    uid: str
    family: str
    device_kind: str
    layer_start: int
    layer_end: int
    batch: int
    tokens: int
    latency_s: float
    observed_wall: float
    phase: str = "prefill"  # prefill: ``batch`` sequences of ``tokens``; decode: one new token each over ``context``
    context: int = 0  # decode: the longest cached context the iteration attended

    @staticmethod
    def from_row(row: Mapping[str, Any]) -> ObservedSlice:
        """A row of the ``slice_observations`` read (``KeyError``/``TypeError``/``ValueError`` if malformed)."""
        return ObservedSlice(str(row["uid"]), str(row["family"]), str(row["device_kind"]), int(row["layer_start"]),
                             int(row["layer_end"]), int(row["batch"]), int(row["tokens"]), float(row["latency_s"]),
                             float(row["observed_wall"]), str(row.get("phase") or "prefill"),
                             int(row.get("context") or 0))


def save_observations(rows: Iterable[ObservedSlice], path: Path) -> Path:
    """Write ``rows`` as JSON lines (sorted keys: the same rows give the same bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(r), sort_keys=True) + "\n" for r in rows))
    return path


def load_observations(path: Path) -> list[ObservedSlice]:
    try:
        return [ObservedSlice(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError, TypeError) as exc:
        raise InvalidInputError(f"{path}: not a file of slice observations: {exc}", culprit=str(path)) from None


class Tracer(Protocol):
    """A model's phase traced on the meta device (:func:`service.models.trace.trace_phase`)."""

    def __call__(self, config: ModelConfig, phase: str, *, batch: int, tokens: int, context: int) -> OperatorGraph: ...


def slice_op_ids(graph: OperatorGraph, n_layers: int, start: int, end: int) -> list[str]:
    """The operators of layers ``[start, end)`` in graph order, with the operators before the
    first layer (embedding, rotary set-up) when ``start == 0`` and those after the last (final
    norm, head) when ``end == n_layers``."""
    if not 0 <= start < end <= n_layers:
        raise InvalidInputError(f"layers [{start}, {end}) outside {graph.model_name}'s {n_layers}")
    first_block = min(o.index for o in graph.operators if o.layer >= 0)
    last_block = max(o.index for o in graph.operators if o.layer >= 0)
    out = []
    for o in graph.operators:
        if start <= o.layer < end or (o.layer < 0 and (
                (start == 0 and o.index < first_block) or (end == n_layers and o.index > last_block))):
            out.append(o.op_id)
    return out


def observation_samples(rows: Sequence[ObservedSlice], trace: Tracer) -> list[GraphSample]:
    """Each observation as a :class:`GraphSample` (module docstring), its model's phase traced
    by ``trace`` (:func:`service.models.trace.trace_phase`, injected: this package does not
    trace): a prefill of ``batch`` sequences of ``tokens``, or a decode step of ``batch``
    sequences over ``context`` cached tokens; rows of an unknown model, device kind or phase, or
    a non-positive latency are left out (their number is ``len(rows) - len(result)``)."""
    out: list[GraphSample] = []
    graphs: dict[tuple[str, str, int, int, int], OperatorGraph] = {}
    for r in rows:
        if r.phase not in ("prefill", "decode") or not (r.latency_s > 0 and math.isfinite(r.latency_s)):
            continue
        try:
            config = model_config(r.family)
            key = (r.family, r.phase, r.batch, r.tokens if r.phase == "prefill" else 1, r.context)
            graph = graphs.get(key)
            if graph is None:
                graph = graphs[key] = trace(config, r.phase, batch=r.batch, tokens=r.tokens if r.phase == "prefill"
                                            else 1, context=max(1, r.context))
            device = device_of_kind(r.device_kind)
            features, edges = slice_of(graph, slice_op_ids(graph, config.n_layers, r.layer_start, r.layer_end))
        except (SliceschedError, ValueError, KeyError):  # an unknown model or device kind, layers outside it
            continue
        out.append(GraphSample(tuple(features), device, r.latency_s * 1e3, edges=tuple(edges)))
    return out


# ---- training with observations ---------------------------------------------------------------
def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
    return h.hexdigest()[:16]


#: The latest share of each device kind's observations held out of the refit to choose that
#: kind's model on (:func:`split_for_choice`).
CHOICE_HOLDOUT = 0.25
#: A kind with fewer held-out observations than this keeps the base artifact's choice.
MIN_CHOICE_ROWS = 8


def split_for_choice(rows: Sequence[ObservedSlice]) -> tuple[list[ObservedSlice], list[ObservedSlice]]:
    """``(fit, held)``: per device kind, the latest :data:`CHOICE_HOLDOUT` of its rows (by
    ``observed_wall``; the uid breaks ties) are held out, when that is at least
    :data:`MIN_CHOICE_ROWS` of them; a kind observed less is fitted on whole. Both keep ``rows``' order."""
    held: set[int] = set()
    for kind in sorted({r.device_kind for r in rows}):
        mine = sorted((i for i, r in enumerate(rows) if r.device_kind == kind),
                      key=lambda i: (rows[i].observed_wall, rows[i].uid))
        n = int(len(mine) * CHOICE_HOLDOUT)
        if n >= MIN_CHOICE_ROWS:
            held.update(mine[len(mine) - n:])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def observed_mape(model: CostModel, samples: Sequence[GraphSample]) -> float:
    """MAPE (%) of ``model``'s median on ``samples``, each priced as the what-if prices a slice
    (:func:`~service.core.cost.predict_slice` with its edges, at the physical floor)."""
    priced = floored(model)
    errors = [abs(predict_slice(priced, s.ops, s.edges if s.edges is not None else chain_edges(len(s.ops)),
                             s.device).p50_s * 1e3 - s.target_ms) / s.target_ms
              for s in samples]
    return 100.0 * sum(errors) / len(errors) if errors else math.nan


def choose_on_observations(models: Mapping[str, CostModel], held: Sequence[ObservedSlice],
                           trace: Tracer) -> dict[str, dict[str, Any]]:
    """Per device kind in ``held``: each model's MAPE on its traceable rows and the ``chosen``
    one (the lowest; ``n`` rows). Kinds with fewer than :data:`MIN_CHOICE_ROWS` traceable rows
    are left out (they keep the base's choice)."""
    out: dict[str, dict[str, Any]] = {}
    for kind in sorted({r.device_kind for r in held}):
        samples = observation_samples([r for r in held if r.device_kind == kind], trace)
        if len(samples) < MIN_CHOICE_ROWS:
            continue
        scores = {}
        for name, m in models.items():
            try:
                scores[name] = observed_mape(m, samples)
            except InvalidInputError:  # a model that cannot price this kind (rates not fitted on it)
                continue
        if not scores:
            continue
        out[kind] = {f"{name}_mape_pct": round(v, 3) for name, v in scores.items()}
        out[kind].update(n=len(samples), chosen=min(scores, key=lambda name: scores[name]))
    return out


#: The share of the refit's training samples the observations make up (each repeated to reach
#: it): a few hundred observations beside tens of thousands of profile samples would otherwise
#: move the GNN by a fraction of a percent of its loss.
OBSERVED_SHARE = 0.2


def observed_repeats(n_base: int, n_observed: int) -> int:
    """How many times each observed sample is taken so that they make up about
    :data:`OBSERVED_SHARE` of the samples (at least once)."""
    if n_observed <= 0:
        return 0
    return max(1, round(OBSERVED_SHARE / (1.0 - OBSERVED_SHARE) * n_base / n_observed))


def observed_key(inputs: TrainingInputs, observations: Path) -> str:
    """The name of the artifact refitted on ``observations``: the base artifact's inputs, the
    observations' bytes and this module's code."""
    return _digest(inputs.key(), file_digest(observations), file_digest(Path(__file__)))


def train_observed(observations: Path, inputs: TrainingInputs, cache_dir: Path, trace: Tracer, *, force: bool = False,
                   progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> Path:
    """The default artifact of ``inputs`` (``learned-<key>`` in ``cache_dir``, which must exist)
    with its GNN refitted on the same samples plus the observations' (:func:`observation_samples`):
    a folder ``observed-<key>`` beside it laid out as the default one (``meta.json``,
    ``table.json``, ``gnn/``), its meta naming the base artifact and the observations.

    The model of each device kind observed enough is chosen again (:func:`split_for_choice`): the
    latest :data:`CHOICE_HOLDOUT` of that kind's observations are held out of the fit, and of the
    refitted GNN, the table and the kind's fitted rates (:mod:`learned.rates`, fitted on the same
    rows as the GNN; ``observed_rates`` in the meta) the one with the lowest MAPE on them prices
    that kind, whole iterations and slices alike (``observed_choice`` holds the evidence).
    Without it a kind the base never profiled (a CPU executor) would keep the table whatever the
    observations taught the GNN. Other kinds keep the base's choices; the table, the host
    overheads and the conformal shift are the base's. Returns the folder (an existing one unless
    ``force``)."""
    base = cache_dir / f"learned-{inputs.key()}"
    if not (base / "meta.json").is_file():
        raise MissingArtifactError(f"no base artifact {base}: make it with `{TRAIN_COMMAND}` first")
    rows = load_observations(observations)
    fit_rows, held_rows = split_for_choice(rows)
    extra = observation_samples(fit_rows, trace)
    if not extra:
        raise InvalidInputError(f"none of the {len(rows)} observations in {observations} can be traced "
                                "(unknown models, device kinds or layers)", culprit=str(observations))
    target = cache_dir / f"observed-{observed_key(inputs, observations)}"
    if (target / "meta.json").is_file() and not force:
        progress(f"artifact exists: {target}")
        return target
    started = time.perf_counter()
    timings = [*load_vidur(inputs.data_dir), *(t for p in inputs.profiles for t in ProfileStore(p).load())]
    base_rows = base_samples(timings, inputs)
    repeats = observed_repeats(len(base_rows), len(extra))
    samples = [*base_rows, *(extra * repeats)]
    progress(f"refitting the GNN on {len(samples)} samples, {len(extra)} of them from {len(rows)} observations "
             f"(each taken {repeats} times)")
    meta = json.loads((base / "meta.json").read_text())
    gnn, report = train_gnn(samples, inputs.config, meta={"inputs_key": inputs.key()})
    gnn = gnn.with_quantile_shift(tuple(meta["gnn_quantile_shift"]["p90_p99_log"]))
    table = ProfileTableCostModel.from_doc(json.loads((base / "table.json").read_text()))
    fitted = {kind: r for kind in sorted({s.device.kind for s in extra})
              if (r := fit_rates([s for s in extra if s.device.kind == kind])) is not None}
    rates = RateCostModel(fitted)
    evidence = choose_on_observations({"gnn": gnn, "table": table, "rates": rates}, held_rows, trace)
    for kind, e in evidence.items():
        meta["choice"][kind] = meta["slice_choice"][kind] = e["chosen"]
        scores = ", ".join(f"{k.removesuffix('_mape_pct')} {v:.1f}%" for k, v in e.items() if k.endswith("_mape_pct"))
        progress(f"{kind}: {e['chosen']} on {e['n']} held-out observations (MAPE {scores})")
    tmp = Path(tempfile.mkdtemp(prefix=".observed-", dir=cache_dir))
    try:
        shutil.copy(base / "table.json", tmp / "table.json")
        gnn.save(tmp / "gnn")
        meta.update(observations={"file": str(observations), "sha256": file_digest(observations), "rows": len(rows),
                                  "samples": len(extra), "repeats": repeats, "held_out": len(held_rows),
                                  "device_kinds": sorted({r.device_kind for r in rows})},
                    observed_rates=rates.to_doc(),
                    observed_choice={"metric": f"MAPE of the median on the latest {CHOICE_HOLDOUT:.0%} of each "
                                               "kind's observations, held out of the fit", "per_device_kind": evidence},
                    base_artifact={"path": str(base), "sha256": artifact_sha256(base)},
                    final_gnn_train_seconds=round(report.seconds, 1),
                    train_seconds=round(time.perf_counter() - started, 1))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress(f"wrote {target} in {time.perf_counter() - started:.0f}s")
    return target


def observations_file(rows: Sequence[ObservedSlice], cache_dir: Path) -> Path:
    """``rows`` saved under ``cache_dir/observations/``, named by their bytes (the same rows,
    the same file, the same artifact)."""
    tmp = save_observations(rows, cache_dir / "observations" / f".pending-{os.getpid()}.jsonl")
    target = tmp.with_name(f"{file_digest(tmp)[:16]}.jsonl")
    os.replace(tmp, target)
    return target


def load_observed(directory: Path) -> LoadedCostModel:
    """The ``learned`` cost model of an artifact :func:`train_observed` wrote (the base's choices,
    the refitted GNN); ``MissingArtifactError`` if the folder holds none."""
    if not (directory / "meta.json").is_file():
        raise MissingArtifactError(f"no observed artifact in {directory}: make it with `{TRAIN_COMMAND} --from-gmg`")
    meta = json.loads((directory / "meta.json").read_text())
    table = ProfileTableCostModel.from_doc(json.loads((directory / "table.json").read_text()))
    models: dict[str, CostModel] = {"table": table, "gnn": GnnCostModel.load(directory / "gnn"),
                                    "rates": RateCostModel.from_doc(meta.get("observed_rates", {}))}
    choice, slice_choice = dict(meta["choice"]), dict(meta["slice_choice"])
    overheads = {k: IterationOverhead(**v) for k, v in meta["overheads"].items()}
    model = ArtifactCostModel(models, choice, "table", overheads, name="learned", graph_choice=slice_choice)
    return LoadedCostModel("learned", model, directory, artifact_sha256(directory), choice, slice_choice)

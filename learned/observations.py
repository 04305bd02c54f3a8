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
from learned.roofline import device_of_kind
from learned.table import ProfileTableCostModel
from service.core.cost import CostModel, IterationOverhead, slice_of
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


def observed_key(inputs: TrainingInputs, observations: Path) -> str:
    """The name of the artifact refitted on ``observations``: the base artifact's inputs, the
    observations' bytes and this module's code."""
    return _digest(inputs.key(), file_digest(observations), file_digest(Path(__file__)))


def train_observed(observations: Path, inputs: TrainingInputs, cache_dir: Path, trace: Tracer, *, force: bool = False,
                   progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> Path:
    """The default artifact of ``inputs`` (``learned-<key>`` in ``cache_dir``, which must exist)
    with its GNN refitted on the same samples plus the observations' (:func:`observation_samples`):
    a folder ``observed-<key>`` beside it laid out as the default one (``meta.json``,
    ``table.json``, ``gnn/``), its meta naming the base artifact and the observations. The
    table, the choices, the host overheads and the conformal shift are the base's. Returns the
    folder (an existing one unless ``force``)."""
    base = cache_dir / f"learned-{inputs.key()}"
    if not (base / "meta.json").is_file():
        raise MissingArtifactError(f"no base artifact {base}: make it with `{TRAIN_COMMAND}` first")
    rows = load_observations(observations)
    extra = observation_samples(rows, trace)
    if not extra:
        raise InvalidInputError(f"none of the {len(rows)} observations in {observations} can be traced "
                                "(unknown models, device kinds or layers)", culprit=str(observations))
    target = cache_dir / f"observed-{observed_key(inputs, observations)}"
    if (target / "meta.json").is_file() and not force:
        progress(f"artifact exists: {target}")
        return target
    started = time.perf_counter()
    timings = [*load_vidur(inputs.data_dir), *(t for p in inputs.profiles for t in ProfileStore(p).load())]
    samples = [*base_samples(timings, inputs), *extra]
    progress(f"refitting the GNN on {len(samples)} samples, {len(extra)} of them from {len(rows)} observations")
    meta = json.loads((base / "meta.json").read_text())
    gnn, report = train_gnn(samples, inputs.config, meta={"inputs_key": inputs.key()})
    gnn = gnn.with_quantile_shift(tuple(meta["gnn_quantile_shift"]["p90_p99_log"]))
    tmp = Path(tempfile.mkdtemp(prefix=".observed-", dir=cache_dir))
    try:
        shutil.copy(base / "table.json", tmp / "table.json")
        gnn.save(tmp / "gnn")
        meta.update(observations={"file": str(observations), "sha256": file_digest(observations), "rows": len(rows),
                                  "samples": len(extra), "device_kinds": sorted({r.device_kind for r in rows})},
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
    models: dict[str, CostModel] = {"table": table, "gnn": GnnCostModel.load(directory / "gnn")}
    choice, slice_choice = dict(meta["choice"]), dict(meta["slice_choice"])
    overheads = {k: IterationOverhead(**v) for k, v in meta["overheads"].items()}
    model = ArtifactCostModel(models, choice, "table", overheads, name="learned", graph_choice=slice_choice)
    return LoadedCostModel("learned", model, directory, artifact_sha256(directory), choice, slice_choice)

"""The trained cost-model artifact every replay uses by default, and the ``--cost-model`` switch.

``slicesched cost-model train`` builds one artifact from the shipped profiles (the Vidur GPU
operator profiles, the legacy A100 attention and CPU-overhead profiles, and any of the project's
own ``slicesched profile`` CSVs given with ``--profile``):

1. evidence: the table and a GNN are fitted on the Vidur ``model`` split's training part (plus
   75 % of each own profile) and scored on the held-out part, per device kind: on held-out
   *iterations* (``iteration_evidence``, :func:`learned.evaluate.score_iterations`: decodes of
   1-256 sequences and prefills of up to 4,096 tokens at every measured token count, each
   layer's operators as the simulator builds them and prices them, as a stack through the
   physical floor), on the held-out operator chains as profiled (``evidence``,
   :func:`learned.evaluate.score`) and on the held-out models' traced operator slices
   (``slice_evidence``);
2. choice: per device kind, the GNN where its held-out MAPE is below the table's, else the table:
   ``choice`` (whole iterations) by the iteration evidence (a kind without iterations, such as
   an own CPU profile of single operators, by its operator evidence), ``slice_choice`` (slices
   priced with their real edges) by the slice evidence;
3. the shipped models: the table and the GNN refitted on every row (the GNN also on traced
   operator slices with their real edges, :mod:`learned.slices`; its p90 and p99 on such
   slices shifted by the split-conformal offsets that make the evidence GNN cover the held-out
   models' slices, :mod:`learned.calibration`), and the host overhead per
   iteration (fixed + per sequence) fitted per GPU kind on Vidur's measured CPU overheads
   (schedule, sampler, input preparation, output processing; TP 1 rows).

Artifacts live in a per-machine cache (``$SLICESCHED_COST_MODEL_DIR``, else
``$XDG_CACHE_HOME/slicesched/cost-models``, else ``~/.cache/slicesched/cost-models``), in a folder
named by a hash of the training inputs (file digests, GNN config, sample cap, slice token counts)
and of the code that trains and answers (this package, the tracer, the feature extraction).
Loading never trains and never falls back: a missing artifact is a
:class:`MissingArtifactError` naming the command that makes it.

Kinds (``--cost-model`` / ``$SLICESCHED_COST_MODEL``): ``learned`` (default: the recorded
per-device-kind choice; a kind without evidence uses the table, which scales from the nearest
profiled kind), ``gnn``, ``table`` (both from the artifact, host overheads included) and
``roofline`` (analytic, no artifact, no host overhead).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from learned.calibration import conformal_shift
from learned.choice import TRAIN_COMMAND, kind_from
from learned.evaluate import (
    ATTENTION_CSV,
    MAX_DECODE_BATCH,
    MAX_PREFILL_TOKENS,
    MODEL_TEST,
    VIDUR_DATASET,
    VIDUR_ROOT,
    Case,
    cpu_split,
    default_data_dir,
    held_out_cases,
    held_out_iterations,
    load_vidur,
    score,
    score_iterations,
    score_slices,
    training_samples,
)
from learned.gnn import GnnConfig, GnnCostModel, GraphSample, train_gnn
from learned.profile import (
    OpTiming,
    ProfileStore,
    file_digest,
    fit_host_overhead,
    timing_features,
    vidur_mlp_files,
)
from learned.roofline import RooflineCostModel, device_of_kind
from learned.slices import timed_slices, vidur_configs
from learned.table import ProfileTableCostModel
from service import environment as env
from service.core.cost import (
    NO_OVERHEAD,
    CostModel,
    Edge,
    FlooredCostModel,
    IterationOverhead,
    Latency,
    OpFeatures,
    floored,
    predict_slice,
)
from service.data import fetch_hint
from service.domain.cluster import DEVICE_KINDS, Device
from service.domain.error import InvalidInputError

CACHE_ENV = "SLICESCHED_COST_MODEL_DIR"
CPU_OVERHEADS = {"A100-80GB": VIDUR_ROOT / "legacy-a100" / "cpu_overheads.csv",
                 "A40": VIDUR_ROOT / "legacy-a40" / "cpu_overheads.csv"}
# The shipped GNN: fewer epochs and a sample cap so that evidence + final fit train in < 120 s on 2 cores.
SHIPPED_GNN = GnnConfig(epochs=24)
SHIPPED_MAX_SAMPLES = 24_000
SHIPPED_SLICE_TOKENS = 16  # token counts per profiled model for the traced slices
_CODE_FILES = ("artifact.py", "calibration.py", "evaluate.py", "gnn.py", "profile.py", "roofline.py", "slices.py",
               "table.py")
# Outside this package: what the traced slices' graphs and features come from.
_TRACE_FILES = ("service/core/cost.py", "service/models/family.py", "service/models/trace.py")


class MissingArtifactError(InvalidInputError):
    """No trained artifact for these inputs in the cache (exit code 2: run the train command)."""


def default_cache_dir() -> Path:
    given = env.path(CACHE_ENV)
    if given is not None:
        return given
    base = Path(os.environ["XDG_CACHE_HOME"]) if os.environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "slicesched" / "cost-models"


@dataclass(frozen=True)
class TrainingInputs:
    """What an artifact is trained from; :meth:`key` names it in the cache.

    ``data_dir`` is the data folder holding ``vidur-profiling/`` (default: the first of
    ``$SLICESCHED_DATA`` and ``../shared/data`` with the whole data set). The key hashes the
    files' bytes, never their paths, so the same profiles in another folder name the same artifact.
    """

    data_dir: Path = field(default_factory=default_data_dir)
    profiles: tuple[Path, ...] = ()
    config: GnnConfig = SHIPPED_GNN
    max_train_samples: int | None = SHIPPED_MAX_SAMPLES
    slice_tokens_per_model: int | None = SHIPPED_SLICE_TOKENS

    def files(self) -> list[Path]:
        vidur = [*vidur_mlp_files(self.data_dir / VIDUR_ROOT / "compute"), self.data_dir / ATTENTION_CSV,
                 *(self.data_dir / p for p in CPU_OVERHEADS.values())]
        return [p for p in vidur if p.exists()] + list(self.profiles)

    def key(self) -> str:
        files = self.files()
        if not any(p.name == "mlp.csv" for p in files):
            raise MissingArtifactError(f"no Vidur profiles under {self.data_dir / VIDUR_ROOT}: "
                                       f"{fetch_hint(VIDUR_DATASET)} (or pass --data-dir, the folder holding "
                                       f"{VIDUR_DATASET}/)")
        for p in self.profiles:
            if not p.is_file():
                raise InvalidInputError(f"profile {p} does not exist", culprit=str(p))
        h = hashlib.sha256()
        for p in files:
            h.update(file_digest(p).encode())
        config = asdict(replace(self.config, threads=1))  # threads change the speed, not the model
        h.update(json.dumps({"config": config, "max": self.max_train_samples,
                             "slice_tokens": self.slice_tokens_per_model}, sort_keys=True).encode())
        h.update(code_digest().encode())
        return h.hexdigest()[:16]


def code_digest() -> str:
    """sha256 of the code that trains and answers (a change makes a new artifact)."""
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in _CODE_FILES:
        h.update((here / name).read_bytes())
    for rel in _TRACE_FILES:
        h.update((here.parent / rel).read_bytes())
    return h.hexdigest()


def artifact_sha256(directory: Path) -> str:
    """sha256 over the artifact's files (names and bytes, sorted by name)."""
    h = hashlib.sha256()
    for p in sorted(x for x in Path(directory).rglob("*") if x.is_file()):
        h.update(str(p.relative_to(directory)).encode())
        h.update(file_digest(p).encode())
    return h.hexdigest()


# ---- the composite model ----------------------------------------------------------------------------

class ArtifactCostModel:
    """Per device kind one of the artifact's models, plus its host overhead per iteration.

    ``choice`` answers :meth:`predict` and :meth:`predict_stack`; ``graph_choice`` (default:
    ``choice``) answers :meth:`predict_graph`; a kind in neither gets ``default``. Each model
    answers through :class:`~service.core.cost.FlooredCostModel`: never below the physical floor
    of the operators it prices, whole iterations and slices alike.
    """

    def __init__(self, models: Mapping[str, CostModel], choice: Mapping[str, str], default: str,
                 overheads: Mapping[str, IterationOverhead], *, name: str,
                 graph_choice: Mapping[str, str] | None = None) -> None:
        self.name = name
        self._models: dict[str, FlooredCostModel] = {k: floored(m) for k, m in models.items()}
        self._choice = dict(choice)
        self._graph_choice = dict(choice if graph_choice is None else graph_choice)
        self._default = default
        self._overheads = dict(overheads)

    def model_for(self, device: Device) -> CostModel:
        return self._models[self._choice.get(device.kind, self._default)]

    def graph_model_for(self, device: Device) -> CostModel:
        return self._models[self._graph_choice.get(device.kind, self._default)]

    def predict(self, ops: Sequence[OpFeatures], device: Device) -> Latency:
        return self.model_for(device).predict(ops, device)

    def predict_graph(self, ops: Sequence[OpFeatures], edges: Sequence[Edge], device: Device) -> Latency:
        """The slice-chosen model's latency of the slice with its real edges (:func:`predict_slice`)."""
        return predict_slice(self.graph_model_for(device), ops, edges, device)

    def predict_stack(self, prefix: Sequence[OpFeatures], block: Sequence[OpFeatures], repeats: int,
                      suffix: Sequence[OpFeatures], device: Device) -> Latency:
        return self._models[self._choice.get(device.kind, self._default)].predict_stack(prefix, block, repeats,
                                                                                        suffix, device)

    def iteration_overhead(self, device: Device) -> IterationOverhead:
        """The fitted overhead of the device's kind, else of the nearest fitted GPU kind (none on a CPU)."""
        if device.kind in self._overheads:
            return self._overheads[device.kind]
        if device.kind == "cpu" or not self._overheads:
            return NO_OVERHEAD
        near = min(self._overheads, key=lambda k: abs(math.log(DEVICE_KINDS[k].peak_flops / device.peak_flops))
                   + abs(math.log(DEVICE_KINDS[k].mem_bw_bytes_per_s / device.mem_bw_bytes_per_s)))
        return self._overheads[near]


@dataclass(frozen=True)
class LoadedCostModel:
    """A cost model and what a report says about it (:meth:`describe`)."""

    kind: str
    model: CostModel
    artifact: Path | None = None
    sha256: str | None = None
    choice: dict[str, str] = field(default_factory=dict)
    slice_choice: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "artifact": None if self.artifact is None else str(self.artifact),
                               "sha256": self.sha256}
        if self.kind == "learned":
            out["choice"] = self.choice
            out["slice_choice"] = self.slice_choice
        return out


def load_cost_model(kind: str | None = None, *, cache_dir: Path | None = None,
                    inputs: TrainingInputs | None = None) -> LoadedCostModel:
    """The cost model of ``kind`` (see :func:`kind_from`); ``MissingArtifactError`` if untrained."""
    kind = kind_from(kind)
    if kind == "roofline":
        return LoadedCostModel(kind, floored(RooflineCostModel()))
    inputs = inputs or default_inputs()
    directory = (cache_dir or default_cache_dir()) / f"learned-{inputs.key()}"
    if not (directory / "meta.json").is_file():
        extra = "".join(f" --profile {p}" for p in inputs.profiles)
        if cache_dir is not None:
            extra += f" --cache-dir {cache_dir}"
        raise MissingArtifactError(
            f"cost model {kind!r}: no trained artifact for these profiles and this code in {directory.parent}; "
            f"make it with `{TRAIN_COMMAND}{extra}` (about a minute and a half), or pass --cost-model roofline")
    meta = json.loads((directory / "meta.json").read_text())
    table = ProfileTableCostModel.from_doc(json.loads((directory / "table.json").read_text()))
    models: dict[str, CostModel] = {"table": table}
    if kind != "table":
        models["gnn"] = GnnCostModel.load(directory / "gnn")
    choice = dict(meta["choice"]) if kind == "learned" else {}
    slice_choice = dict(meta["slice_choice"]) if kind == "learned" else {}
    overheads = {k: IterationOverhead(**v) for k, v in meta["overheads"].items()}
    default = "table" if kind == "learned" else kind
    model = ArtifactCostModel(models, choice, default, overheads, name=kind, graph_choice=slice_choice)
    return LoadedCostModel(kind, model, directory, artifact_sha256(directory), choice, slice_choice)


def ensure_cost_model(kind: str | None = None, *,
                      progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> None:
    """Train the artifact ``kind`` needs if this machine has none yet (first use, progress shown;
    the demo calls this so that a fresh machine needs no extra step). Loading never trains."""
    kind = kind_from(kind)
    if kind == "roofline":
        return
    inputs = default_inputs()
    cache = default_cache_dir()
    if not (cache / f"learned-{inputs.key()}" / "meta.json").is_file():
        progress(f"training the {kind} cost model once for this machine and code (`{TRAIN_COMMAND}`; "
                 "a minute or two, progress below)")
        train_artifact(inputs, cache, progress=progress)


def default_inputs() -> TrainingInputs:
    """The inputs a replay's artifact was trained from: the shipped data and config, own profiles from the env."""
    return TrainingInputs(profiles=profiles_from_env())


def profiles_from_env() -> tuple[Path, ...]:
    """Own profiles named in ``$SLICESCHED_COST_MODEL_PROFILES`` (os.pathsep-separated)."""
    return tuple(Path(p) for p in env.names("SLICESCHED_COST_MODEL_PROFILES", sep=os.pathsep))


# ---- training -------------------------------------------------------------------------------------

def fit_overheads(data_dir: Path) -> dict[str, IterationOverhead]:
    """Per GPU kind with a Vidur CPU-overhead profile: :func:`learned.profile.fit_host_overhead`."""
    return {kind: fit for kind, rel in CPU_OVERHEADS.items()
            if (data_dir / rel).exists() and (fit := fit_host_overhead(data_dir / rel)) is not None}


def _samples(rows: Sequence[OpTiming], inputs: TrainingInputs) -> list[GraphSample]:
    """Operator chains and single operators (capped), plus the traced slices of ``rows``."""
    samples = training_samples(rows, seed=inputs.config.seed)
    cap = inputs.max_train_samples
    if cap is not None and len(samples) > cap:
        pick = np.random.default_rng(inputs.config.seed).choice(len(samples), cap, replace=False)
        samples = [samples[i] for i in sorted(pick)]
    configs = vidur_configs(inputs.data_dir / VIDUR_ROOT / "compute")
    return samples + [s.sample for s in timed_slices(rows, configs, tokens_per_model=inputs.slice_tokens_per_model)]


def _table(rows: Sequence[OpTiming]) -> ProfileTableCostModel:
    devices: dict[str, Device] = {}

    def dev(kind: str) -> Device:
        return devices.setdefault(kind, device_of_kind(kind))

    calibrated = RooflineCostModel().calibrated((timing_features(t), dev(t.device_kind), t.p50_ms / 1e3) for t in rows)
    return ProfileTableCostModel.from_timings(rows, fallback=calibrated)


@dataclass(frozen=True)
class Evidence:
    """Held-out scores per device kind on operator chains (``per_device_kind``), on the held-out
    models' iterations as the simulator prices them (``per_iteration``, :func:`score_iterations`)
    and on their traced slices (``per_slice``), and the conformal shifts of the GNN's p90 and p99
    on slices measured on the latter (``quantile_shift``, see :mod:`learned.calibration`)."""

    per_device_kind: dict[str, dict[str, Any]]
    per_slice: dict[str, dict[str, Any]]
    quantile_shift: tuple[float, float]
    per_iteration: dict[str, dict[str, Any]] = field(default_factory=dict)


def held_out_evidence(vidur: Sequence[OpTiming], own: Sequence[OpTiming], inputs: TrainingInputs,
                      progress: Callable[[str], None]) -> Evidence:
    """Held-out MAPE of table, GNN and roofline per device kind (see the module docstring)."""
    own_split = cpu_split(own, inputs.config.seed) if own else None
    train = [t for t in vidur if t.model not in MODEL_TEST] + (own_split.train if own_split else [])
    test_vidur = [t for t in vidur if t.model in MODEL_TEST]
    cases: list[Case] = held_out_cases(test_vidur, chains=True)
    if own_split:
        cases += held_out_cases(own_split.test, chains=False)
    progress(f"evidence: fitting table and GNN on {len(train)} rows (held out: {', '.join(MODEL_TEST)}"
             f"{', 25% of own profiles' if own else ''})")
    table = _table(train)
    gnn, _ = train_gnn(_samples(train, inputs), inputs.config, progress=_epoch_line("evidence", progress))
    models: dict[str, CostModel] = {"table": table, "gnn": gnn, "roofline": RooflineCostModel()}
    out: dict[str, dict[str, Any]] = {}
    for kind in sorted({c.device.kind for c in cases}):
        mine = [c for c in cases if c.device.kind == kind]
        out[kind] = {name: {k: round(v, 3) for k, v in score(m, mine).items()} for name, m in models.items()}
    configs = vidur_configs(inputs.data_dir / VIDUR_ROOT / "compute")
    iterations = held_out_iterations(test_vidur, configs)
    per_iteration: dict[str, dict[str, Any]] = {}
    for kind in sorted({c.device.kind for c in iterations}):
        its = [c for c in iterations if c.device.kind == kind]
        per_iteration[kind] = {name: _rounded(score_iterations(m, its)) for name, m in models.items()}
    slices = timed_slices(test_vidur, configs, tokens_per_model=inputs.slice_tokens_per_model)
    per_slice: dict[str, dict[str, Any]] = {}
    for kind in sorted({s.sample.device.kind for s in slices}):
        on_kind = [s for s in slices if s.sample.device.kind == kind]
        per_slice[kind] = {name: {k: round(score_slices(m, on_kind)[k], 3) for k in ("mape_pct", "p90_coverage", "n")}
                           for name, m in models.items()}
    return Evidence(out, per_slice, conformal_shift(gnn, [s.sample for s in slices]), per_iteration)


def _rounded(scores: dict[str, Any]) -> dict[str, Any]:
    return {k: _rounded(v) if isinstance(v, dict) else round(v, 3) for k, v in scores.items()}


def _epoch_line(prefix: str, progress: Callable[[str], None]) -> Callable[[dict[str, float]], None]:
    def show(line: dict[str, float]) -> None:
        progress(f"[{prefix}] epoch {int(line['epoch']):3d}  loss {line['loss']:.4f}  "
                 f"train MAPE {100 * line['mape_train']:.2f}%  {line['seconds']:.0f}s")
    return show


def _choose(what: str, evidence: dict[str, dict[str, Any]], progress: Callable[[str], None]) -> dict[str, str]:
    """Per device kind the GNN where its held-out MAPE is below the table's, else the table."""
    chosen = {k: "gnn" if e["gnn"]["mape_pct"] < e["table"]["mape_pct"] else "table" for k, e in evidence.items()}
    if not chosen:
        return chosen
    progress(f"{what} per device kind: " + ", ".join(f"{k} {v} (gnn {evidence[k]['gnn']['mape_pct']:.2f}% vs "
                                                     f"table {evidence[k]['table']['mape_pct']:.2f}%)"
                                                     for k, v in chosen.items()))
    return chosen


def train_artifact(inputs: TrainingInputs, cache_dir: Path, *, force: bool = False,
                   progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> Path:
    """Train (unless present and not ``force``) and save the artifact; returns its folder."""
    key = inputs.key()
    target = cache_dir / f"learned-{key}"
    if (target / "meta.json").is_file() and not force:
        progress(f"artifact exists: {target}")
        return target
    started = time.perf_counter()
    vidur = load_vidur(inputs.data_dir)
    own = [t for p in inputs.profiles for t in ProfileStore(p).load()]
    progress(f"read {len(vidur)} Vidur and {len(own)} own profile rows in {time.perf_counter() - started:.0f}s")
    found = held_out_evidence(vidur, own, inputs, progress)
    evidence = found.per_device_kind
    # whole iterations by the held-out iterations; a kind without any (own CPU profiles are single
    # operators) by its operator evidence
    choice = _choose("choice (operators)", {k: e for k, e in evidence.items() if k not in found.per_iteration},
                     progress) | _choose("choice (iterations)", found.per_iteration, progress)
    slice_choice = _choose("slice choice", found.per_slice, progress)
    rows = [*vidur, *own]
    table = _table(rows)
    gnn, report = train_gnn(_samples(rows, inputs), inputs.config, progress=_epoch_line("final", progress),
                            meta={"inputs_key": key})
    gnn = gnn.with_quantile_shift(found.quantile_shift)
    overheads = fit_overheads(inputs.data_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".learned-", dir=cache_dir))
    try:
        gnn.save(tmp / "gnn")
        (tmp / "table.json").write_text(json.dumps(table.to_doc()) + "\n")
        (tmp / "meta.json").write_text(json.dumps({
            "inputs_key": key, "code_sha256": code_digest(),
            # data files by their data-folder path and digest: the artifact does not depend on where they were found
            "inputs": {"files": {p.relative_to(inputs.data_dir).as_posix(): file_digest(p)
                                 for p in inputs.files() if p.is_relative_to(inputs.data_dir)},
                       "profiles": [str(p) for p in inputs.profiles], "rows": len(rows)},
            "gnn_config": asdict(inputs.config), "max_train_samples": inputs.max_train_samples,
            "slice_tokens_per_model": inputs.slice_tokens_per_model,
            "choice": choice, "slice_choice": slice_choice, "evidence": {"split": f"held-out models {', '.join(MODEL_TEST)} (Vidur)"
                                                    + (", 25% of own profile rows" if own else ""),
                                           "metric": "MAPE of the median, per device kind", "per_device_kind": evidence},
            "slice_evidence": {"split": f"traced operator slices of {', '.join(MODEL_TEST)} (Vidur, TP 1)",
                               "per_device_kind": found.per_slice},
            "iteration_evidence": {
                "split": f"iterations of {', '.join(MODEL_TEST)} (Vidur, TP 1): decodes of 1-{MAX_DECODE_BATCH} "
                         f"sequences and prefills of up to {MAX_PREFILL_TOKENS} tokens at every measured token count, "
                         "each layer's non-attention operators as the simulator builds them, priced as a stack "
                         "through the physical floor",
                "metric": "MAPE of the median per layer, the mean of decode's and prefill's; the choice for whole "
                          "iterations", "per_device_kind": found.per_iteration},
            "gnn_quantile_shift": {"p90_p99_log": list(found.quantile_shift),
                                   "from": "split conformal on the evidence GNN's held-out slices"},
            "overheads": {k: asdict(v) for k, v in overheads.items()},
            "final_gnn_train_seconds": round(report.seconds, 1),
            "train_seconds": round(time.perf_counter() - started, 1),
        }, indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress(f"wrote {target} in {time.perf_counter() - started:.0f}s")
    return target


def train_main(argv: Sequence[str] | None = None) -> int:
    """``slicesched cost-model train``: train the default cost-model artifact into the cache."""
    p = argparse.ArgumentParser(prog=TRAIN_COMMAND, description=train_main.__doc__)
    p.add_argument("--data-dir", type=Path, default=None,
                   help="folder holding vidur-profiling/ (default: $SLICESCHED_DATA, then ../shared/data)")
    p.add_argument("--profile", type=Path, action="append", default=[],
                   help="an own OpTiming CSV (from `slicesched profile`) to train on too (repeatable; default "
                        "$SLICESCHED_COST_MODEL_PROFILES)")
    p.add_argument("--cache-dir", type=Path, default=None, help=f"artifact cache (default ${CACHE_ENV} or "
                                                                 "~/.cache/slicesched/cost-models)")
    # Other values make an artifact of their own, which replay does not load (experiments and tests).
    p.add_argument("--epochs", type=int, default=SHIPPED_GNN.epochs, help="GNN epochs (experiments only)")
    p.add_argument("--max-train-samples", type=int, default=SHIPPED_MAX_SAMPLES,
                   help="subsample training graphs (experiments only)")
    p.add_argument("--slice-tokens", type=int, default=SHIPPED_SLICE_TOKENS,
                   help="token counts per profiled model for the traced slices (experiments only)")
    p.add_argument("--threads", type=int, default=1, help="torch threads while training")
    p.add_argument("--force", action="store_true", help="retrain even if the artifact exists")
    args = p.parse_args(argv)
    inputs = TrainingInputs(args.data_dir or default_data_dir(), tuple(args.profile) or profiles_from_env(),
                            replace(SHIPPED_GNN, epochs=args.epochs, threads=args.threads), args.max_train_samples,
                            args.slice_tokens)
    target = train_artifact(inputs, args.cache_dir or default_cache_dir(), force=args.force)
    meta = json.loads((target / "meta.json").read_text())
    print(json.dumps({"artifact": str(target), "sha256": artifact_sha256(target), "choice": meta["choice"],
                      "slice_choice": meta["slice_choice"],
                      "train_seconds": meta["train_seconds"]}))
    return 0

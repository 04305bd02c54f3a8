"""Distributional predictors of workflow calls: quantiles of output length and latency of a
model call, and of a tool call's duration, from a small MLP trained with the pinball loss.

The tool model (:class:`QuantileMLP`) maps features to a base value and six non-negative
increments (softplus), summed cumulatively: its quantiles at :data:`~service.core.tail.QUANTILES`
are non-decreasing by construction. Targets are learned in log space (``log1p`` of tokens,
``log`` of seconds), so the answers are positive and monotone after the inverse transform too.

Features of a model call (:func:`call_vector`): log prompt tokens, the step type (one-hot over
the roles seen in training, plus "other"), depth, number of inputs and workflow size, the
tenant's mean log output of the role so far (history) and the model's size (the *call*
features); then the replica's queue length, running batch, KV load and queued prompt tokens
(the *runtime state*, the last :data:`N_STATE` entries, each non-negative). A tool call:
one-hot of its tool and log input tokens.

The call model (:class:`CallQuantileModel`) is structured by what each target can depend on:

- output length depends on the call only (the replica it runs on does not change what the
  model writes): its head sees the call features alone;
- log latency is a call-dependent base plus ``sum_j c_j(call) * state_j`` with every
  sensitivity ``c_j >= 0`` and non-decreasing along the quantiles, so a predicted latency
  never falls as a replica gets busier (for any call) and the quantiles stay monotone.

Without that structure a net trained where queues are short extrapolates freely in the state
features, and a router that takes the argmin over replicas then prefers the busiest one
(herding: what made mean-based routing lose to round robin).

:class:`DistributionalPredictor` answers the :class:`~service.core.tail.TailPredictor`
protocol; :class:`OnlinePredictor` wraps one, keeps every observation, and :meth:`~OnlinePredictor.refit`
fine-tunes a copy on the recent ones (warm start) and swaps it in. Training is deterministic
for a seed (one torch generator, one thread). ``slicesched predictors train|calibration``
(``service.cli.predictors``) is the command line.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from service.core.tail import QUANTILES, CallFeatures, TailPredictor, ToolFeatures
from service.domain.error import InvalidInputError
from service.sim.workflow import CallRecord, ToolRecord

__all__ = ["N_STATE", "CallQuantileModel", "DistributionalPredictor", "OnlinePredictor", "QuantileMLP", "calibration",
           "fit"]

_Q = torch.tensor(QUANTILES)


class QuantileMLP(nn.Module):
    """``n_in -> hidden -> hidden -> n_targets x len(QUANTILES)``, monotone along quantiles."""

    def __init__(self, n_in: int, n_targets: int, hidden: int = 64) -> None:
        super().__init__()
        self.n_targets = n_targets
        self.body = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                  nn.Linear(hidden, n_targets * len(QUANTILES)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raw = self.body(x).view(-1, self.n_targets, len(QUANTILES))
        base = raw[..., :1]
        steps = nn.functional.softplus(raw[..., 1:])
        return torch.cat([base, base + torch.cumsum(steps, dim=-1)], dim=-1)


def pinball(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean pinball loss of ``pred`` (n, t, q) against ``target`` (n, t)."""
    diff = target.unsqueeze(-1) - pred
    return torch.maximum(_Q * diff, (_Q - 1) * diff).mean()


@dataclass(frozen=True)
class Vocab:
    roles: tuple[str, ...]
    tools: tuple[str, ...]


#: Runtime-state entries at the end of :func:`call_vector` (queue, running, KV, queued prompt).
N_STATE = 4


def call_vector(f: CallFeatures, vocab: Vocab) -> list[float]:
    """Call features, then the :data:`N_STATE` runtime-state entries (each >= 0)."""
    role = [1.0 if f.role == r else 0.0 for r in vocab.roles] + [0.0 if f.role in vocab.roles else 1.0]
    return [math.log1p(f.prompt_tokens) / 8, *role, f.depth / 10, f.num_uses / 5, math.log1p(f.workflow_steps) / 3,
            f.tenant_log_output / 6, math.log1p(f.model_params_b) / 4,
            math.log1p(max(0, f.queue_len)) / 4, math.log1p(max(0, f.running)) / 4, max(0.0, f.kv_frac),
            math.log1p(max(0, f.queued_prompt_tokens)) / 10]


def _monotone_q(raw: torch.Tensor) -> torch.Tensor:
    """A base plus cumulative softplus increments along the last axis: non-decreasing."""
    steps = nn.functional.softplus(raw[..., 1:])
    return torch.cat([raw[..., :1], raw[..., :1] + torch.cumsum(steps, dim=-1)], dim=-1)


class CallQuantileModel(nn.Module):
    """Output-length and latency quantiles of a model call (module docstring): input
    ``call features + N_STATE state entries``, output ``(n, 2, len(QUANTILES))`` in log space,
    monotone along the quantiles and, for latency, non-decreasing in every state entry."""

    def __init__(self, n_in: int, hidden: int = 64) -> None:
        super().__init__()
        self.n_call = n_in - N_STATE
        nq = len(QUANTILES)
        self.body = nn.Sequential(nn.Linear(self.n_call, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.tokens = nn.Linear(hidden, nq)
        self.latency = nn.Linear(hidden, nq)
        self.sensitivity = nn.Linear(hidden, N_STATE * nq)
        with torch.no_grad():  # start nearly state-blind; the data raise the sensitivities
            self.sensitivity.bias.fill_(-3.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x[:, :self.n_call])
        state = x[:, self.n_call:]
        nq = len(QUANTILES)
        raw = self.sensitivity(h).view(-1, N_STATE, nq)
        c = torch.cumsum(nn.functional.softplus(raw), dim=-1)  # >= 0, non-decreasing along q
        load = torch.einsum("ns,nsq->nq", state, c)
        return torch.stack([_monotone_q(self.tokens(h)), _monotone_q(self.latency(h)) + load], dim=1)


def tool_vector(f: ToolFeatures, vocab: Vocab) -> list[float]:
    tool = [1.0 if f.tool == t else 0.0 for t in vocab.tools] + [0.0 if f.tool in vocab.tools else 1.0]
    return [*tool, math.log1p(f.input_tokens) / 8]


def _call_targets(r: CallRecord) -> list[float]:
    return [math.log1p(r.output_tokens), math.log(max(1e-3, r.latency_s))]


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, seed: int, lr: float = 3e-3,
           batch: int = 256) -> None:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    n = len(x)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            loss = pinball(model(x[idx]), y[idx])
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()


class DistributionalPredictor:
    """Call and tool quantile models with their vocabulary (the TailPredictor protocol)."""

    def __init__(self, call_model: CallQuantileModel, tool_model: QuantileMLP, vocab: Vocab,
                 y_shift: tuple[float, float], tool_shift: float) -> None:
        self.call_model = call_model.eval()
        self.tool_model = tool_model.eval()
        self.vocab = vocab
        self.y_shift = y_shift  # target means, subtracted in training (a centred output layer)
        self.tool_shift = tool_shift
        self._cache: dict[CallFeatures, np.ndarray] = {}

    def call_quantiles(self, feats: Sequence[CallFeatures]) -> np.ndarray:
        out = np.empty((len(feats), 2, len(QUANTILES)))
        missing = [i for i, f in enumerate(feats) if f not in self._cache]
        if missing:
            with torch.no_grad():
                x = torch.tensor([call_vector(feats[i], self.vocab) for i in missing], dtype=torch.float32)
                q = self.call_model(x).numpy().astype(np.float64)
            q[:, 0] = np.expm1(q[:, 0] + self.y_shift[0])
            q[:, 1] = np.exp(q[:, 1] + self.y_shift[1])
            if len(self._cache) > 200_000:
                self._cache.clear()
            for j, i in enumerate(missing):
                self._cache[feats[i]] = q[j]
        for i, f in enumerate(feats):
            out[i] = self._cache[f]
        return out

    def tool_quantiles(self, feats: Sequence[ToolFeatures]) -> np.ndarray:
        with torch.no_grad():
            x = torch.tensor([tool_vector(f, self.vocab) for f in feats], dtype=torch.float32)
            q = self.tool_model(x).numpy().astype(np.float64)[:, 0]
        return np.asarray(np.exp(q + self.tool_shift))

    def digest(self) -> str:
        """SHA-256 of the weights and shifts (hex): equal for equal models (determinism checks)."""
        h = hashlib.sha256()
        for model in (self.call_model, self.tool_model):
            for name, tensor in sorted(model.state_dict().items()):
                h.update(name.encode())
                h.update(tensor.detach().contiguous().numpy().tobytes())
        h.update(json.dumps([list(self.y_shift), self.tool_shift, list(self.vocab.roles),
                             list(self.vocab.tools)]).encode())
        return h.hexdigest()

    # ---- persistence -------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        torch.save({"call": self.call_model.state_dict(), "tool": self.tool_model.state_dict()}, directory / "weights.pt")
        (directory / "meta.json").write_text(json.dumps({
            "roles": list(self.vocab.roles), "tools": list(self.vocab.tools), "y_shift": list(self.y_shift),
            "tool_shift": self.tool_shift, "quantiles": list(QUANTILES),
            "hidden": self.call_model.body[0].out_features, "call_model": "monotone-state/1"}, indent=2) + "\n")

    @staticmethod
    def load(directory: Path) -> DistributionalPredictor:
        if not (directory / "meta.json").is_file():
            raise InvalidInputError(f"{directory}: no predictor here (make one with `slicesched predictors train`)",
                                    culprit=str(directory))
        meta = json.loads((directory / "meta.json").read_text())
        fmt = meta.get("call_model")
        if fmt != "monotone-state/1":
            what = "a predictor of an older format" if fmt is None else f"a predictor of format {fmt!r}, unknown here"
            raise InvalidInputError(f"{directory}: {what}; train it again with `slicesched predictors train`",
                                    culprit=str(directory))
        vocab = Vocab(tuple(meta["roles"]), tuple(meta["tools"]))
        call = CallQuantileModel(len(call_vector(_PROBE, vocab)), meta.get("hidden", 64))
        tool = QuantileMLP(len(tool_vector(ToolFeatures("x", 0), vocab)), 1, _TOOL_HIDDEN)
        weights = torch.load(directory / "weights.pt", weights_only=True)
        call.load_state_dict(weights["call"])
        tool.load_state_dict(weights["tool"])
        return DistributionalPredictor(call, tool, vocab, (meta["y_shift"][0], meta["y_shift"][1]), meta["tool_shift"])


_TOOL_HIDDEN = 32
_PROBE = CallFeatures("x", "m", 1.0, 1, 0, 0, 1, 0.0, 0, 0, 0.0)


def fit(calls: Sequence[CallRecord], tools: Sequence[ToolRecord], *, seed: int = 0, epochs: int = 30,
        hidden: int = 64, allow_no_tools: bool = False) -> DistributionalPredictor:
    """Train both models on the records (``InvalidInputError`` without any call, or without any
    tool unless ``allow_no_tools``: then the tool model is untrained, centred on one second, and
    its vocabulary empty; a later :meth:`OnlinePredictor.refit` fine-tunes it on tools seen)."""
    if not calls or (not tools and not allow_no_tools):
        raise InvalidInputError(f"training needs call and tool records (got {len(calls)} and {len(tools)})")
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    vocab = Vocab(tuple(sorted({c.features.role for c in calls})), tuple(sorted({t.features.tool for t in tools})))
    x = torch.tensor([call_vector(c.features, vocab) for c in calls], dtype=torch.float32)
    y = torch.tensor([_call_targets(c) for c in calls], dtype=torch.float32)
    shift = y.mean(dim=0)
    call = CallQuantileModel(x.shape[1], hidden)
    _train(call, x, y - shift, epochs=epochs, seed=seed)
    tool = QuantileMLP(len(tool_vector(ToolFeatures("x", 0), vocab)), 1, _TOOL_HIDDEN)
    tshift = 0.0
    if tools:
        tx = torch.tensor([tool_vector(t.features, vocab) for t in tools], dtype=torch.float32)
        ty = torch.tensor([[math.log(max(1e-3, t.duration_s))] for t in tools], dtype=torch.float32)
        tshift = float(ty.mean())
        _train(tool, tx, ty - tshift, epochs=epochs, seed=seed)
    return DistributionalPredictor(call, tool, vocab, (float(shift[0]), float(shift[1])), tshift)


class OnlinePredictor:
    """A predictor adapted online: :meth:`observe_call` / :meth:`observe_tool` keep the latest
    ``window`` observations; :meth:`refit` fine-tunes a copy of the current models on them
    (``epochs`` passes, warm start, same vocabulary) and swaps it in; until then, and if there
    are fewer than ``min_new`` new observations, the current one answers."""

    def __init__(self, base: DistributionalPredictor, *, window: int = 4000, min_new: int = 200, epochs: int = 3,
                 seed: int = 0) -> None:
        self.current = base
        self.calls: deque[CallRecord] = deque(maxlen=window)
        self.tools: deque[ToolRecord] = deque(maxlen=window)
        self.min_new, self.epochs, self.seed = min_new, epochs, seed
        self._new = 0
        self.num_refits = 0

    def call_quantiles(self, feats: Sequence[CallFeatures]) -> np.ndarray:
        return self.current.call_quantiles(feats)

    def tool_quantiles(self, feats: Sequence[ToolFeatures]) -> np.ndarray:
        return self.current.tool_quantiles(feats)

    def observe_call(self, features: CallFeatures, output_tokens: int, latency_s: float) -> None:
        self.calls.append(CallRecord(features, output_tokens, latency_s))
        self._new += 1

    def observe_tool(self, features: ToolFeatures, duration_s: float) -> None:
        self.tools.append(ToolRecord(features, duration_s))

    def refit(self) -> bool:
        """Fine-tune and swap in; False when too little is new."""
        if self._new < self.min_new or not self.calls:
            return False
        torch.set_num_threads(1)
        cur = self.current
        call = copy.deepcopy(cur.call_model).train()
        x = torch.tensor([call_vector(c.features, cur.vocab) for c in self.calls], dtype=torch.float32)
        y = torch.tensor([_call_targets(c) for c in self.calls], dtype=torch.float32)
        _train(call, x, y - torch.tensor(cur.y_shift), epochs=self.epochs, seed=self.seed + self.num_refits, lr=1e-3)
        tool = copy.deepcopy(cur.tool_model).train()
        if self.tools:
            tx = torch.tensor([tool_vector(t.features, cur.vocab) for t in self.tools], dtype=torch.float32)
            ty = torch.tensor([[math.log(max(1e-3, t.duration_s))] for t in self.tools], dtype=torch.float32)
            _train(tool, tx, ty - cur.tool_shift, epochs=self.epochs, seed=self.seed + self.num_refits, lr=1e-3)
        self.current = DistributionalPredictor(call, tool, cur.vocab, cur.y_shift, cur.tool_shift)  # the swap
        self._new = 0
        self.num_refits += 1
        return True


def calibration(predictor: TailPredictor, calls: Sequence[CallRecord],
                tools: Sequence[ToolRecord]) -> dict[str, Any]:
    """Coverage of each quantile on held-out records: the share of truths at or below it
    (a calibrated p90 covers 0.9), per target."""
    out: dict[str, Any] = {"quantiles": list(QUANTILES), "num_calls": len(calls), "num_tools": len(tools)}
    if calls:
        q = predictor.call_quantiles([c.features for c in calls])
        outs = np.array([c.output_tokens for c in calls], dtype=float)
        lats = np.array([c.latency_s for c in calls])
        out["output_tokens"] = [float(np.mean(outs <= q[:, 0, j])) for j in range(len(QUANTILES))]
        out["latency_s"] = [float(np.mean(lats <= q[:, 1, j])) for j in range(len(QUANTILES))]
    if tools:
        tq = predictor.tool_quantiles([t.features for t in tools])
        dur = np.array([t.duration_s for t in tools])
        out["tool_duration_s"] = [float(np.mean(dur <= tq[:, j])) for j in range(len(QUANTILES))]
    return out

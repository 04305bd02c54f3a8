"""A staged model runner: one model (built-in, or from a model directory) with its layers split
over devices.

A lease names a placement as ``stages``: ``[{device_id, layers: [start, end)}]``. The
embedding runs on the first stage, blocks ``[start, end)`` on each stage's device, the final
norm and the head on the last stage; activations move between stages with ``.to(device)``.
Each stage holds only its own layers' weights on its device, resident for as long as the
model lives (a model from disk is read only for the layers this node runs: a remote stage's
layers are read by the node that runs them). Device ids ``cpu:N`` all map to the torch ``cpu``
device (on one host the "CPU devices" share memory, so a CPU split moves nothing); ``cuda:N``
maps to CUDA device ``N``.

:class:`StagedModel` keeps :class:`~service.models.family.DecoderLM`'s forward contract except
for the KV cache, which is kept per stage (a list with one ``[Ls, 2, B, Hkv, C, Dh]`` tensor
per stage, on that stage's device) so that a stage's cache lives where its layers run, as the
scheduler's memory model assumes. :class:`~executor.batcher.ContinuousBatcher` runs it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn

from executor.device import torch_device
from executor.remote import RemoteStage
from service.domain.model_config import ModelConfig, model_config
from service.models.family import DecoderLM, build_model, embed_inputs


@dataclass(frozen=True)
class Stage:
    """Layers ``[start, end)`` of a model, run on ``device_id``; on another node when ``url``
    (that node's stage server, :mod:`executor.remote`) is given, where ``yields`` (a sliced
    guest's) makes it wait for that node's owners' iteration in progress."""

    device_id: str
    start: int
    end: int
    url: str | None = None
    yields: bool = False


def check_stages(stages: Sequence[Stage], n_layers: int) -> None:
    """Raise ``ValueError`` unless ``stages`` cover layers ``[0, n_layers)`` in order, each non-empty."""
    if not stages:
        raise ValueError("a placement needs at least one stage")
    expected = 0
    for stage in stages:
        if stage.start != expected or stage.end <= stage.start:
            raise ValueError(f"stages must cover layers [0, {n_layers}) contiguously, each non-empty: {list(stages)}")
        expected = stage.end
    if expected != n_layers:
        raise ValueError(f"stages cover layers [0, {expected}) but the model has {n_layers}")


class StagedModel(nn.Module):
    """A :class:`DecoderLM`'s modules placed stage by stage (see the module docstring).

    ``forward(input_ids, positions, kv_cache=None | [per-stage cache], attn_bias=None,
    last_logits_only=False) -> (logits, [per-stage new kv])``: inputs on the first stage's
    device, logits on the last stage's, the cache and the new kv entries per stage on that
    stage's device. The arithmetic is the same as ``DecoderLM.forward``, op for op.

    It takes over ``model``'s modules: they move to their stage's device in place.
    """

    def __init__(self, model: DecoderLM, stages: Sequence[Stage], *, seed: int | None = None,
                 path: str | None = None) -> None:
        super().__init__()
        c = model.config
        check_stages(stages, c.n_layers)
        if any(s.url for s in stages) and seed is None and path is None:
            raise ValueError("remote stages need the model's seed or path (they load the same weights there)")
        self.config: ModelConfig = c
        self.stages = tuple(stages)
        # The embedding and the head always run on this node; a remote stage's KV cache stays
        # here too, on the first local device.
        local = next(torch_device(s.device_id) for s in stages if not s.url) if any(not s.url for s in stages) \
            else torch.device("cpu")
        self.devices = tuple(local if s.url else torch_device(s.device_id) for s in stages)
        first, last = self.devices[0], self.devices[-1]
        self.embed = model.embed.to(first)
        self.pos_embed = model.pos_embed.to(first) if c.style == "gpt2" else None
        if c.style == "llama":
            inv_freq: Tensor = model.inv_freq  # type: ignore[assignment]  # a registered buffer
            self.register_buffer("inv_freq", inv_freq.to(first), persistent=False)
        self.stage_blocks = nn.ModuleList(
            RemoteStage(s.url, c.name, seed or 0, s.start, s.end, s.device_id, path=path, yields=s.yields) if s.url
            else nn.ModuleList(b.to(d) for b in model.blocks[s.start : s.end])
            for s, d in zip(stages, self.devices, strict=True)
        )
        self.final_norm = model.final_norm.to(last)
        self.lm_head = self._head_on(model, last)

    @staticmethod
    def _head_on(model: DecoderLM, device: torch.device) -> nn.Linear:
        """The head on ``device``. GPT-2 ties it to the embedding: on another device than the
        embedding it gets its own copy of the weights (moving the shared parameter would move
        the embedding too)."""
        head = model.lm_head
        if head.weight is not model.embed.weight or head.weight.device == device:
            return head.to(device)
        copy = nn.Linear(head.in_features, head.out_features, bias=False, device=device, dtype=head.weight.dtype)
        with torch.no_grad():
            copy.weight.copy_(head.weight)
        return copy.eval()

    def forward(self, input_ids: Tensor, positions: Tensor, kv_cache: Sequence[Tensor] | None = None,
                attn_bias: Tensor | None = None, last_logits_only: bool = False,
                stage_times: list[float] | None = None) -> tuple[Tensor, list[Tensor]]:
        """``stage_times``: when given, filled with each stage's seconds in this call (the
        embedding counted in the first stage, the final norm and head in the last, as a slice of
        those layers would run them; a CUDA stage synchronised at its end so its kernels are its
        own); a remote stage's is what its stage server reports its layers took (not the network's
        time; ``nan`` when it reports none)."""
        timer = _StageTimer(stage_times, self.devices)
        x, rope = embed_inputs(self.embed, self.pos_embed, None if self.pos_embed is not None else self.inv_freq,
                               input_ids, positions)
        new_kv: list[Tensor] = []
        for s, (device, blocks) in enumerate(zip(self.devices, self.stage_blocks, strict=True)):
            if s > 0:
                timer.lap(s - 1)
            x = x.to(device)
            stage_rope = (rope[0].to(device), rope[1].to(device)) if rope is not None else None
            bias = attn_bias.to(device) if attn_bias is not None else None
            if isinstance(blocks, RemoteStage):  # activations (and this stage's cache) over HTTP
                x, stage_kv = blocks(x, stage_rope, kv_cache[s] if kv_cache is not None else None, bias)
                new_kv.append(stage_kv)
                timer.remote(s, blocks.last_compute_s)
                continue
            kvs = []
            for j, block in enumerate(cast(nn.ModuleList, blocks)):
                past = kv_cache[s][j] if kv_cache is not None else None
                x, kv = block(x, stage_rope, past, bias)
                kvs.append(kv)
            new_kv.append(torch.stack(kvs))
        if last_logits_only:
            x = x[:, -1:]
        logits: Tensor = self.lm_head(self.final_norm(x))
        timer.lap(len(self.devices) - 1)
        return logits, new_kv

    def param_bytes(self) -> int:
        """Bytes of the weights this model holds (a parameter shared between modules counts once)."""
        return sum(p.numel() * p.element_size() for p in self.parameters())


class _StageTimer:
    """Per-stage seconds of one forward (:meth:`StagedModel.forward`'s ``stage_times``); does
    nothing when no list is given. A stage's time runs from the end of the one before it (the
    start of the forward for the first) to its own end; a remote stage's is the time its server
    reports its layers ran (``nan`` if it reports none: a server of an older version)."""

    def __init__(self, out: list[float] | None, devices: Sequence[torch.device]) -> None:
        self.out, self.devices = out, devices
        self.skip: set[int] = set()
        if out is not None:
            out[:] = [math.nan] * len(devices)
        self.mark = time.perf_counter()

    def lap(self, stage: int) -> None:
        if self.out is None or stage in self.skip:
            return
        device = self.devices[stage]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        now = time.perf_counter()
        self.out[stage] = now - self.mark
        self.mark = now

    def remote(self, stage: int, compute_s: float | None) -> None:
        """Stage ``stage`` ran on another node, whose stage server timed it (``compute_s``): the
        network and the wait for that node's owners are not the stage's."""
        if self.out is not None:
            self.skip.add(stage)
            if compute_s is not None:
                self.out[stage] = compute_s
            self.mark = time.perf_counter()


def load_staged(family: str, seed: int, stages: Sequence[Stage], path: str | None = None) -> StagedModel:
    """Build ``family`` with ``seed`` (the same weights on every node), or with ``path`` load the
    model directory's weights (:func:`service.models.hf.load_model`: this node's layers only),
    and place it by ``stages``.

    The model is built on the first stage's device; the other stages' layers move from there.
    """
    device = torch_device(stages[0].device_id)
    if path is not None:
        from service.models.hf import hf_config, load_model

        check_stages(stages, hf_config(path).n_layers)
        local = {i for s in stages if not s.url for i in range(s.start, s.end)}
        return StagedModel(load_model(path, device=device, layers=local), stages, path=path)
    config = model_config(family)
    check_stages(stages, config.n_layers)
    model = build_model(config, seed=seed, device=device)
    return StagedModel(model, stages, seed=seed)


def activation_bytes(config: ModelConfig, *, batch: int, tokens: int, context: int, all_logits: bool = False) -> int:
    """An upper estimate of the transient bytes of one forward pass (used where no allocator
    counts them, i.e. on the CPU).

    ``batch`` sequences of ``tokens`` new tokens each, attending to ``context`` cached ones.
    Counted: the residual stream and its normalised copy, q/k/v, the keys and values
    concatenated with the cache, the attention scores (as if materialised), the attention
    output, the MLP hidden state(s), the new KV entries of every layer, the attention bias and
    the logits (last position only unless ``all_logits``). One layer's transients are live at
    a time; the new KV of all layers accumulates.
    """
    n = batch * tokens
    d, kv_dim = config.d_model, config.n_kv_heads * config.head_dim
    keys = context + tokens
    hidden = 2 * config.d_ff if config.style == "llama" else config.d_ff
    per_layer = (
        3 * n * d  # residual, normed input, attention output
        + n * (d + 2 * kv_dim)  # q, k, v
        + 2 * batch * keys * kv_dim  # keys and values with the cache
        + batch * config.n_heads * tokens * keys  # scores
        + n * hidden  # MLP hidden state(s)
    )
    new_kv = config.n_layers * 2 * n * kv_dim
    bias = batch * tokens * keys
    logits = (n if all_logits else batch) * config.vocab_size
    elem = torch.empty((), dtype=getattr(torch, config.dtype)).element_size()
    return elem * (per_layer + new_kv + bias + logits)

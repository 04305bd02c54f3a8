"""The built-in model family: small decoder-only transformers defined here, no downloads.

Two block styles share one skeleton: ``gpt2`` (LayerNorm, learned positions, fused QKV, a
plain MLP) and ``llama`` (RMSNorm, rotary positions, grouped-query attention, a gated MLP).
The details a checkpoint varies (biases, a tied head, the activation, norm epsilon, rotary base
and scaling) are config fields, so a Hugging Face GPT-2 or Llama maps onto a config exactly
(:mod:`service.models.hf`). Built-in configs run from a ~1M-parameter ``tiny`` to GPT-2-small's
124M shapes on the CPU; the Llama-2 7B/13B/70B configs are shape-only (built on the ``meta``
device for tracing and simulation, never materialised).

The forward pass is written to be traced by ``torch.fx`` and ``torch.compile`` without
data-dependent control flow. One signature serves both phases::

    logits, kv = model(input_ids[B, T], positions[B, T], kv_cache=None | [L, 2, B, Hkv, C, Dh],
                       attn_bias=None | [B, 1, T, C + T], last_logits_only=False)

Prefill passes no cache and gets the whole cache back; decode passes the cache of ``C``
tokens and gets the ``T`` new entries back (the caller appends them).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from service.domain.model_config import (
    GPT2_FEATURES,
    MODEL_CONFIGS,
    Activation,
    ModelConfig,
    RopeScaling,
    Style,
    model_config,
)

__all__ = ["GPT2_FEATURES", "MODEL_CONFIGS", "Activation", "ModelConfig", "RopeScaling", "Style", "model_config"]

class Attention(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.style = c.style
        bias = c.attention_bias
        if c.style == "gpt2":
            self.qkv_proj = nn.Linear(c.d_model, 3 * c.d_model, bias=bias)
        else:
            self.q_proj = nn.Linear(c.d_model, c.d_model, bias=bias)
            self.k_proj = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=bias)
            self.v_proj = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=bias)
        self.o_proj = nn.Linear(c.d_model, c.d_model, bias=bias)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, past: Tensor | None,
                attn_bias: Tensor | None) -> tuple[Tensor, Tensor]:
        b, t, d = x.shape
        if self.style == "gpt2":
            q, k, v = self.qkv_proj(x).split(d, dim=2)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        new_kv = torch.stack([k, v])
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        gqa = self.n_kv_heads != self.n_heads
        if attn_bias is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, enable_gqa=gqa)
        elif past is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:  # decode of one token per sequence: it sees the whole cache
            y = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        y = y.transpose(1, 2).reshape(b, t, d)
        return self.o_proj(y), new_kv


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _activate(x: Tensor, activation: Activation) -> Tensor:
    if activation == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if activation == "gelu":
        return F.gelu(x)
    if activation == "relu":
        return F.relu(x)
    return F.silu(x)


class MLP(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.style, self.activation = c.style, c.activation
        bias = c.mlp_bias
        if c.style == "llama":
            self.gate_proj = nn.Linear(c.d_model, c.d_ff, bias=bias)
        self.up_proj = nn.Linear(c.d_model, c.d_ff, bias=bias)
        self.down_proj = nn.Linear(c.d_ff, c.d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.style == "gpt2":
            hidden = _activate(self.up_proj(x), self.activation)
        else:
            hidden = _activate(self.gate_proj(x), self.activation) * self.up_proj(x)
        out: Tensor = self.down_proj(hidden)
        return out


def _norm(c: ModelConfig) -> nn.Module:
    return nn.LayerNorm(c.d_model, eps=c.norm_eps) if c.style == "gpt2" else nn.RMSNorm(c.d_model, eps=c.norm_eps)


def rope_inv_freq(c: ModelConfig, device: str | torch.device | None = None) -> Tensor:
    """The rotary inverse frequencies of a llama-style config (float32, ``head_dim / 2`` of them),
    computed as transformers computes them for the same ``rope_theta`` and scaling."""
    hd = c.head_dim
    inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64, device=device).float() / hd))
    scaling = c.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    low_wavelen = scaling.original_max_seq_len / scaling.low_freq_factor
    high_wavelen = scaling.original_max_seq_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_seq_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Block(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = _norm(c)
        self.attn = Attention(c)
        self.mlp_norm = _norm(c)
        self.mlp = MLP(c)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, past: Tensor | None,
                attn_bias: Tensor | None) -> tuple[Tensor, Tensor]:
        h, kv = self.attn(self.attn_norm(x), rope, past, attn_bias)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), kv


def embed_inputs(embed: nn.Module, pos_embed: nn.Module | None, inv_freq: Tensor | nn.Module | None,
                 input_ids: Tensor, positions: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
    """Token embeddings plus learned positions (GPT-2), or with the rotary angles (Llama)."""
    x: Tensor = embed(input_ids)
    if pos_embed is not None:
        return x + pos_embed(positions), None
    assert isinstance(inv_freq, Tensor)
    freqs = positions.unsqueeze(-1).to(torch.float32) * inv_freq
    angles = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)
    return x, (angles.cos().to(x.dtype), angles.sin().to(x.dtype))


def _on_meta() -> bool:
    """Whether tensors are being created under ``torch.device("meta")``. Every model is first
    built there and its weights filled afterwards, so what would compute values on meta is
    skipped: several ops (``normal_``, ``div``) have no native meta kernel, and the first use of
    their Python references imports sympy and torch._dynamo, seconds of an executor's first build."""
    return torch.empty(0).device.type == "meta"


def _embedding(num: int, dim: int) -> nn.Embedding:
    """An embedding table, left uninitialised on meta (see :func:`_on_meta`)."""
    if _on_meta():
        return nn.Embedding(num, dim, _weight=torch.empty(num, dim))
    return nn.Embedding(num, dim)


class DecoderLM(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.config = c
        self.embed = _embedding(c.vocab_size, c.d_model)
        if c.style == "gpt2":
            self.pos_embed = _embedding(c.max_seq_len, c.d_model)
        else:
            # On meta only the shape counts (empty_model computes the values on the real device).
            inv_freq = torch.empty(c.head_dim // 2) if _on_meta() else rope_inv_freq(c)
            self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.final_norm = _norm(c)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, input_ids: Tensor, positions: Tensor, kv_cache: Tensor | None = None,
                attn_bias: Tensor | None = None, last_logits_only: bool = False) -> tuple[Tensor, Tensor]:
        """``last_logits_only``: compute logits for the last position only, as a serving engine
        does when it samples one token per sequence (the traced reference computes all)."""
        x, rope = embed_inputs(self.embed, self.pos_embed if self.config.style == "gpt2" else None,
                               None if self.config.style == "gpt2" else self.inv_freq, input_ids, positions)
        new_kv = []
        for i, block in enumerate(self.blocks):
            past = kv_cache[i] if kv_cache is not None else None
            x, kv = block(x, rope, past, attn_bias)
            new_kv.append(kv)
        if last_logits_only:
            x = x[:, -1:]
        logits = self.lm_head(self.final_norm(x))
        return logits, torch.stack(new_kv)


def _materialise(model: nn.Module, device: torch.device) -> None:
    """Give every meta parameter and buffer of ``model`` uninitialised storage on ``device``, as
    ``Module.to_empty`` does, but through ``torch.empty``: ``to_empty``'s ``empty_like`` of a
    meta tensor runs torch's Python reference, whose first use imports sympy (seconds)."""
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                module._parameters[name] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device),
                                                        requires_grad=p.requires_grad)
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device=device)


def empty_model(config: ModelConfig, device: str | torch.device) -> DecoderLM:
    """The model's modules with uninitialised weights on ``device`` (a tied head stays tied);
    the rotary frequencies are computed. Whoever calls this fills every parameter."""
    with torch.device("meta"):
        model = DecoderLM(config)
    _materialise(model, torch.device(device))
    if config.tie_embeddings:  # materialising unties shared parameters
        model.lm_head.weight = model.embed.weight
    if config.style == "llama":
        model.inv_freq = rope_inv_freq(config, device)
    return model


def build_model(config: ModelConfig, *, seed: int = 0, device: str | torch.device = "cpu") -> DecoderLM:
    """A randomly initialised model, identical for the same ``(config, seed)`` on every node.

    Shape-only configs must be built on ``device="meta"``.
    """
    dtype = getattr(torch, config.dtype)
    if config.shape_only and torch.device(device).type != "meta":
        raise ValueError(f"{config.name} is shape-only: build it on device='meta'")
    if torch.device(device).type == "meta":
        with torch.device("meta"):
            return DecoderLM(config).to(dtype=dtype).eval()
    model = empty_model(config, device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    std = 0.02
    for name, p in model.named_parameters():
        with torch.no_grad():
            if p.dim() == 1:
                p.copy_(torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p))
            else:
                # Scale residual projections down by depth, as GPT-2 does, to keep logits sane.
                scale = std / math.sqrt(2 * config.n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return model.to(dtype=dtype).eval()


def example_inputs(config: ModelConfig, phase: str, *, batch: int, tokens: int = 1, context: int = 0,
                   device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """Inputs of the right shapes for one phase (token ids are zeros; only shapes matter)."""
    dtype = getattr(torch, config.dtype)
    if phase == "prefill":
        ids = torch.zeros(batch, tokens, dtype=torch.long, device=device)
        pos = torch.arange(tokens, device=device).expand(batch, tokens)
        return {"input_ids": ids, "positions": pos}
    if phase == "decode":
        ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        pos = torch.full((batch, 1), context, dtype=torch.long, device=device)
        kv = torch.zeros(config.n_layers, 2, batch, config.n_kv_heads, context, config.head_dim,
                         dtype=dtype, device=device)
        return {"input_ids": ids, "positions": pos, "kv_cache": kv}
    raise ValueError(f"unknown phase {phase!r} (expected prefill or decode)")

"""A decoder-only model's architecture as data: its shape (layers, heads, KV heads, widths), what
checkpoints vary (norms, biases, activation, rotary scaling), and the built-in configs, from a
~1M-parameter ``tiny`` to Llama-2-70B's shapes. No torch here: the simulator, the cost models
and the scheduler price and place models from these numbers alone; :mod:`service.models.family`
builds the PyTorch modules from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from service.domain.error import NotFoundError

Style = Literal["gpt2", "llama"]
Activation = Literal["gelu_tanh", "gelu", "silu", "relu"]  # the MLP's (gated by its gate in the llama style)


@dataclass(frozen=True)
class RopeScaling:
    """Rotary frequencies rescaled for a longer context: ``linear`` divides every inverse
    frequency by ``factor``; ``llama3`` (Llama 3.1) divides the low ones by ``factor``, keeps the
    high ones and interpolates between, with wavelength bounds from ``original_max_seq_len``."""

    kind: Literal["linear", "llama3"]
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_seq_len: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    name: str
    style: Style
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    max_seq_len: int
    dtype: str = "float32"
    shape_only: bool = False  # too large to materialise on this machine: meta device only
    # What checkpoints vary; the defaults are Llama's (the GPT-2 built-ins give GPT2_FEATURES).
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0  # llama style: the rotary base
    rope_scaling: RopeScaling | None = None  # llama style: None is plain rotary positions
    tie_embeddings: bool = False  # the output projection is the token embedding
    attention_bias: bool = False  # biases on the q/k/v and output projections
    mlp_bias: bool = False  # biases on the MLP's projections
    activation: Activation = "silu"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def num_params(self) -> int:
        """Exact parameter count of :class:`DecoderLM` built from this config."""
        d, f, v = self.d_model, self.d_ff, self.vocab_size
        kv = self.n_kv_heads * self.head_dim
        head = 0 if self.tie_embeddings else d * v
        if self.style == "gpt2":
            attn = d * 3 * d + d * d + (3 * d + d if self.attention_bias else 0)
            mlp = d * f + f * d + (f + d if self.mlp_bias else 0)
            norms = 2 * 2 * d  # LayerNorm: weight and bias
            return v * d + self.max_seq_len * d + self.n_layers * (attn + mlp + norms) + 2 * d + head
        attn = d * d + 2 * d * kv + d * d + (d + 2 * kv + d if self.attention_bias else 0)
        mlp = 3 * d * f + (2 * f + d if self.mlp_bias else 0)
        return v * d + self.n_layers * (attn + mlp + 2 * d) + d + head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: What the GPT-2 style's built-ins (and GPT-2 checkpoints) have where Llama has the defaults.
GPT2_FEATURES: dict[str, Any] = {"tie_embeddings": True, "attention_bias": True, "mlp_bias": True,
                                 "activation": "gelu_tanh"}

MODEL_CONFIGS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        ModelConfig("tiny", "gpt2", vocab_size=256, d_model=192, n_layers=2, n_heads=4, n_kv_heads=4,
                    d_ff=768, max_seq_len=512, **GPT2_FEATURES),
        ModelConfig("tiny-llama", "llama", vocab_size=256, d_model=192, n_layers=2, n_heads=4,
                    n_kv_heads=2, d_ff=512, max_seq_len=512),
        ModelConfig("small-llama", "llama", vocab_size=256, d_model=512, n_layers=8, n_heads=8,
                    n_kv_heads=4, d_ff=1408, max_seq_len=1024),
        ModelConfig("gpt2-small", "gpt2", vocab_size=50257, d_model=768, n_layers=12, n_heads=12,
                    n_kv_heads=12, d_ff=3072, max_seq_len=1024, **GPT2_FEATURES),
        ModelConfig("llama2-7b", "llama", vocab_size=32000, d_model=4096, n_layers=32, n_heads=32,
                    n_kv_heads=32, d_ff=11008, max_seq_len=4096, dtype="bfloat16", shape_only=True),
        ModelConfig("llama2-13b", "llama", vocab_size=32000, d_model=5120, n_layers=40, n_heads=40,
                    n_kv_heads=40, d_ff=13824, max_seq_len=4096, dtype="bfloat16", shape_only=True),
        ModelConfig("llama2-70b", "llama", vocab_size=32000, d_model=8192, n_layers=80, n_heads=64,
                    n_kv_heads=8, d_ff=28672, max_seq_len=4096, dtype="bfloat16", shape_only=True),
    )
}


def model_config(name: str, **overrides: Any) -> ModelConfig:
    """The built-in config ``name``, optionally with fields replaced (e.g. ``n_layers=4``)."""
    try:
        config = MODEL_CONFIGS[name]
    except KeyError:
        raise NotFoundError(f"unknown model {name!r} (built-in: {', '.join(MODEL_CONFIGS)})") from None
    return replace(config, **overrides) if overrides else config

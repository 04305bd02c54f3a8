"""Models from disk: a Hugging Face model directory as a :class:`~service.models.family.DecoderLM`.

A directory holds ``config.json``, the weights as ``*.safetensors`` (one file, or shards listed
in ``model.safetensors.index.json``) and the tokenizer's files (:mod:`service.models.hf_tokenizer`).
Only local files are read, never a download: every ``transformers`` call passes
``local_files_only=True`` and ``HF_HUB_OFFLINE`` is set before ``transformers`` is imported.
Pickled ``*.bin`` weights are not read (loading them would run pickled code).

:func:`hf_config` maps the ``llama`` and ``gpt2`` model types onto a :class:`ModelConfig`
exactly (every field the forward pass depends on; anything it cannot express, such as YaRN
rotary scaling or GPT-2's per-layer attention scaling, is refused with the reason).
:func:`load_model` reads the weights with ``safetensors`` into the project's ``DecoderLM``, so
the staged runner, the continuous batcher and the tracer run it unchanged; it can load only some
layers (a remote stage's), leaving the others on the ``meta`` device.

Dtype: the config's ``dtype`` (``torch_dtype`` before transformers 5), float32 when it names
none. The weights are cast to it on every device, the CPU included: torch has CPU kernels for
bfloat16 and float16 (slower than float32 on most CPUs, and rounded as the checkpoint's dtype
rounds, as ``transformers`` itself runs such a model on the CPU).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from service.domain.error import InvalidInputError
from service.domain.model_config import ModelConfig, RopeScaling
from service.models.family import DecoderLM, rope_inv_freq

SUPPORTED_TYPES = ("gpt2", "llama")
HF_PREFIX = "hf:"  # a model from disk is named "hf:<its directory>"
_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
                     "silu": "silu", "swish": "silu"}
_LLAMA_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                      "gelu_new": "gelu_tanh", "relu": "relu"}


def offline() -> None:
    """Forbid the Hugging Face hub any network access (read when ``transformers`` is imported)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def model_dir(path: str | Path) -> Path:
    """``path`` as a model directory: absolute (executors on other nodes read the same path), a
    directory, with ``config.json`` and safetensors weights; ``InvalidInputError`` otherwise."""
    p = Path(path)
    if not p.is_absolute():
        raise InvalidInputError(f"model path {str(path)!r} must be absolute (executors read the same path)")
    p = Path(os.path.normpath(p))
    if not p.is_dir():
        raise InvalidInputError(f"no model directory at {p}")
    if not (p / "config.json").is_file():
        raise InvalidInputError(f"{p} has no config.json (a Hugging Face model directory is expected)")
    if not weight_files(p):
        raise InvalidInputError(f"{p} has no *.safetensors weights (pickled *.bin weights are not read)")
    return p


def weight_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors"))


def hf_config(path: str | Path) -> ModelConfig:
    """The :class:`ModelConfig` of the model in ``path`` (named ``hf:<path>``); an
    ``InvalidInputError`` naming what is supported when the model cannot be expressed."""
    p = model_dir(path)
    try:
        raw = json.loads((p / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"{p}/config.json: cannot read it: {exc}") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type not in SUPPORTED_TYPES:
        raise InvalidInputError(f"{p}: model_type {model_type!r} is not supported "
                                f"(supported: {', '.join(SUPPORTED_TYPES)})")
    if raw.get("quantization_config"):
        raise InvalidInputError(f"{p}: quantized checkpoints are not supported")
    offline()
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(p, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise InvalidInputError(f"{p}/config.json: {str(exc).splitlines()[0][:300]}") from None
    name, dtype = f"{HF_PREFIX}{p}", _dtype(cfg, p)
    try:
        return _gpt2(cfg, name, dtype) if model_type == "gpt2" else _llama(cfg, name, dtype)
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        raise InvalidInputError(f"{p}/config.json: not a usable {model_type} config: {exc}") from None


def _dtype(cfg: Any, p: Path) -> str:
    value = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    if value is None:
        return "float32"
    name = str(value).removeprefix("torch.")
    if name not in _DTYPES:
        raise InvalidInputError(f"{p}: dtype {name!r} is not supported (supported: {', '.join(_DTYPES)})")
    return _DTYPES[name]


def _activation(p: str, act: str, known: dict[str, str]) -> str:
    if act not in known:
        raise InvalidInputError(f"{p}: activation {act!r} is not supported (supported: {', '.join(known)})")
    return known[act]


def _gpt2(cfg: Any, name: str, dtype: str) -> ModelConfig:
    if not getattr(cfg, "scale_attn_weights", True) or getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
        raise InvalidInputError(f"{name}: only GPT-2's standard 1/sqrt(head_dim) attention scaling is supported")
    if getattr(cfg, "add_cross_attention", False):
        raise InvalidInputError(f"{name}: cross-attention is not supported")
    d = int(cfg.n_embd)
    return ModelConfig(
        name, "gpt2", vocab_size=int(cfg.vocab_size), d_model=d, n_layers=int(cfg.n_layer), n_heads=int(cfg.n_head),
        n_kv_heads=int(cfg.n_head), d_ff=int(cfg.n_inner or 4 * d), max_seq_len=int(cfg.n_positions), dtype=dtype,
        norm_eps=float(cfg.layer_norm_epsilon), tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", True)),
        attention_bias=True, mlp_bias=True,
        activation=_activation(name, str(cfg.activation_function), _GPT2_ACTIVATIONS),  # type: ignore[arg-type]
    )


def _llama(cfg: Any, name: str, dtype: str) -> ModelConfig:
    d, heads = int(cfg.hidden_size), int(cfg.num_attention_heads)
    head_dim = getattr(cfg, "head_dim", None)
    if d % heads or (head_dim is not None and int(head_dim) != d // heads):
        raise InvalidInputError(f"{name}: head_dim {head_dim} != hidden_size / num_attention_heads is not supported")
    theta, scaling = _rope(cfg, name)
    return ModelConfig(
        name, "llama", vocab_size=int(cfg.vocab_size), d_model=d, n_layers=int(cfg.num_hidden_layers),
        n_heads=heads, n_kv_heads=int(cfg.num_key_value_heads or heads), d_ff=int(cfg.intermediate_size),
        max_seq_len=int(cfg.max_position_embeddings), dtype=dtype, norm_eps=float(cfg.rms_norm_eps),
        rope_theta=theta, rope_scaling=scaling, tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        attention_bias=bool(getattr(cfg, "attention_bias", False)), mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
        activation=_activation(name, str(cfg.hidden_act), _LLAMA_ACTIVATIONS),  # type: ignore[arg-type]
    )


def _rope(cfg: Any, name: str) -> tuple[float, RopeScaling | None]:
    """Rotary base and scaling from ``rope_parameters`` (transformers 5) or ``rope_theta`` and
    ``rope_scaling`` (earlier configs)."""
    params = getattr(cfg, "rope_parameters", None)
    if not isinstance(params, dict):
        params = {"rope_theta": getattr(cfg, "rope_theta", 10000.0), **(getattr(cfg, "rope_scaling", None) or {})}
    kind = params.get("rope_type") or params.get("type") or "default"
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise InvalidInputError(f"{name}: partial rotary embeddings are not supported")
    theta = float(params.get("rope_theta", 10000.0))
    if kind == "default":
        return theta, None
    if kind == "linear":
        return theta, RopeScaling("linear", float(params["factor"]))
    if kind == "llama3":
        return theta, RopeScaling("llama3", float(params["factor"]), float(params["low_freq_factor"]),
                                  float(params["high_freq_factor"]), int(params["original_max_position_embeddings"]))
    raise InvalidInputError(f"{name}: rope type {kind!r} is not supported (supported: default, linear, llama3)")


# ---- weights -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HFWeight:
    """Where one ``DecoderLM`` parameter is in the checkpoint: its name there and whether it is
    stored transposed (GPT-2's ``Conv1D`` keeps ``[in, out]``)."""

    name: str
    transposed: bool = False


def weight_map(config: ModelConfig, prefix: str) -> dict[str, HFWeight]:
    """``DecoderLM`` parameter name -> checkpoint weight, for every parameter of ``config``
    (a tied head is the embedding: it has no entry). ``prefix``: the checkpoint's name for the
    base model (``model.``, ``transformer.`` or empty)."""
    out: dict[str, HFWeight] = {}
    gpt2 = config.style == "gpt2"
    biases = ("weight", "bias")
    out["embed.weight"] = HFWeight(prefix + ("wte.weight" if gpt2 else "embed_tokens.weight"))
    if gpt2:
        out["pos_embed.weight"] = HFWeight(prefix + "wpe.weight")
    for i in range(config.n_layers):
        ours, theirs = f"blocks.{i}.", prefix + (f"h.{i}." if gpt2 else f"layers.{i}.")
        if gpt2:
            pairs = [("attn_norm", "ln_1", biases, False), ("mlp_norm", "ln_2", biases, False),
                     ("attn.qkv_proj", "attn.c_attn", _kinds(config.attention_bias), True),
                     ("attn.o_proj", "attn.c_proj", _kinds(config.attention_bias), True),
                     ("mlp.up_proj", "mlp.c_fc", _kinds(config.mlp_bias), True),
                     ("mlp.down_proj", "mlp.c_proj", _kinds(config.mlp_bias), True)]
        else:
            pairs = [("attn_norm", "input_layernorm", ("weight",), False),
                     ("mlp_norm", "post_attention_layernorm", ("weight",), False)]
            pairs += [(f"attn.{x}_proj", f"self_attn.{x}_proj", _kinds(config.attention_bias), False) for x in "qkvo"]
            pairs += [(f"mlp.{x}_proj", f"mlp.{x}_proj", _kinds(config.mlp_bias), False) for x in ("gate", "up", "down")]
        for mine, hf, kinds, conv1d in pairs:
            for kind in kinds:
                out[f"{ours}{mine}.{kind}"] = HFWeight(f"{theirs}{hf}.{kind}", conv1d and kind == "weight")
    for kind in biases if gpt2 else ("weight",):
        out[f"final_norm.{kind}"] = HFWeight(prefix + ("ln_f." if gpt2 else "norm.") + kind)
    if not config.tie_embeddings:
        out["lm_head.weight"] = HFWeight("lm_head.weight")
    return out


def _kinds(bias: bool) -> tuple[str, ...]:
    return ("weight", "bias") if bias else ("weight",)


def _locations(p: Path) -> dict[str, Path]:
    """Checkpoint weight name -> the safetensors file holding it (the shard index when there is
    one, else every file's header)."""
    from safetensors import safe_open

    index = p / "model.safetensors.index.json"
    if index.is_file():
        try:
            entries = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InvalidInputError(f"{index}: not a shard index: {exc}") from None
        return {str(k): p / str(v) for k, v in entries.items()}
    out: dict[str, Path] = {}
    for f in weight_files(p):
        try:
            with safe_open(str(f), framework="pt") as h:
                out.update(dict.fromkeys(h.keys(), f))
        except Exception as exc:  # safetensors raises its own error types for a bad header
            raise InvalidInputError(f"{f}: not a safetensors file: {str(exc)[:200]}") from None
    return out


def _prefix(config: ModelConfig, names: Iterable[str]) -> str:
    """The checkpoint's name for the base model: ``transformer.`` / ``model.`` (saved from the
    ``...ForCausalLM`` class) or nothing (saved from the base model)."""
    embed = "wte.weight" if config.style == "gpt2" else "embed_tokens.weight"
    found = [n.removesuffix(embed) for n in names if n.endswith(embed)]
    return found[0] if found else ("transformer." if config.style == "gpt2" else "model.")


def _shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """``DecoderLM`` parameter name -> its shape (the model built on the meta device)."""
    with torch.device("meta"):
        return {name: tuple(t.shape) for name, t in DecoderLM(config).state_dict().items()}


def check_weights(path: str | Path, config: ModelConfig) -> None:
    """Every weight ``config`` needs is in the checkpoint with its shape (headers only, nothing
    loaded); ``InvalidInputError`` naming the first few that are not."""
    from safetensors import safe_open

    p = model_dir(path)
    where = _locations(p)
    mapping = weight_map(config, _prefix(config, where))
    shapes = _shapes(config)
    problems = [f"{w.name} missing" for w in mapping.values() if w.name not in where]
    by_file: dict[Path, list[tuple[str, HFWeight]]] = {}
    for ours, w in mapping.items():
        if w.name in where:
            by_file.setdefault(where[w.name], []).append((ours, w))
    for f, items in sorted(by_file.items()):
        if not f.is_file():
            problems.append(f"{f.name} (named by the shard index) missing")
            continue
        with safe_open(str(f), framework="pt") as h:
            for ours, w in items:
                got, want = tuple(h.get_slice(w.name).get_shape()), shapes[ours]
                want = want[::-1] if w.transposed else want
                if got != want:
                    problems.append(f"{w.name} has shape {list(got)}, the config needs {list(want)}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise InvalidInputError(f"{p}: the weights do not fit config.json: {'; '.join(problems[:5])}{more}")


def load_model(path: str | Path, *, device: str | torch.device = "cpu", layers: Collection[int] | None = None,
               ends: bool = True) -> DecoderLM:
    """The model in ``path`` with its weights read from disk onto ``device`` in the config's dtype.

    ``layers``: the blocks to load (default all); ``ends``: whether to load the embedding, the
    final norm and the head. What is not loaded stays on the ``meta`` device (a stage placed on
    another node needs none of it here).
    """
    from safetensors import safe_open

    config = hf_config(path)
    p = model_dir(path)
    dtype = getattr(torch, config.dtype)
    with torch.device("meta"):
        model = DecoderLM(config)
    wanted = range(config.n_layers) if layers is None else layers
    where = _locations(p)
    mapping = weight_map(config, _prefix(config, where))
    needed = {ours: w for ours, w in mapping.items()
              if (int(ours.split(".")[1]) in wanted if ours.startswith("blocks.") else ends)}
    missing = sorted(w.name for w in needed.values() if w.name not in where)
    if missing:
        raise InvalidInputError(f"{p}: weights missing from the checkpoint: {', '.join(missing[:5])}")
    by_file: dict[Path, list[tuple[str, HFWeight]]] = {}
    for ours, w in needed.items():
        by_file.setdefault(where[w.name], []).append((ours, w))
    state: dict[str, torch.Tensor] = {}
    target = torch.device(device)
    for f, items in sorted(by_file.items()):
        with safe_open(str(f), framework="pt", device=str(target)) as h:
            for ours, w in items:
                tensor = h.get_tensor(w.name)
                state[ours] = (tensor.t() if w.transposed else tensor).to(dtype).contiguous()
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_embeddings:  # assigning the embedding replaced the parameter the head shared
        model.lm_head.weight = model.embed.weight
    if config.style == "llama":
        model.inv_freq = rope_inv_freq(config, target)
    return model.eval()

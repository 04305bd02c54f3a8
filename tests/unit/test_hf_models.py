"""Models from disk: a tiny random Llama and GPT-2 saved by ``transformers`` load into the
project's DecoderLM with the same logits and the same greedy tokens as ``transformers`` itself."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from executor.batcher import ContinuousBatcher, GenerationRequest, generate_alone
from executor.remote import StageServer
from executor.runner import Stage, load_staged
from service.domain.error import InvalidInputError
from service.domain.model_config import MODEL_CONFIGS, ModelConfig, RopeScaling
from service.models.family import rope_inv_freq
from service.models.hf import check_weights, hf_config, load_model
from service.models.hf_tokenizer import HFTokenizer
from service.models.trace import trace_phase
from service.sim.iteration import kv_bytes_per_token, weight_bytes
from tests.hf_dirs import EOS, EOS_STEP, PROMPT, SENTENCES, greedy

KINDS = ("llama", "gpt2")
PROMPTS = [PROMPT, "hello world", "a model on disk answers", "the lazy dog jumps over the brown fox today"]


def hf_model(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()


def until_stop(tokens: Sequence[int], stop_ids: Sequence[int]) -> list[int]:
    """The tokens up to and including the first stop id (what a generation that stops yields)."""
    out: list[int] = []
    for t in tokens:
        out.append(t)
        if t in stop_ids:
            break
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_config_maps_exactly_and_counts_the_parameters_of_the_checkpoint(hf_dirs: dict[str, Path],
                                                                              kind: str) -> None:
    c = hf_config(hf_dirs[kind])
    reference = hf_model(hf_dirs[kind])
    assert c.name == f"hf:{hf_dirs[kind]}" and c.style == kind and c.dtype == "float32"
    assert (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.max_seq_len) == (64, 64, 4, 4, 128)
    if kind == "llama":
        assert (c.n_kv_heads, c.d_ff, c.norm_eps, c.rope_theta, c.tie_embeddings, c.activation) == \
            (2, 96, 1e-6, 500000.0, False, "silu")
    else:
        assert (c.n_kv_heads, c.d_ff, c.norm_eps, c.tie_embeddings, c.attention_bias, c.activation) == \
            (4, 256, 1e-5, True, True, "gelu_tanh")
    assert c.num_params() == sum(p.numel() for p in reference.parameters())
    check_weights(hf_dirs[kind], c)


def test_built_in_configs_keep_their_parameter_counts() -> None:
    # GPT-2 small's and Llama-2 7B's published sizes: the new fields' defaults change nothing
    assert MODEL_CONFIGS["gpt2-small"].num_params() == 124_439_808
    assert MODEL_CONFIGS["llama2-7b"].num_params() == 6_738_415_616


@pytest.mark.parametrize("kind", KINDS)
def test_the_loaded_model_has_the_logits_of_transformers(hf_dirs: dict[str, Path], kind: str) -> None:
    model, reference = load_model(hf_dirs[kind]), hf_model(hf_dirs[kind])
    ids = torch.tensor([HFTokenizer.load(hf_dirs[kind]).encode(SENTENCES[0])])
    with torch.no_grad():
        ours, _ = model(ids, torch.arange(ids.shape[1])[None])
        theirs = reference(ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_decoding_in_the_batcher_equals_transformers_generate(hf_dirs: dict[str, Path], kind: str) -> None:
    tok, reference = HFTokenizer.load(hf_dirs[kind]), hf_model(hf_dirs[kind])
    assert tok.stop_ids == (EOS,)
    staged = load_staged(f"hf:{hf_dirs[kind]}", 0, [Stage("cpu:0", 0, 2), Stage("cpu:1", 2, 4)], str(hf_dirs[kind]))
    batcher = ContinuousBatcher(staged, max_batch=4)
    prompts = [tok.encode(p) for p in PROMPTS]
    for i, p in enumerate(prompts):  # of different lengths, decoded in one batch
        batcher.submit(GenerationRequest(str(i), p, 12))
    while not batcher.idle:
        batcher.step()
    got = {r.request_id: r.tokens for r in batcher.take_finished()}
    alone = load_model(hf_dirs[kind])
    for i, p in enumerate(prompts):
        want = greedy(reference, p, 12)
        assert until_stop(got[str(i)], tok.stop_ids) == want
        assert until_stop(generate_alone(alone, p, 12), tok.stop_ids) == want
    stopped = greedy(reference, prompts[0], 12)
    assert len(stopped) == EOS_STEP + 1 and stopped[-1] == EOS  # the rigged prompt does reach the EOS


@pytest.fixture
def server() -> Iterator[StageServer]:
    s = StageServer().start()
    yield s
    s.close()


def test_a_remote_stage_reads_only_its_layers_and_generates_the_same_tokens(hf_dirs: dict[str, Path],
                                                                             server: StageServer) -> None:
    path = str(hf_dirs["llama"])
    staged = load_staged(f"hf:{path}", 0, [Stage("cpu:0", 0, 1), Stage("cpu:0", 1, 4, server.url)], path)
    whole = load_model(path)
    block_bytes = sum(p.numel() * p.element_size() for p in whole.blocks[0].parameters())
    assert staged.param_bytes() == sum(p.numel() * p.element_size() for p in whole.parameters()) - 3 * block_bytes
    prompt = HFTokenizer.load(path).encode(PROMPT)
    batcher = ContinuousBatcher(staged, max_batch=2)
    batcher.submit(GenerationRequest("r", prompt, 8))
    while not batcher.idle:
        batcher.step()
    assert batcher.take_finished()[0].tokens == generate_alone(whole, prompt, 8)
    assert server.calls > 0


def test_the_tokenizer_is_the_models_own(hf_dirs: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    for kind in KINDS:
        tok, reference = HFTokenizer.load(hf_dirs[kind]), AutoTokenizer.from_pretrained(hf_dirs[kind])
        assert tok.encode(PROMPT) == reference(PROMPT)["input_ids"]
        assert tok.encode(PROMPT)[0] == 1 if kind == "llama" else tok.encode(PROMPT)[0] != 1  # Llama's BOS
        messages = [{"role": "system", "content": "you are a helpful model"}, {"role": "user", "content": "hello"}]
        chat = tok.chat(messages)
        assert chat == reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                     return_dict=False)
        assert tok.decode(chat) == "system : you are a helpful model user : hello assistant :"
        assert tok.decode([*tok.encode("hello world"), EOS, 63]) == "hello world"  # special and unknown ids dropped


def test_a_model_without_a_chat_template_refuses_chat(hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(hf_dirs["gpt2"], plain)
    (plain / "chat_template.jinja").unlink()
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidInputError, match="no chat template"):
        HFTokenizer.load(plain).chat([{"role": "user", "content": "hello"}])


def test_unusable_directories_are_refused_with_the_reason(hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="absolute"):
        hf_config("relative/model")
    with pytest.raises(InvalidInputError, match="no model directory"):
        hf_config(tmp_path / "absent")
    with pytest.raises(InvalidInputError, match=r"no config\.json"):
        hf_config(tmp_path)
    other = tmp_path / "other"
    shutil.copytree(hf_dirs["llama"], other)
    raw = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**raw, "model_type": "mistral"}))
    with pytest.raises(InvalidInputError, match=r"'mistral' is not supported \(supported: gpt2, llama\)"):
        hf_config(other)
    (other / "config.json").write_text(json.dumps({**raw, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}))
    with pytest.raises(InvalidInputError, match="rope type 'yarn' is not supported"):
        hf_config(other)
    (other / "config.json").write_text(json.dumps({**raw, "intermediate_size": 128}))
    with pytest.raises(InvalidInputError, match=r"mlp\.gate_proj\.weight has shape"):
        check_weights(other, hf_config(other))
    (other / "config.json").write_text(json.dumps(raw))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (other / name).unlink()
    with pytest.raises(InvalidInputError, match="no usable tokenizer"):
        HFTokenizer.load(other)
    (other / "model.safetensors").unlink()
    with pytest.raises(InvalidInputError, match=r"no \*\.safetensors weights"):
        hf_config(other)


def test_llama3_rotary_scaling_matches_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    hf = LlamaConfig(hidden_size=4096, num_attention_heads=32, max_position_embeddings=131072, rope_theta=500000.0,
                     rope_scaling=scaling)
    ours = ModelConfig("l3", "llama", vocab_size=8, d_model=4096, n_layers=1, n_heads=32, n_kv_heads=8, d_ff=8,
                       max_seq_len=131072, rope_theta=500000.0, rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192))
    assert torch.equal(rope_inv_freq(ours), LlamaRotaryEmbedding(hf).inv_freq)


@pytest.mark.slow
def test_a_llama3_8b_config_traces_on_meta_and_sizes_from_its_config(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001}))
    save_file({"placeholder": torch.zeros(1)}, str(tmp_path / "model.safetensors"))  # the config is what is read
    c = hf_config(tmp_path)
    assert c.num_params() == 8_030_261_248  # Llama-3-8B's published size
    assert weight_bytes(c) == 2 * 8_030_261_248 and kv_bytes_per_token(c) == 2 * 32 * 8 * 128 * 2
    graph = trace_phase(c, "decode", batch=8, context=256)
    assert graph.bytes_of("weight") == weight_bytes(c) + c.head_dim // 2 * 2  # plus the rotary frequencies
    with pytest.raises(InvalidInputError, match=r"model\.embed_tokens\.weight missing"):
        check_weights(tmp_path, c)


def test_a_bfloat16_checkpoint_runs_in_bfloat16_on_the_cpu(hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(hf_dirs["llama"], dtype=torch.bfloat16).eval()
    reference.save_pretrained(tmp_path)
    shutil.copy(hf_dirs["llama"] / "tokenizer.json", tmp_path)
    assert hf_config(tmp_path).dtype == "bfloat16"
    model = load_model(tmp_path)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    ids = torch.tensor([HFTokenizer.load(hf_dirs["llama"]).encode(SENTENCES[1])])
    with torch.no_grad():
        ours, _ = model(ids, torch.arange(ids.shape[1])[None])
        theirs = reference(ids).logits
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours, theirs)  # bfloat16 tolerances

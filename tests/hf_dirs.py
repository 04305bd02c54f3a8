"""Tiny random Hugging Face model directories built at test time (no download): a Llama and a
GPT-2 made with ``transformers`` (``from_config``, ``save_pretrained``) and a word-level
tokenizer trained on a few sentences, with a chat template.

Each model is rigged to end :data:`PROMPT`'s greedy continuation with its EOS: the greedy
output of the random weights is computed, and the token it produces at step :data:`EOS_STEP`
swaps rows with the EOS in the embedding and the head. Swapping two vocabulary rows relabels
the two tokens and changes nothing else, so the greedy output is the same with that token
replaced by the EOS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a model on disk answers every question with a story",
    "hello world , how are you today ?",
    "user : tell me about the weather in the north",
    "assistant : it is sunny and warm with a light wind",
    "system : you are a helpful and brief model",
]
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
BOS, EOS, PAD = 1, 2, 3
VOCAB = 64  # the models' vocabulary: more ids than the tokenizer knows (decoding drops the rest)
PROMPT = "the quick brown fox"
EOS_STEP = 5  # PROMPT's greedy continuation ends with the EOS as its token number EOS_STEP + 1
CHAT_TEMPLATE = ("{% for m in messages %}<s> {{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant :{% endif %}")


def make_tokenizer(bos: bool) -> Any:
    """A word-level tokenizer over :data:`SENTENCES` with ``<s>``/``</s>`` (``bos``: text
    encodes with a leading ``<s>``, as Llama's tokenizer does; GPT-2's adds nothing)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.trainers import WordLevelTrainer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, WordLevelTrainer(special_tokens=SPECIALS))
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    assert len(fast) <= VOCAB and fast.eos_token_id == EOS
    return fast


def _config(kind: str) -> Any:
    from transformers import GPT2Config, LlamaConfig

    if kind == "llama":
        return LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                           rms_norm_eps=1e-6, rope_theta=500000.0, bos_token_id=BOS, eos_token_id=EOS,
                           pad_token_id=PAD, tie_word_embeddings=False)
    return GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=4, n_head=4, n_positions=128, bos_token_id=BOS,
                      eos_token_id=EOS, pad_token_id=PAD, initializer_range=0.3)  # GPT-2's 0.02 repeats one token


def greedy(model: Any, ids: list[int], max_new_tokens: int, eos: int | None = EOS) -> list[int]:
    """``transformers``' own greedy generation (stopping at ``eos``): the new tokens only."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos, pad_token_id=PAD, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return [int(t) for t in out[0, len(ids):]]


def _swap_rows(model: Any, a: int, b: int) -> None:
    with torch.no_grad():
        for weight in {id(w): w for w in (model.get_input_embeddings().weight,
                                          model.get_output_embeddings().weight)}.values():
            weight[[a, b]] = weight[[b, a]]


def make_model_dir(path: Path, kind: str, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> Path:
    """A tiny random ``kind`` ("llama" or "gpt2") model with its tokenizer saved in ``path``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(kind), dtype=dtype).eval()
    tok = make_tokenizer(bos=kind == "llama")
    prompt = tok(PROMPT)["input_ids"]
    free = greedy(model, prompt, 3 * EOS_STEP, eos=None)
    target = free[EOS_STEP]
    assert target not in (*prompt, *free[:EOS_STEP], EOS), f"seed {seed}: pick another (greedy output {free})"
    _swap_rows(model, target, EOS)
    model.generation_config.eos_token_id = EOS
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path

"""A model directory's own tokenizer and chat template, as the API's
:class:`~service.domain.tokenizer.Tokenizer`.

Prompts are tokenized as ``transformers`` users feed ``generate``: ``tokenizer(text)`` with
the tokenizer's special tokens (a Llama tokenizer puts its BOS first; GPT-2's adds none), and a
conversation with the model's chat template (``apply_chat_template(...,
add_generation_prompt=True)``, which writes its special tokens itself). Decoding skips special
tokens. The stop ids are the end-of-sequence ids of ``generation_config.json``, else of
``config.json``, else the tokenizer's EOS. Local files only (:func:`service.models.hf.offline`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from service.domain.error import InvalidInputError
from service.models.hf import model_dir, offline


class HFTokenizer:
    """``tokenizer``: a loaded ``transformers`` tokenizer; ``stop_ids``: the ids that end
    generation. :meth:`load` reads both from a model directory."""

    def __init__(self, tokenizer: Any, stop_ids: Sequence[int]) -> None:
        self._tok = tokenizer
        self._stop_ids = tuple(dict.fromkeys(int(t) for t in stop_ids))

    @staticmethod
    def load(path: str | Path) -> HFTokenizer:
        """The tokenizer of the model in ``path``; ``InvalidInputError`` when it has none."""
        p = model_dir(path)
        offline()
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(p, local_files_only=True)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise InvalidInputError(f"{p}: no usable tokenizer (tokenizer.json, or the files of the model's own "
                                    f"tokenizer class): {str(exc).splitlines()[0][:300]}") from None
        return HFTokenizer(tok, stop_ids_of(p, tok.eos_token_id))

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._tok(text)["input_ids"]]

    def decode(self, tokens: Sequence[int]) -> str:
        known = len(self._tok)  # a model's vocabulary may be padded past its tokenizer's
        text: str = self._tok.decode([t for t in tokens if 0 <= t < known], skip_special_tokens=True)
        return text

    def chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        if not self._tok.chat_template:
            raise InvalidInputError("this model has no chat template: send a plain prompt instead")
        from jinja2 import TemplateError

        try:
            ids = self._tok.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
        except (TemplateError, ValueError, TypeError, KeyError) as exc:
            raise InvalidInputError(f"the model's chat template refused the conversation: {exc}") from None
        return [int(t) for t in ids]

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return self._stop_ids


def stop_ids_of(p: Path, tokenizer_eos: int | None) -> tuple[int, ...]:
    """The end-of-sequence ids of the model in ``p`` (see the module docstring); none: ()."""
    for name in ("generation_config.json", "config.json"):
        f = p / name
        if not f.is_file():
            continue
        try:
            eos = json.loads(f.read_text()).get("eos_token_id")
        except (OSError, json.JSONDecodeError, AttributeError):
            raise InvalidInputError(f"{f}: not a JSON object") from None
        if isinstance(eos, int) and not isinstance(eos, bool):
            return (eos,)
        if isinstance(eos, list) and eos and all(isinstance(e, int) and not isinstance(e, bool) for e in eos):
            return tuple(eos)
    return (tokenizer_eos,) if tokenizer_eos is not None else ()

"""Tokenizers of the live API: text <-> token ids, and chat messages -> a prompt.

:class:`Tokenizer` is what the API needs of one. Built-in runnable models use :data:`BYTES`
(token ``i`` is byte ``i`` of the UTF-8 text: every built-in model has a vocabulary of at least
256 ids, so any text encodes; ids above 255 decode to U+FFFD, as do invalid UTF-8 sequences).
A model loaded from disk brings its own tokenizer and chat template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class Tokenizer(Protocol):
    """What the API asks of a model's tokenizer."""

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` as a prompt: with the special tokens the tokenizer itself adds
        to a text (a Llama tokenizer's BOS; the byte tokenizer adds none)."""
        ...

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens``; special tokens (an end-of-sequence) are left out."""
        ...

    def chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The prompt ids of a conversation (``[{role, content}]``) ready for the assistant's reply."""
        ...

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end generation when produced (none: only ``max_tokens`` does)."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens. Its chat template is plain text, one line per message
    (``role: content``), then ``assistant:``; it has no stop ids."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, tokens: Sequence[int]) -> str:
        return b"".join(bytes([t]) if 0 <= t < 256 else "\ufffd".encode() for t in tokens).decode("utf-8", "replace")

    def chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        lines = [f"{m['role']}: {m['content']}\n" for m in messages]
        return self.encode("".join(lines) + "assistant:")

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return ()


BYTES = ByteTokenizer()


def encode(text: str) -> list[int]:
    return BYTES.encode(text)


def decode(tokens: Sequence[int]) -> str:
    return BYTES.decode(tokens)

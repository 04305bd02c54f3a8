"""A byte-level tokenizer for the live API: token ``i`` is the byte ``i`` of the UTF-8 text.

Every built-in runnable model has a vocabulary of at least 256 ids, so any text encodes; ids
the model generates above 255 decode to U+FFFD, as do invalid UTF-8 sequences.
"""

from __future__ import annotations


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(tokens: list[int]) -> str:
    return b"".join(bytes([t]) if 0 <= t < 256 else "\ufffd".encode() for t in tokens).decode("utf-8", "replace")

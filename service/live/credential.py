"""API keys: new random keys and the digest under which they are stored (never the key)."""

from __future__ import annotations

import hashlib
import secrets


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(24)}"

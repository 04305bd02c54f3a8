"""A table of answers: what a Cypher inspection returns (columns, rows, whether the row cap cut it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Table:
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool = False  # the query had more rows than the cap; ``rows`` holds the first ones

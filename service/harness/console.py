"""Terminal output shared by the CLI's commands: tables, with numbers kept readable.

``rich`` is imported when a table is printed, not when this module is, so that the CLI starts fast.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def _console() -> Any:
    from rich.console import Console

    return Console(soft_wrap=False, width=max(100, Console().width))


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None) -> None:
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold")
    for c in columns:
        table.add_column(str(c), overflow="fold")
    for r in rows:
        table.add_row(*(_fmt(v) for v in r))
    _console().print(table)


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    if isinstance(value, int) and not isinstance(value, bool):
        return _si(value) if abs(value) >= 10_000_000 else f"{value:,}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def _si(value: float) -> str:
    """1234567890 -> '1.23G': big counts (FLOPs, bytes) stay readable in narrow tables."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:,}"

"""Plots the service draws for its pages: the comparison of two experiments' headlines (the web
console's experiment page and ``slicesched experiments compare``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO


def plot_headline(target: Path | BinaryIO, rows: Sequence[Sequence[Any]], a_name: str, b_name: str) -> None:
    """The comparison plot of :func:`~service.domain.experiment.headline_rows` ``rows`` (key,
    figure, A, B), written to a path or a binary file as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    keys = sorted({key for key, *_ in rows})
    figures = {("tokens/s", key): (va, vb) for key, label, va, vb in rows if label == "tokens/s"}
    figures |= {("SLA viol.", key): (va, vb) for key, label, va, vb in rows if label == "SLA viol."}
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(keys) + 4), 4.5))
    x = np.arange(len(keys))
    width = 0.38
    for ax, (label, ylabel) in zip(axes, (("tokens/s", "output tokens/s"), ("SLA viol.", "SLA violation rate")),
                                   strict=True):
        for offset, name, side in ((-width / 2, a_name, 0), (width / 2, b_name, 1)):
            values = [figures[(label, k)][side] for k in keys]
            ax.bar(x + offset, [np.nan if v is None else v for v in values], width, label=name)
        ax.set_xticks(x, keys, rotation=20, ha="right")
        ax.set_ylim(bottom=0)
        ax.set_ylabel(ylabel)
        ax.set_title(label)
        ax.legend(fontsize=8)
    fig.suptitle(f"{a_name} vs {b_name}")
    fig.tight_layout()
    fig.savefig(target, dpi=110, format="png")
    plt.close(fig)

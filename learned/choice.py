"""Which cost model prices iterations: the kinds, ``--cost-model`` and ``$SLICESCHED_COST_MODEL``.

Light on purpose (no torch): the CLI builds its parsers from it. Loading is
:func:`learned.artifact.load_cost_model`.
"""

from __future__ import annotations

import argparse

from service import environment as env
from service.domain.error import InvalidInputError

KINDS: tuple[str, ...] = ("learned", "gnn", "table", "roofline")
DEFAULT_KIND = "learned"
KIND_ENV = "SLICESCHED_COST_MODEL"
TRAIN_COMMAND = "slicesched cost-model train"


def kind_from(value: str | None) -> str:
    """The cost-model kind asked for (``value``, else ``$SLICESCHED_COST_MODEL``, else the default)."""
    kind = value or env.raw(KIND_ENV) or DEFAULT_KIND
    if kind not in KINDS:
        raise InvalidInputError(f"unknown cost model {kind!r} (known: {', '.join(KINDS)}; "
                                f"from --cost-model or ${KIND_ENV})", culprit=kind)
    return kind


def add_cost_model_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cost-model", choices=KINDS, default=None,
                   help=f"iteration cost model (default ${KIND_ENV} or {DEFAULT_KIND}: per device kind the learned "
                        f"model most accurate on held-out profiles, with host overheads; needs `{TRAIN_COMMAND}` "
                        "once); roofline: analytic, no artifact")

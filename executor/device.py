"""Executor device ids (``cpu:N``, ``cuda:N``) and the torch devices they name."""

from __future__ import annotations

import re

import torch

_DEVICE_ID = re.compile(r"^(cpu|cuda)(?::(\d+))?$")
AUTO = "auto"  # ``--devices auto``: every CUDA device this process sees, else one CPU device


def visible_device_ids() -> list[str]:
    """The device ids ``--devices auto`` stands for: ``cuda:0`` ... ``cuda:N-1`` for the CUDA
    devices torch sees (under Kubernetes, the GPUs the device plugin gave this container), or
    ``["cpu:0"]`` when it sees none."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{i}" for i in range(count)] or ["cpu:0"]


def parse_device_ids(value: str) -> list[str]:
    """The device ids of a ``--devices`` value: comma-separated ids, or ``auto``
    (:func:`visible_device_ids`). Ids are not checked here (:func:`torch_device` does)."""
    if value.strip() == AUTO:
        return visible_device_ids()
    return [d.strip() for d in value.split(",") if d.strip()]


def torch_device(device_id: str) -> torch.device:
    """The torch device of an executor device id: ``cpu:N`` -> cpu, ``cuda:N`` -> cuda:N.

    Raises ``ValueError`` for another kind or a CUDA device this process does not have.
    """
    match = _DEVICE_ID.match(device_id)
    if match is None:
        raise ValueError(f"unknown device id {device_id!r} (expected cpu:N or cuda:N)")
    kind, index = match.group(1), int(match.group(2) or 0)
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        raise ValueError(f"device {device_id!r} is not available in this process")
    return torch.device("cuda", index)

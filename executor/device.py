"""Executor device ids (``cpu:N``, ``cuda:N``) and the torch devices they name."""

from __future__ import annotations

import re

import torch

_DEVICE_ID = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


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

"""Workloads: readers for public traces (Azure, Mooncake, ServeGen) and seeded synthetic generators.

``readers`` does file I/O; ``client`` and ``synthetic`` are pure (the generators take an injected
``numpy.random.Generator``).
"""

from service.workload.client import ClientStats, LengthWindow, Pmf, RateWindow
from service.workload.readers import ReadResult, read_azure, read_mooncake, read_servegen_clients
from service.workload.synthetic import TenantLoad, servegen_workload, synthetic_workload

__all__ = [
    "ClientStats",
    "LengthWindow",
    "Pmf",
    "RateWindow",
    "ReadResult",
    "TenantLoad",
    "read_azure",
    "read_mooncake",
    "read_servegen_clients",
    "servegen_workload",
    "synthetic_workload",
]

"""``slicesched executor``: describe this node's devices, then run the daemon until a signal."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from executor.daemon import ExecutorDaemon
from executor.device import parse_device_ids, torch_device
from executor.settings import GUEST_WEIGHT, Settings
from service import environment as env
from service.domain.error import EXIT_BAD_INPUT, RegisterRefused


def describe_devices(device_ids: Sequence[str], mem_gib: float | None) -> list[dict[str, Any]]:
    """The registration entries of ``device_ids``: kind ``cpu`` or the CUDA device's name;
    ``mem_bytes`` from ``mem_gib`` if given, else the CUDA device's memory or, for CPU
    devices, the host's memory shared evenly between them. ``ValueError`` for an unknown,
    unavailable or repeated device."""
    if len(set(device_ids)) != len(device_ids):
        raise ValueError(f"devices repeat: {', '.join(device_ids)}")
    n_cpu = sum(torch_device(d).type == "cpu" for d in device_ids)
    entries = []
    for device_id in device_ids:
        device = torch_device(device_id)
        if device.type == "cuda":
            kind, mem = torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory
        else:
            kind, mem = "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // n_cpu
        entries.append({"device_id": device_id, "kind": kind,
                        "mem_bytes": int(mem_gib * 2**30) if mem_gib is not None else int(mem)})
    return entries


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slicesched executor",
                                description="Run leases from a slicesched service on this node's devices.")
    p.add_argument("--server", required=True, help="base URL of the service, e.g. http://127.0.0.1:8000; several, "
                                                 "comma-separated, for serve processes under leader election with no "
                                                 "one address in front of them (a refused or unreachable one: the next)")
    p.add_argument("--devices", required=True,
                   help="comma-separated device ids, e.g. cpu:0,cpu:1 or cuda:0; auto: every CUDA device this "
                        "process sees (cuda:0,...), else cpu:0")
    p.add_argument("--mem-gib", type=float, default=None, help="memory per device to register (default: detected)")
    p.add_argument("--key", default=None,
                   help="executor key: an executor pool's (POST /v1/executor-pools, 'slicesched keys create-pool') "
                        "or the service's $SLICESCHED_EXECUTOR_KEY (default: $SLICESCHED_EXECUTOR_KEY)")
    p.add_argument("--executor-id", default=None, help="default: <hostname>-<pid>")
    p.add_argument("--host-id", default=None, help="default: the hostname")
    p.add_argument("--max-batch", type=int, default=8, help="leases held at once (and KV slots per replica)")
    p.add_argument("--poll-wait-s", type=float, default=2.0, help="long-poll wait while idle")
    p.add_argument("--guest-weight", type=float, default=GUEST_WEIGHT,
                   help="a guest replica's claim on this executor's time against an owner's 1 (> 0): guests fill "
                        "the owners' idle time and take at most this weight's share while they are busy")
    p.add_argument("--stage-host", default="127.0.0.1",
                   help="address of this node's stage server (layers placed here by leases held on other nodes)")
    p.add_argument("--stage-port", type=int, default=0, help="its port (0: any free port; -1: no stage server)")
    p.add_argument("--progress-interval-s", type=float, default=0.01,
                   help="streaming leases: new tokens are posted at most this often (coalesced)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: one executor per core; more threads contend on small models)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``slicesched executor``: run the daemon until SIGTERM/SIGINT. Exit 2 on bad arguments
    or when the service refuses the registration."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per heartbeat and poll
    key = args.key or env.raw("SLICESCHED_EXECUTOR_KEY")
    if not key:
        print("error: no key: pass --key or set SLICESCHED_EXECUTOR_KEY (an executor pool's key; "
              "'slicesched keys create-pool POOL' makes one)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if (args.max_batch < 1 or args.poll_wait_s < 0 or args.threads < 1 or not 0 <= args.progress_interval_s <= 10
            or not args.guest_weight > 0):
        print("error: --max-batch and --threads must be >= 1, --poll-wait-s >= 0, --progress-interval-s "
              "in [0, 10] and --guest-weight > 0", file=sys.stderr)
        return EXIT_BAD_INPUT
    torch.set_num_threads(args.threads)
    try:
        devices = describe_devices(parse_device_ids(args.devices), args.mem_gib)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not devices:
        print("error: --devices names no device", file=sys.stderr)
        return EXIT_BAD_INPUT
    host = socket.gethostname()
    settings = Settings(server=args.server, key=key, executor_id=args.executor_id or f"{host}-{os.getpid()}",
                        host_id=args.host_id or host, devices=tuple(devices), max_batch=args.max_batch,
                        guest_weight=args.guest_weight,
                        poll_wait_s=args.poll_wait_s, progress_interval_s=args.progress_interval_s)
    stage_server = None
    if args.stage_port >= 0:
        from executor.remote import StageServer

        stage_server = StageServer(args.stage_host, args.stage_port).start()
        settings = replace(settings, stage_url=stage_server.url)
    daemon = ExecutorDaemon(settings)
    if stage_server is not None:  # sliced guests' layers sent here wait for this node's owners' iteration
        stage_server.gate = daemon.worker.compute_lock
    daemon.install_signal_handlers()
    try:
        return daemon.run()
    except RegisterRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        if stage_server is not None:
            stage_server.close()

"""The live stack as real processes on loopback: Neo4j, ``slicesched serve`` and executor daemons.

Used by the demo, the end-to-end tests and the live benchmarks, so they all run the system the
way a user does (separate processes, HTTP between them). :class:`LiveStack` is a context
manager: everything it started is stopped on exit, executors first (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from service.graph.connection import Neo4jSettings
from service.graph.local_server import LocalNeo4j


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveStack:
    """``neo4j=None`` starts a private Neo4j in a temporary state dir (a clean graph); else
    ``neo4j`` is a resolved :class:`Neo4jSettings` (URI and credentials) of a running server.
    Executors use a key of their own (``SLICESCHED_EXECUTOR_KEY`` of the server: the bootstrap
    executor pool), never the admin key."""

    def __init__(self, *, placement: str = "container", queue: str = "fifo", neo4j: Neo4jSettings | None = None,
                 admin_key: str = "admin-stack-key", executor_key: str = "executor-stack-key", lease_ttl_s: float = 5.0, heartbeat_s: float = 1.0,
                 max_batch: int = 8, log_dir: Path | None = None, extra_env: dict[str, str] | None = None) -> None:
        self.placement = placement
        self.queue = queue
        self.admin_key = admin_key
        self.executor_key = executor_key
        self.lease_ttl_s = lease_ttl_s
        self.heartbeat_s = heartbeat_s
        self.max_batch = max_batch
        self._tmp = tempfile.TemporaryDirectory(prefix="slicesched-stack-")
        self.log_dir = log_dir or Path(self._tmp.name)
        self._neo4j: LocalNeo4j | None = None
        self.neo4j = neo4j
        self.extra_env = dict(extra_env or {})
        self.server: subprocess.Popen[bytes] | None = None
        self.executors: dict[str, subprocess.Popen[bytes]] = {}
        self.port = 0

    # ---- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> LiveStack:
        try:
            if self.neo4j is None:
                self._neo4j = LocalNeo4j(Path(self._tmp.name) / "neo4j")
                uri = self._neo4j.start(log=False).uri
                user, password = self._neo4j.auth()
                self.neo4j = Neo4jSettings(uri=uri, user=user, password=password)
            self.start_server()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.close()

    def close(self) -> None:
        for name in list(self.executors):
            self.stop_executor(name)
        self.stop_server()
        if self._neo4j is not None:
            self._neo4j.stop()
            self._neo4j = None
        self._tmp.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        assert self.neo4j is not None
        return {**os.environ, **self.neo4j.env(), "SLICESCHED_ADMIN_KEY": self.admin_key,
                "SLICESCHED_EXECUTOR_KEY": self.executor_key, "SLICESCHED_STATE": str(Path(self._tmp.name) / "state"), "PYTHONUNBUFFERED": "1",
                **self.extra_env}

    # ---- the API server ----------------------------------------------------------------------
    def start_server(self, *, timeout_s: float = 60.0) -> None:
        self.port = self.port or free_port()
        log = open(self.log_dir / "serve.log", "ab")  # noqa: SIM115 - handed to the child process
        self.server = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port), "--placement", self.placement,
             "--queue", self.queue, "--lease-ttl-s", str(self.lease_ttl_s), "--heartbeat-s", str(self.heartbeat_s),
             "--max-batch", str(self.max_batch), "--log-level", "warning"],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"slicesched serve exited with {self.server.returncode}: see {self.log_dir / 'serve.log'}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"slicesched serve did not answer within {timeout_s:.0f}s")

    def stop_server(self, *, kill: bool = False) -> None:
        if self.server is not None:
            _stop(self.server, kill=kill)
            self.server = None

    def restart_server(self, *, kill: bool = False) -> None:
        self.stop_server(kill=kill)
        self.start_server()

    # ---- executors ---------------------------------------------------------------------------
    def start_executor(self, name: str, devices: Sequence[str], *, mem_gib: float = 2.0,
                       extra: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"executor-{name}.log", "ab")  # noqa: SIM115 - handed to the child process
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "executor", "--server", self.url, "--devices", ",".join(devices),
             "--mem-gib", str(mem_gib), "--executor-id", name, "--host-id", name, "--key", self.executor_key, *extra],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        self.executors[name] = proc
        return proc

    def stop_executor(self, name: str, *, kill: bool = False) -> int | None:
        proc = self.executors.pop(name, None)
        return _stop(proc, kill=kill) if proc is not None else None

    # ---- API helpers -------------------------------------------------------------------------
    def client(self, key: str | None = None, timeout_s: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key or self.admin_key}"},
                            timeout=timeout_s)

    def wait_devices(self, n: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        with self.client() as c:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                devices: list[dict[str, Any]] = c.get("/v1/devices").json()
                if len(devices) >= n:
                    return devices
                time.sleep(0.2)
        raise RuntimeError(f"fewer than {n} devices registered after {timeout_s:.0f}s: see {self.log_dir}")


def _stop(proc: subprocess.Popen[bytes], *, kill: bool, grace_s: float = 20.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)

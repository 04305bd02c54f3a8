"""The live stack as real processes on loopback: Neo4j, ``slicesched serve`` and executor daemons.

Used by the demo, the end-to-end tests and the live benchmarks, so they all run the system the
way a user does (separate processes, HTTP between them). :class:`LiveStack` is a context
manager: everything it started is stopped on exit, executors first (SIGTERM, then SIGKILL), and
on a SIGTERM to this process too (:func:`exit_on_sigterm`).
Each child runs in its own process group, and a stop signals the whole group.

``managed=True`` runs ``serve`` the way a user of the managed Neo4j does: ``SLICESCHED_STATE``
names the stack's state dir and ``SLICESCHED_NEO4J_URI`` is not set, so the service finds the
server through ``<state>/neo4j/server.json`` (which :meth:`LiveStack.start_neo4j` rewrites
when the server moves to another port).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from service.graph.connection import Neo4jSettings
from service.graph.local_server import LocalNeo4j


def _last_line(log: Path) -> str:
    """A failed child's error for the message: its log's last exception line (``...Error: why``),
    else its last line (the log itself goes with the stack's temporary folder), else where the
    log is."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return (errors or lines)[-1][-400:] if lines else f"see {log}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveStack:
    """``neo4j=None`` starts a private Neo4j in a temporary state dir (a clean graph); else
    ``neo4j`` is a resolved :class:`Neo4jSettings` (URI and credentials) of a running server.
    ``managed`` needs the stack's own. Executors use a key of their own
    (``SLICESCHED_EXECUTOR_KEY`` of the server: the bootstrap executor pool), never the admin key."""

    def __init__(self, *, placement: str = "container", queue: str = "fifo", neo4j: Neo4jSettings | None = None,
                 admin_key: str = "admin-stack-key", executor_key: str = "executor-stack-key", managed: bool = False,
                 lease_ttl_s: float = 5.0, heartbeat_s: float = 1.0, max_batch: int = 8,
                 log_dir: Path | None = None, extra_env: dict[str, str] | None = None,
                 leader_ttl_s: float | None = None) -> None:
        if managed and neo4j is not None:
            raise ValueError("managed=True runs the stack's own Neo4j: give no neo4j")
        self.placement = placement
        self.queue = queue
        self.admin_key = admin_key
        self.executor_key = executor_key
        self.managed = managed
        self.lease_ttl_s = lease_ttl_s
        self.heartbeat_s = heartbeat_s
        self.max_batch = max_batch
        self._tmp = tempfile.TemporaryDirectory(prefix="slicesched-stack-")
        self.log_dir = log_dir or Path(self._tmp.name)
        self.state_dir = Path(self._tmp.name) / "state"  # SLICESCHED_STATE of the children
        self._neo4j: LocalNeo4j | None = None
        self._sigterm: Any = None  # the SIGTERM handler to put back on close (None: none was replaced)
        self.neo4j = neo4j
        self.extra_env = dict(extra_env or {})
        self.server: subprocess.Popen[bytes] | None = None
        self.executors: dict[str, subprocess.Popen[bytes]] = {}
        self.port = 0
        self.server_started_at = 0.0  # epoch seconds of the last launch of serve
        self.console: subprocess.Popen[bytes] | None = None
        self.console_port = 0
        # leader election (service.live.leader): every serve of the stack runs for the leadership
        # with this term; start_standby adds a second one
        self.leader_ttl_s = leader_ttl_s
        self.standby: subprocess.Popen[bytes] | None = None
        self.standby_port = 0

    # ---- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> LiveStack:
        self._sigterm = exit_on_sigterm()
        try:
            if self.neo4j is None:
                self._neo4j = LocalNeo4j(self.state_dir / "neo4j")
                self.start_neo4j()
            self.start_server(ready=self.leader_ttl_s is not None)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.close()

    def close(self) -> None:
        if self.console is not None:
            _stop(self.console, kill=False)
            self.console = None
        for name in list(self.executors):
            self.stop_executor(name)
        self.stop_server()
        if self.standby is not None:
            _stop(self.standby, kill=False)
            self.standby = None
        if self._neo4j is not None:
            self._neo4j.stop()
            self._neo4j = None
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        self._tmp.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def urls(self) -> str:
        """Every serve's address, comma-separated, the first one's first (an executor's ``--server``)."""
        ports = [p for p in (self.port, self.standby_port) if p]
        return ",".join(f"http://127.0.0.1:{p}" for p in ports)

    def env(self) -> dict[str, str]:
        assert self.neo4j is not None
        env = {**os.environ, "SLICESCHED_ADMIN_KEY": self.admin_key, "SLICESCHED_EXECUTOR_KEY": self.executor_key,
               "SLICESCHED_STATE": str(self.state_dir), "PYTHONUNBUFFERED": "1"}
        for name in ("SLICESCHED_NEO4J_URI", "SLICESCHED_NEO4J_USER", "SLICESCHED_NEO4J_PASSWORD"):
            env.pop(name, None)
        if not self.managed:  # managed: the service finds the server (and its password) in <state>/neo4j
            env |= self.neo4j.env()
        return {**env, **self.extra_env}

    @property
    def neo4j_uri(self) -> str | None:
        return self.neo4j.uri if self.neo4j is not None else None

    # ---- the stack's own Neo4j ---------------------------------------------------------------
    @property
    def local_neo4j(self) -> LocalNeo4j:
        if self._neo4j is None:
            raise RuntimeError("this stack runs on a Neo4j it did not start")
        return self._neo4j

    def start_neo4j(self, *, port: int | None = None, timeout_s: float = 120.0) -> str:
        """Start the stack's own Neo4j (``port=None``: any free port); returns its Bolt URI."""
        server = self.local_neo4j
        uri = server.start(port=port, timeout_s=timeout_s, log=False).uri
        user, password = server.auth()
        self.neo4j = Neo4jSettings(uri=uri, user=user, password=password, state_dir=server.state_dir)
        return uri

    def stop_neo4j(self) -> None:
        """A clean stop, as ``slicesched neo4j stop`` does; the data stays for the next start."""
        self.local_neo4j.stop()

    # ---- the API server ----------------------------------------------------------------------
    def _serve(self, port: int, log_name: str) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / log_name, "ab")  # noqa: SIM115 - handed to the child process
        election = [] if self.leader_ttl_s is None else ["--leader-election", "--leader-ttl-s", str(self.leader_ttl_s)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli.main", "serve", "--port", str(port), "--placement", self.placement,
             "--queue", self.queue, "--lease-ttl-s", str(self.lease_ttl_s), "--heartbeat-s", str(self.heartbeat_s),
             "--max-batch", str(self.max_batch), "--log-level", "warning", *election],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return proc

    def _wait_answers(self, proc: subprocess.Popen[bytes], port: int, log_name: str, timeout_s: float,
                      probe: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"slicesched serve exited with {proc.returncode}: "
                                   f"{_last_line(self.log_dir / log_name)}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}{probe}", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        _stop(proc, kill=True)
        raise RuntimeError(f"slicesched serve did not answer within {timeout_s:.0f}s: see {self.log_dir / log_name}")

    def start_server(self, *, timeout_s: float = 60.0, ready: bool = False) -> None:
        """Start serve and wait until it answers (``ready``: until it is ready, which under
        leader election means it leads)."""
        self.port = self.port or free_port()
        self.server_started_at = time.time()
        self.server = self._serve(self.port, "serve.log")
        self._wait_answers(self.server, self.port, "serve.log", timeout_s, "/readyz" if ready else "/healthz")

    def start_standby(self, *, timeout_s: float = 60.0) -> None:
        """A second serve on the same database under leader election (the stack's ``leader_ttl_s``),
        once it answers as the standby."""
        if self.leader_ttl_s is None:
            raise RuntimeError("a standby needs leader election: give the stack a leader_ttl_s")
        self.standby_port = self.standby_port or free_port()
        self.standby = self._serve(self.standby_port, "serve-standby.log")
        self._wait_answers(self.standby, self.standby_port, "serve-standby.log", timeout_s, "/healthz")

    def follow_leader(self) -> bool:
        """Under leader election: when the standby is the one ready (it took over), swap the two,
        so that :attr:`url` is the leader's. Whether it swapped."""
        if self.standby is None or self.standby.poll() is not None:
            return False
        try:
            if httpx.get(f"http://127.0.0.1:{self.standby_port}/readyz", timeout=1.0).status_code != 200:
                return False
        except httpx.HTTPError:
            return False
        self.server, self.standby = self.standby, self.server
        self.port, self.standby_port = self.standby_port, self.port
        self.server_started_at = time.time()  # it recovered as a restarted serve does
        return True

    def promote_standby(self) -> None:
        """After the leader's end: the standby is the stack's server from now on (its address first)."""
        if self.standby is None:
            raise RuntimeError("no standby")
        self.server, self.port = self.standby, self.standby_port
        self.standby, self.standby_port = None, 0
        self.server_started_at = time.time()  # it recovers as a restarted serve does

    def stop_server(self, *, kill: bool = False) -> None:
        if self.server is not None:
            _stop(self.server, kill=kill)
            self.server = None

    def restart_server(self, *, kill: bool = False) -> None:
        self.stop_server(kill=kill)
        self.start_server()

    # ---- the web console ----------------------------------------------------------------------
    @property
    def console_url(self) -> str:
        return f"http://127.0.0.1:{self.console_port}"

    def start_console(self, *, timeout_s: float = 60.0) -> str:
        """``slicesched console`` for this stack's API on a free port; returns its URL."""
        self.console_port = self.console_port or free_port()
        log = open(self.log_dir / "console.log", "ab")  # noqa: SIM115 - handed to the child process
        self.console = subprocess.Popen(
            [sys.executable, "-m", "service.cli.main", "console", "--api", self.url, "--port", str(self.console_port),
             "--log-level", "warning"], env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.console.poll() is not None:
                raise RuntimeError(f"slicesched console exited with {self.console.returncode}: see "
                                   f"{self.log_dir / 'console.log'}")
            try:
                if httpx.get(f"{self.console_url}/healthz", timeout=1.0).status_code == 200:
                    return self.console_url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"slicesched console did not answer within {timeout_s:.0f}s: see {self.log_dir / 'console.log'}")

    # ---- executors ---------------------------------------------------------------------------
    def start_executor(self, name: str, devices: Sequence[str], *, mem_gib: float = 2.0,
                       extra: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"executor-{name}.log", "ab")  # noqa: SIM115 - handed to the child process
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli.main", "executor", "--server", self.urls, "--devices", ",".join(devices),
             "--mem-gib", str(mem_gib), "--executor-id", name, "--host-id", name,
             "--key", self.executor_key, *extra],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
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
    """Stop a child started in its own session: its whole process group, SIGKILL after ``grace_s``."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    return int(proc.returncode)


def exit_on_sigterm() -> Any:
    """In the main thread, while SIGTERM has its default action: make it raise ``SystemExit(143)``
    instead, so that ``with LiveStack(...)`` unwinds and stops what it started (the default ends
    the process at once, and its Neo4j, service and executors ran on: measured after a ``kill``
    of ``benchmarks/live_e2e.py``). Returns the handler to put back, ``None`` when none was
    replaced."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    return signal.SIG_DFL


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        if proc.poll() is None:
            proc.send_signal(sig)

"""The managed local Neo4j: the real Neo4j 5.26 LTS Community server, without Docker.

Jars are resolved once per machine from Maven Central into ``<cache>/neo4j/<version>/lib`` with
the system Maven. Each server instance lives in a *state dir* holding ``conf/neo4j.conf``,
``data/``, ``logs/`` and ``server.json`` (pid, port, version), so the CLI, the demo and each test
session can run their own server side by side. The server is the stock
``org.neo4j.server.CommunityEntryPoint`` on Java 17; Bolt listens on 127.0.0.1 only and
authentication is on: the ``neo4j`` user's password is ``SLICESCHED_NEO4J_PASSWORD`` if set,
else generated on the first start, and kept in ``<state dir>/password`` (mode 0600; the state
dir itself is 0700, since the store files hold prompts and key hashes).

The initial password is set the way ``neo4j-admin dbms set-initial-password`` sets it: before
the first start, ``data/dbms/auth.ini`` holds the user's salted, iterated SHA-256 credential,
which the server reads once when it creates its system database (no JVM round trip, the
password never on a command line). A state dir from before auth was on (data, no password
file) is migrated on its next start: the default ``neo4j``/``neo4j`` user changes its password
to the new one with ``ALTER CURRENT USER``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from service import environment as env
from service.domain.error import Neo4jServerError

NEO4J_VERSION = "5.26.30"
JVM_FLAGS = [
    "-XX:+UseG1GC", "-XX:-OmitStackTraceInFastThrow", "-XX:+UnlockExperimentalVMOptions",
    "-XX:+TrustFinalNonStaticFields", "-XX:+DisableExplicitGC", "-Djdk.nio.maxCachedBufferSize=1024",
    "-Dio.netty.tryReflectionSetAccessible=true", "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED", "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--enable-native-access=ALL-UNNAMED", "-Dlog4j2.disable.jmx=true", "-Dfile.encoding=UTF-8",
]


NEO4J_USER = "neo4j"  # the managed server's only user (Community edition)
_DEFAULT_PASSWORD = "neo4j"  # a store created without an initial password has this one, change required
_HASH_ITERATIONS = 1024  # Neo4j's credential: SHA-256 of salt + password, then re-hashed, 1024 rounds


def cache_dir() -> Path:
    return env.path("SLICESCHED_CACHE") or Path.home() / ".cache" / "slicesched"


def default_state_dir() -> Path:
    return (env.path("SLICESCHED_STATE") or Path.home() / ".local" / "state" / "slicesched") / "neo4j"


@dataclass(frozen=True)
class ServerInfo:
    pid: int
    port: int
    version: str
    state_dir: str
    started_at: float

    @property
    def uri(self) -> str:
        return f"bolt://127.0.0.1:{self.port}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child (started by this process, not yet reaped) counts as dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


class LocalNeo4j:
    """Install, start, stop and query the status of one managed server instance."""

    def __init__(self, state_dir: Path | None = None, *, version: str = NEO4J_VERSION,
                 heap: str = "768m", pagecache: str = "256m") -> None:
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.version = version
        self.heap = heap
        self.pagecache = pagecache
        self.home = cache_dir() / "neo4j" / version

    # ---- installation ------------------------------------------------------------------------
    @property
    def lib_dir(self) -> Path:
        return self.home / "lib"

    def installed(self) -> bool:
        return (self.home / ".complete").exists()

    def install(self, *, log: bool = True) -> Path:
        """Resolve the server jars from Maven Central once; later calls return at once. Processes
        installing at the same time (the test workers on a fresh machine) take turns under a file
        lock: the first resolves, the others find it complete."""
        if self.installed():
            return self.lib_dir
        if shutil.which("mvn") is None:
            raise Neo4jServerError("Maven ('mvn') is needed once to fetch the Neo4j jars; install Maven 3.8+")
        if shutil.which("java") is None:
            raise Neo4jServerError("Java 17 ('java') is needed to run the local Neo4j server")
        self.home.mkdir(parents=True, exist_ok=True)
        with (self.home / ".install.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.installed():
                self._resolve(log=log)
        return self.lib_dir

    def _resolve(self, *, log: bool) -> None:
        work = self.home / "resolve"
        work.mkdir(parents=True, exist_ok=True)
        template = (resources.files("service.graph") / "neo4j-pom.xml").read_text()
        (work / "pom.xml").write_text(template.replace("@NEO4J_VERSION@", self.version))
        tmp_lib = self.home / "lib.partial"
        shutil.rmtree(tmp_lib, ignore_errors=True)
        if log:
            print(f"[neo4j] resolving Neo4j {self.version} jars from Maven Central (once per machine)...", flush=True)
        proc = subprocess.run(
            ["mvn", "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
             "-DincludeScope=runtime", f"-DoutputDirectory={tmp_lib}"],
            capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise Neo4jServerError(f"mvn could not resolve Neo4j {self.version}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        shutil.rmtree(self.lib_dir, ignore_errors=True)
        tmp_lib.rename(self.lib_dir)
        (self.home / "plugins").mkdir(exist_ok=True)
        (self.home / ".complete").write_text(self.version)

    # ---- lifecycle -------------------------------------------------------------------------------
    @property
    def _info_path(self) -> Path:
        return self.state_dir / "server.json"

    @property
    def password_path(self) -> Path:
        return self.state_dir / "password"

    def auth(self) -> tuple[str, str]:
        """``(user, password)`` of this server: ``SLICESCHED_NEO4J_PASSWORD`` if set, else the
        stored one. :class:`Neo4jServerError` if neither exists (the server never started here)."""
        given = env.raw("SLICESCHED_NEO4J_PASSWORD")
        if given:
            return NEO4J_USER, given
        try:
            return NEO4J_USER, self.password_path.read_text().strip()
        except FileNotFoundError:
            raise Neo4jServerError(f"no password for the managed Neo4j in {self.state_dir}: start it first "
                                   "('slicesched neo4j start') or set SLICESCHED_NEO4J_PASSWORD") from None

    def _ensure_password(self) -> str:
        """The password, created on the first start: the environment's, else a new random one;
        written to ``password`` with mode 0600 (created so, never widened)."""
        password = env.raw("SLICESCHED_NEO4J_PASSWORD") or ""
        if not password and self.password_path.exists():
            return self.password_path.read_text().strip()
        password = password or secrets.token_urlsafe(24)
        if len(password) < 8:
            raise Neo4jServerError("SLICESCHED_NEO4J_PASSWORD must have at least 8 characters (Neo4j's minimum)")
        if not self.password_path.exists():
            _write_private(self.password_path, password + "\n")
        return password

    def _write_initial_credential(self, password: str) -> None:
        """What ``neo4j-admin dbms set-initial-password`` writes: read by the server when it
        creates its system database, i.e. on the first start only."""
        salt = secrets.token_bytes(32)
        digest = hashlib.sha256(salt + password.encode()).digest()
        for _ in range(_HASH_ITERATIONS - 1):
            digest = hashlib.sha256(digest).digest()
        dbms = self.state_dir / "data" / "dbms"
        dbms.mkdir(parents=True, exist_ok=True)
        auth_ini = dbms / "auth.ini"
        auth_ini.unlink(missing_ok=True)
        _write_private(auth_ini, f"{NEO4J_USER}:SHA-256,{digest.hex()},{salt.hex()},{_HASH_ITERATIONS}:\n")

    def _store_exists(self) -> bool:
        return (self.state_dir / "data" / "databases" / "system").exists()

    def status(self) -> ServerInfo | None:
        """The running server of this state dir, or ``None`` (a stale record is removed)."""
        try:
            info = ServerInfo(**json.loads(self._info_path.read_text()))
        except (OSError, ValueError, TypeError):
            return None
        if _alive(info.pid):
            return info
        self._info_path.unlink(missing_ok=True)
        return None

    def _write_conf(self, port: int) -> Path:
        conf_dir = self.state_dir / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        for sub in ("data", "logs", "run", "import"):
            (self.state_dir / sub).mkdir(exist_ok=True)
        s = self.state_dir
        (conf_dir / "neo4j.conf").write_text("\n".join([
            "server.default_listen_address=127.0.0.1",
            "server.bolt.enabled=true",
            f"server.bolt.listen_address=127.0.0.1:{port}",
            "server.http.enabled=false",
            "server.https.enabled=false",
            "dbms.security.auth_enabled=true",
            "dbms.usage_report.enabled=false",
            f"server.memory.pagecache.size={self.pagecache}",
            "server.memory.off_heap.max_size=256m",
            "db.transaction.timeout=120s",
            "db.shutdown_transaction_end_timeout=1s",
            # Netty waits a 5 s quiet period per Bolt connector on shutdown by default.
            "internal.dbms.bolt.netty_server_shutdown_quiet_period=0",
            "internal.dbms.bolt.netty_server_shutdown_timeout=2",
            "server.threads.worker_count=8",
            f"server.directories.data={s / 'data'}",
            f"server.directories.logs={s / 'logs'}",
            f"server.directories.run={s / 'run'}",
            f"server.directories.import={s / 'import'}",
            f"server.directories.plugins={self.home / 'plugins'}",
            "",
        ]))
        return conf_dir

    def start(self, *, port: int | None = None, timeout_s: float = 120.0, log: bool = True) -> ServerInfo:
        """Start (or find running) the server and wait until Bolt answers. Idempotent."""
        running = self.status()
        if running is not None:
            return running
        if port is not None and _port_open(port):
            raise Neo4jServerError(f"port {port} on 127.0.0.1 is in use by another process: choose another --port")
        self.install(log=log)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)  # the store holds prompts and key hashes
        had_password = self.password_path.exists() or env.raw("SLICESCHED_NEO4J_PASSWORD") is not None
        fresh = not self._store_exists()
        password = self._ensure_password()
        if fresh:
            self._write_initial_credential(password)
        migrate = not fresh and not had_password  # a store from before auth: still neo4j/neo4j
        port = port or free_port()
        conf_dir = self._write_conf(port)
        console = open(self.state_dir / "logs" / "console.log", "ab")  # noqa: SIM115 - handed to the child
        cmd = [
            "java", "-Xms256m", f"-Xmx{self.heap}", *JVM_FLAGS,
            "-cp", f"{self.home / 'plugins'}/*:{self.lib_dir}/*",
            "org.neo4j.server.CommunityEntryPoint",
            f"--home-dir={self.home}", f"--config-dir={conf_dir}", "--console-mode",
        ]
        if log:
            print(f"[neo4j] starting Neo4j {self.version} on bolt://127.0.0.1:{port} (state {self.state_dir})", flush=True)
        started = time.time()
        proc = subprocess.Popen(cmd, stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        console.close()
        info = ServerInfo(pid=proc.pid, port=port, version=self.version, state_dir=str(self.state_dir),
                          started_at=started)
        self._info_path.write_text(json.dumps(asdict(info)))
        try:
            self._wait_ready(info, proc, timeout_s, password, migrate=migrate)
        except BaseException:
            self.stop()
            raise
        return info

    def _wait_ready(self, info: ServerInfo, proc: subprocess.Popen[bytes], timeout_s: float, password: str, *,
                    migrate: bool = False) -> None:
        from neo4j import GraphDatabase
        from neo4j.exceptions import AuthError, ServiceUnavailable

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = (self.state_dir / "logs" / "console.log").read_text(errors="replace")[-3000:]
                raise Neo4jServerError(f"Neo4j exited with code {proc.returncode} while starting:\n{tail}")
            if _port_open(info.port):
                try:
                    if migrate:
                        self._migrate_default_password(info, password)
                        migrate = False
                    with GraphDatabase.driver(info.uri, auth=(NEO4J_USER, password)) as driver:
                        driver.verify_connectivity()
                    return
                except AuthError as exc:  # never retried: Neo4j locks the user after a few failures
                    raise Neo4jServerError(
                        f"the managed Neo4j in {self.state_dir} refused its password ({exc.message}): set "
                        f"SLICESCHED_NEO4J_PASSWORD to the store's password, or delete {self.state_dir / 'data'} "
                        "to start from an empty graph") from None
                except (ServiceUnavailable, OSError):
                    pass
            time.sleep(0.25)
        raise Neo4jServerError(f"Neo4j did not answer on {info.uri} within {timeout_s:.0f}s "
                               f"(see {self.state_dir / 'logs' / 'console.log'})")

    @staticmethod
    def _migrate_default_password(info: ServerInfo, password: str) -> None:
        """A store created while auth was off still has ``neo4j``/``neo4j`` (change required):
        set the generated password (the only statement such a user may run)."""
        from neo4j import GraphDatabase

        with GraphDatabase.driver(info.uri, auth=(NEO4J_USER, _DEFAULT_PASSWORD)) as driver, \
                driver.session(database="system") as session:
            session.run("ALTER CURRENT USER SET PASSWORD FROM $old TO $new",
                        old=_DEFAULT_PASSWORD, new=password).consume()

    def stop(self, *, timeout_s: float = 60.0) -> bool:
        """Shut the server down cleanly (SIGTERM, then SIGKILL after ``timeout_s``)."""
        try:
            info = ServerInfo(**json.loads(self._info_path.read_text()))
        except (OSError, ValueError, TypeError):
            return False
        stopped = False
        if _alive(info.pid):
            os.kill(info.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while _alive(info.pid) and time.monotonic() < deadline:
                _reap(info.pid)
                time.sleep(0.1)
            if _alive(info.pid):
                os.kill(info.pid, signal.SIGKILL)
            _reap(info.pid)
            stopped = True
        self._info_path.unlink(missing_ok=True)
        return stopped

    def server_version(self, info: ServerInfo) -> str:
        from neo4j import GraphDatabase

        with GraphDatabase.driver(info.uri, auth=self.auth()) as driver:
            return str(driver.get_server_info().agent)


def _write_private(path: Path, text: str) -> None:
    """Create ``path`` readable by its owner only (mode 0600 from the start, no window)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)

"""The live service's Neo4j gate: every call bounded and failing fast while Neo4j is down, and
the driver following the managed server when it moves."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from service.domain.error import DatabaseUnavailableError, Neo4jServerError
from service.graph.catalog import QueryCatalog
from service.graph.connection import Neo4jSettings, open_driver
from service.graph.repository import GraphRepository
from service.live import threads
from service.live.call_health import CallHealth
from service.live.settings import ServiceSettings

log = logging.getLogger("slicesched.service")


def retrieve(task: asyncio.Future[Any]) -> None:
    """A call whose caller stopped waiting (503 past its bound) may still fail later: its error
    is logged here, not left to asyncio's 'exception was never retrieved'."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("a Neo4j call failed after its caller was answered: %r", task.exception())


class CallAbandoned(Exception):
    """A call whose caller gave up before a worker thread took it: it never ran."""


class _Call:
    """A repository call that runs at most once, and not at all when its caller gave up while
    it still waited for a worker thread. Why: the worker threads are few (asyncio's default
    pool: 6 on two cores), and after a Neo4j outage clients retry; had every abandoned call run
    anyway, each retry would queue behind the work of the callers already answered 503, and a
    cold, slow Neo4j could keep the queue growing for minutes (the chaos run's slow recovery)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self._lock = threading.Lock()
        self.state = "queued"  # queued -> started | abandoned

    def __call__(self) -> Any:
        with self._lock:
            if self.state == "abandoned":
                raise CallAbandoned(f"{getattr(self.fn, '__name__', 'a call')} was abandoned before it started")
            self.state = "started"
        return self.fn(*self.args, **self.kwargs)

    def abandon(self) -> bool:
        """Give up on the call; True when it will never run (it had not started)."""
        with self._lock:
            if self.state == "queued":
                self.state = "abandoned"
            return self.state == "abandoned"


# the call behind each future :meth:`Neo4jGate.in_thread` returned (gone with the future)
_CALLS: weakref.WeakKeyDictionary[asyncio.Future[Any], _Call] = weakref.WeakKeyDictionary()


def abandon(task: asyncio.Future[Any]) -> bool:
    """The caller of ``task`` (from :meth:`Neo4jGate.in_thread`) stops waiting: True when its
    call had not started and now never will (nothing was written)."""
    call = _CALLS.get(task)
    return call is not None and call.abandon()


def neo4j_down(exc: BaseException) -> bool:
    from neo4j.exceptions import ServiceUnavailable, SessionExpired

    return isinstance(exc, ServiceUnavailable | SessionExpired | ConnectionError | TimeoutError)


RETRY_DELAY_S = 0.02  # a transient error's first retry (then doubling, with jitter)


class Neo4jGate:
    """The live service's way to Neo4j: the driver (following the managed server when it
    moves), the repository, whether Neo4j answers, and every call bounded and failing fast
    while it does not. One object, passed to the parts of
    :class:`~service.live.service.LiveService` that write or read the GMG."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings  # its db_timeout_s, call_timeout_s and neo4j
        self.driver: Any = None
        self.neo4j_uri: str | None = None
        self.previous_neo4j_uri: str | None = None
        self.repo: GraphRepository | None = None  # at open
        self.db_up = False
        self.db_error: str | None = None
        self.calls = CallHealth()  # submissions' and completions' writes: failing ones make the service not ready
        self._reopening: asyncio.Future[None] | None = None  # the steps before traffic is taken again, across ticks
        self._reopen_since = 0.0  # monotonic start of the reopening in progress
        self._reopen_said = 0.0  # when the last "still reopening" line was logged
        # the watcher's calls (ping, follow, the steps before traffic) on threads of their own: on
        # the shared pool they waited behind calls waiting out the outage, and the gate opened
        # seconds after Neo4j answered again (the chaos-slice run)
        self._watch_pool = ThreadPoolExecutor(2, thread_name_prefix="neo4j-watch")
        self._retired: list[tuple[float, Any]] = []  # (monotonic time, driver) replaced after an outage, closed later
        self._closing = False  # a close of retired drivers is running

    def open(self) -> GraphRepository:
        """Connect (starting the managed server if it is not running) and open the repository."""
        self.driver = self.open_driver(True)
        self.repo = GraphRepository(self.driver, QueryCatalog.load(), database=self.settings.neo4j.database)
        self.db_up = True
        return self.repo

    def answered(self) -> None:
        """Neo4j answers again (the watcher): calls go through."""
        self.db_up, self.db_error = True, None

    def down(self) -> None:
        """Neo4j does not answer a ping (the watcher): calls fail fast."""
        self.db_up = False

    def open_driver(self, start: bool, resolved: Neo4jSettings | None = None) -> Any:
        """A verified driver to the configured server (the managed one: wherever its state says
        it runs now, with its credentials), with timeouts that fail a call within about
        ``db_timeout_s`` when it is down. :attr:`neo4j_uri` changes only once it answers."""
        t = self.settings.db_timeout_s
        resolved = resolved or self.settings.neo4j.resolved(start=start)
        # A deadlock between two of the service's transactions (both create relationships on a
        # dense Device or Model node) is over when the other commits, in milliseconds: retry after
        # 20 ms (doubling), not the driver's default 1 s, which had put a second on the p99 of
        # every completion in a group commit (benchmarks/fleet.py).
        driver = open_driver(resolved, connection_timeout=t, connection_acquisition_timeout=t,
                             max_transaction_retry_time=t, initial_retry_delay=RETRY_DELAY_S)
        self.previous_neo4j_uri, self.neo4j_uri = self.neo4j_uri, resolved.uri
        return driver

    async def db(self, fn: Any, *args: Any, bound_s: float | None = -1.0, read: bool = False,
                 done: Callable[[], None] | None = None, **kwargs: Any) -> Any:
        """Run a repository call in a worker thread, failing fast when Neo4j is down: a
        :class:`DatabaseUnavailableError` (503 with ``Retry-After``) at once when the watcher
        knows it is down, within ``db_timeout_s`` when it cannot be reached, or when the call
        does not end within ``bound_s`` (default ``call_timeout_s``; None: no bound, for long
        work such as tracing a model). ``read``: the call changes nothing (its 503 says so, and
        not to retry with an Idempotency-Key); ``done``: called once, on the event loop, when the
        call's thread has ended (at once when it never starts), not when its caller stops waiting."""
        try:
            self.check()
        except BaseException:
            if done is not None:
                done()
            raise
        task = self.in_thread(fn, *args, **kwargs)
        task.add_done_callback(retrieve)
        if done is not None:
            task.add_done_callback(lambda _: done())
        return await self.bounded(task, self.settings.call_timeout_s if bound_s == -1.0 else bound_s, read,
                                   request_path=False)

    def in_thread(self, fn: Any, *args: Any, executor: Executor | None = None, **kwargs: Any) -> asyncio.Future[Any]:
        """``fn`` in a worker thread the stop waits for (:mod:`service.live.threads`; ``executor``:
        a pool other than the shared one); a caller that gives up before a thread takes it calls
        :func:`abandon`, and it never runs (it raises :class:`CallAbandoned` instead)."""
        call = _Call(fn, args, kwargs)
        task = threads.run(call, executor=executor)
        _CALLS[task] = call
        return task

    async def threads_done(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for the worker threads still running."""
        await threads.drain(timeout_s)

    def check(self) -> None:
        if not self.db_up:
            raise DatabaseUnavailableError(f"Neo4j is unreachable ({self.db_error or 'reconnecting'})",
                                           retry_after_s=self.settings.db_timeout_s)

    async def bounded(self, task: asyncio.Future[Any], bound_s: float | None, read: bool = False, *,
                       request_path: bool = True) -> Any:
        """Await ``task`` for at most ``bound_s``; past that the caller gets a 503 while the
        task runs on (its outcome is unknown to the caller, unless it is a ``read``).
        ``request_path``: a submission's or completion's write (its outcome is :attr:`calls`)."""
        track = request_path and not read
        try:
            result = await asyncio.wait_for(asyncio.shield(task), bound_s)
        except TimeoutError:
            if track:
                self.calls.failed(f"a submission or completion found no answer within {bound_s:g} s")
            if abandon(task):
                log.warning("a Neo4j call waited %.1f s for a worker thread; not run, answered 503", bound_s)
                raise DatabaseUnavailableError("the service is busy: the call was not started (nothing was written); "
                                               "retry", retry_after_s=self.settings.db_timeout_s) from None
            log.warning("a Neo4j call took longer than %.1f s; answered 503", bound_s)
            if read:
                raise DatabaseUnavailableError(f"Neo4j did not answer this read within {bound_s:g} s (it changes "
                                               "nothing); retry later", retry_after_s=self.settings.db_timeout_s) from None
            raise DatabaseUnavailableError("Neo4j did not answer in time; the outcome is unknown (retry with the "
                                           "same Idempotency-Key)", retry_after_s=self.settings.db_timeout_s) from None
        except Exception as exc:
            if neo4j_down(exc):  # not ready already (Neo4j down), not counted here
                self.failed(f"{type(exc).__name__}: {exc}")
                raise DatabaseUnavailableError(f"Neo4j is unreachable: {type(exc).__name__}",
                                               retry_after_s=self.settings.db_timeout_s) from None
            if track:
                self.calls.succeeded()  # Neo4j answered (the call's own error is the caller's)
            raise
        if track:
            self.calls.succeeded()
        return result

    def failed(self, why: str) -> None:
        if self.db_up:
            log.warning("Neo4j unreachable (%s): failing fast until it answers again", why)
        self.db_up, self.db_error = False, why[:300]

    async def watch_call(self, fn: Any, bound_s: float | None = None) -> Any:
        bound = bound_s or 3 * self.settings.db_timeout_s + 2.0
        task = self.in_thread(fn, executor=self._watch_pool)
        task.add_done_callback(retrieve)  # an abandoned or late call's error: logged, not 'never retrieved'
        try:
            return await asyncio.wait_for(task, bound)
        except TimeoutError:
            abandon(task)
            raise DatabaseUnavailableError(f"the Neo4j watcher's {fn.__name__} took longer than {bound:.0f} s") from None

    async def reachable(self) -> bool:
        """Whether Neo4j answers a ping; when it does not and it is the managed server, find
        where it runs now (a restart may have moved it to another port), reconnect and ask again."""
        if self._retired and not self._closing:  # off the watcher's path: a close may block on dead sockets
            self._closing = True
            closing = self.in_thread(self.close_retired)
            closing.add_done_callback(retrieve)
            closing.add_done_callback(lambda _: setattr(self, "_closing", False))
        ok = bool(await self.watch_call(self.ping))
        if not ok and self.settings.neo4j.managed:
            await self.watch_call(self.follow_managed)
            ok = bool(await self.watch_call(self.ping))
        return ok

    async def reopened(self, steps: Callable[[], Any], wait_s: float = 1.0) -> bool:
        """Run ``steps`` (what must be done before traffic is taken again: a coroutine function)
        once, as one task that outlives the watcher's ticks; True once it has succeeded. Each
        tick waits for it at most ``wait_s`` and returns (the tick is not failed, so the watcher
        neither backs off nor starts the steps again while they run). A failure is raised to
        the tick that sees it, and the next tick starts the steps afresh.

        Why one task: the steps' first calls after a restart meet a cold Neo4j (on two loaded
        cores, measured: 11 s for the first ``RETURN 1``, 3-10 s to plan each write
        statement), longer than any per-tick bound; bounded per tick, they failed and were
        started again every tick, each attempt adding a thread to the ones still running, and
        the gate stayed shut for minutes."""
        now = time.monotonic()
        if self._reopening is None:
            self._reopening = asyncio.ensure_future(steps())
            self._reopen_since = self._reopen_said = now
        task = self._reopening
        await asyncio.wait({task}, timeout=wait_s)
        if not task.done():
            if now - self._reopen_said >= 10.0:
                self._reopen_said = now
                log.warning("Neo4j answers; getting ready to take traffic again (%.0f s so far)",
                            now - self._reopen_since)
            return False
        self._reopening = None
        task.result()  # a failure fails this tick; the next one starts again
        return True

    async def stop_reopening(self) -> None:
        """Cancel the steps before traffic if they are running (the service stops); the watcher's
        threads end once their calls do (the stop waits for those, :func:`threads.drain`)."""
        task, self._reopening = self._reopening, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        self._watch_pool.shutdown(wait=False)

    def renew_driver(self) -> None:
        """A new driver (a new connection pool) to the server that answers again. Why: the old
        pool's connections died with the server, and each call that drew one failed
        (``SessionExpired: Failed to read from defunct connection``, some only at a read
        deadline), closing the gate again after it opened. The old driver is closed a minute
        later (:meth:`close_retired`), once calls still holding its connections have ended."""
        resolved = self.settings.neo4j.resolved(start=False) if self.settings.neo4j.managed else None
        driver = self.open_driver(False, resolved)
        old, self.driver = self.driver, driver
        if self.repo is not None:
            self.repo.driver = driver
        self._retired = [*self._retired, (time.monotonic(), old)]

    def close_retired(self, *, older_than_s: float = 60.0) -> None:
        """Close the drivers replaced at least ``older_than_s`` ago (0: all, at stop)."""
        now = time.monotonic()
        due = [d for at, d in self._retired if now - at >= older_than_s]
        self._retired = [(at, d) for at, d in self._retired if now - at < older_than_s]
        for old in due:
            try:
                old.close()
            except Exception:  # its server is gone; its sockets may already be closed
                log.debug("closing a retired driver failed", exc_info=True)

    def warm_intake(self) -> None:
        """Plan the statement a submission runs (an empty batch writes nothing) and pay a cold
        server's first query, before the gate opens."""
        assert self.repo is not None
        self.repo.live.create_requests([])

    def ping(self) -> bool:
        try:
            self.driver.verify_connectivity()
            return True
        except Exception as exc:
            self.db_error = f"{type(exc).__name__}: {exc}"[:300]
            return False

    def follow_managed(self) -> None:
        try:
            resolved = self.settings.neo4j.resolved(start=False)
        except Neo4jServerError:  # not running (yet)
            return
        if resolved.uri == self.neo4j_uri:
            return
        try:
            driver = self.open_driver(False, resolved)
        except Exception as exc:
            if not neo4j_down(exc):
                raise
            self.db_error = f"the managed Neo4j moved to {resolved.uri} and does not answer there yet"
            return  # still starting: the next tick tries again
        log.warning("the managed Neo4j now runs at %s (was %s): reconnected", resolved.uri, self.previous_neo4j_uri)
        old, self.driver = self.driver, driver
        assert self.repo is not None
        self.repo.driver = self.driver
        try:
            old.close()
        except Exception:  # the old server is gone; its sockets may already be closed
            log.debug("closing the old driver failed", exc_info=True)


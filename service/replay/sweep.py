"""Load sweeps: where their cells run (a local process pool or Ray) and how the sustained load
is found (bisection).

**Cells.** A sweep is a list of independent cells (a placement's bisection for one mix and
seed, one policy at one load), each a picklable argument to a module-level function. A
:class:`CellRunner` runs ``fn`` over the cells and yields ``(index, result)`` as they finish;
callers order the results by index, so a report does not depend on which cell finished first
and the pool and Ray give identical reports. :func:`open_runner` picks the runner: Ray when
given an address (``auto``: a local Ray started for the sweep), otherwise a process pool of
``jobs`` workers (``jobs == 1``: in this process). Ray is an optional extra
(``pip install 'slicesched[ray]'``), imported only here and only when asked for.

**Sustained load.** :class:`LoadSearch` finds the highest offered load whose SLA violation rate
is at most a target: it brackets the crossing by doubling (or halving) from a start load, then
bisects until the bracket's relative width ``(fail - ok) / ok`` is at most ``rel_tol``. It
assumes violations rise with load: where noise makes them non-monotone, it finds the lowest
failing load probed and the highest passing load below it (as a walk upwards would). Probes are
cached, so several targets share runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from service.domain.error import InvalidInputError

C = TypeVar("C")
R = TypeVar("R")


# ---- where cells run ---------------------------------------------------------------------------
class CellRunner(Protocol):
    """Runs ``fn`` over ``cells``; yields ``(index into cells, result)`` in completion order. An
    exception in a cell is raised from the iterator (the sweep stops; nothing dies silently)."""

    name: str

    def map(self, fn: Callable[[C], R], cells: Sequence[C]) -> Iterator[tuple[int, R]]: ...


class InProcess:
    """Cells one after another in this process (``--jobs 1`` without ``--ray``)."""

    name = "in-process"

    def map(self, fn: Callable[[C], R], cells: Sequence[C]) -> Iterator[tuple[int, R]]:
        for i, cell in enumerate(cells):
            yield i, fn(cell)


class LocalPool:
    """Cells on a pool of ``jobs`` worker processes; ``fn`` must be importable by name."""

    def __init__(self, pool: ProcessPoolExecutor, jobs: int) -> None:
        self._pool = pool
        self.name = f"process pool ({jobs} workers)"

    def map(self, fn: Callable[[C], R], cells: Sequence[C]) -> Iterator[tuple[int, R]]:
        futures = {self._pool.submit(fn, cell): i for i, cell in enumerate(cells)}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()


class RayRunner:
    """Cells as Ray tasks, one CPU each, on the cluster :func:`open_runner` connected to."""

    def __init__(self, ray: Any, where: str) -> None:
        self._ray = ray
        self.name = f"ray ({where})"

    def map(self, fn: Callable[[C], R], cells: Sequence[C]) -> Iterator[tuple[int, R]]:
        remote = self._ray.remote(num_cpus=1, max_retries=0)(fn)
        refs = {remote.remote(cell): i for i, cell in enumerate(cells)}
        pending = list(refs)
        while pending:
            ready, pending = self._ray.wait(pending, num_returns=1)
            for ref in ready:
                yield refs[ref], self._ray.get(ref)


def import_ray() -> Any:
    """The ``ray`` module, or :class:`InvalidInputError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InvalidInputError("--ray needs Ray, an optional extra: pip install 'slicesched[ray]' "
                                "(or, in a clone, uv sync --extra ray)") from None
    return ray


@contextmanager
def open_runner(ray_address: str | None, jobs: int, *, ray_cpus: int | None = None) -> Iterator[CellRunner]:
    """The runner for a sweep, shut down on exit.

    ``ray_address``: ``None`` for the local pool; ``auto`` starts a local Ray for the sweep
    (``ray_cpus`` CPUs, default ``jobs``) with this project on its workers' path; any other
    value is a running cluster's address (``ray://HOST:10001`` or ``HOST:6379``), to which this
    checkout is shipped as the tasks' working directory (the cluster's Python must have the
    project's dependencies, and its nodes the cost-model artifact or the means to train it).
    """
    if jobs < 1:
        raise InvalidInputError(f"--jobs must be at least 1, got {jobs}")
    if ray_address is None:
        if jobs == 1:
            yield InProcess()
            return
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            yield LocalPool(pool, jobs)
        return
    if not ray_address.strip():
        raise InvalidInputError("--ray needs an address (HOST:PORT, ray://HOST:PORT) or 'auto' for a local Ray")
    ray = import_ray()
    root = str(Path(__file__).resolve().parents[2])
    env: dict[str, Any]
    if ray_address == "auto":
        env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}}
        ray.init(num_cpus=ray_cpus or jobs, include_dashboard=False, runtime_env=env, log_to_driver=True)
    else:
        env = {"working_dir": root, "excludes": [".git", ".venv", "benchmarks/results", "docs", "site", "*.png"]}
        try:
            ray.init(address=ray_address, runtime_env=env, log_to_driver=True)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise InvalidInputError(f"--ray {ray_address}: cannot connect ({exc})") from None
    try:
        yield RayRunner(ray, ray_address)
    finally:
        ray.shutdown()


# ---- the sustained load by bisection -------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """One run of the search: its offered load and what it measured."""

    load: float
    violation: float  # SLA violation rate
    tokens_per_s: float


@dataclass(frozen=True)
class Sustained:
    """The search's answer for one target.

    ``load``: the highest probed load with violations <= ``target`` below the lowest failing one
    (0 when even the lowest load probed fails); ``tokens_per_s`` at it; ``failing``: the lowest
    probed load above it that fails (``None``: none failed up to the search's ``max_load``);
    ``bracketed``: both sides found; ``rel_width``: ``(failing - load) / load`` (``None``
    unbracketed), at most the search's ``rel_tol`` once bracketed.
    """

    target: float
    load: float
    tokens_per_s: float
    failing: float | None
    bracketed: bool
    rel_width: float | None


@dataclass
class LoadSearch:
    """Bisection for the sustained load over a cached ``probe(load) -> (violation, tokens/s)``.

    ``start``: the first load tried; the bracket grows by factors of 2 up to ``max_load`` and
    down to ``min_load``; ``rel_tol``: the bracket's relative width to stop at.
    """

    probe: Callable[[float], tuple[float, float]]
    start: float = 0.5
    rel_tol: float = 0.02
    min_load: float = 1.0 / 256
    max_load: float = 64.0
    probes: dict[float, Probe] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (0 < self.min_load <= self.start <= self.max_load):
            raise InvalidInputError("a load search needs 0 < min_load <= start <= max_load")
        if not self.rel_tol > 0:
            raise InvalidInputError("a load search needs rel_tol > 0")

    def run(self, load: float) -> Probe:
        """The probe at ``load`` (run once, then cached)."""
        if load not in self.probes:
            violation, tokens = self.probe(load)
            self.probes[load] = Probe(load, violation, tokens)
        return self.probes[load]

    def sustained(self, target: float) -> Sustained:
        """Bracket, then bisect, for ``target`` (a violation rate)."""
        if not self.probes:
            self.run(self.start)
        while (fail := self._lowest_failing(target)) is None:
            top = max(self.probes)
            if top >= self.max_load:
                break
            self.run(min(self.max_load, top * 2))
        while self._highest_ok(target, fail) is None:
            bottom = min(self.probes)
            if bottom <= self.min_load:
                return Sustained(target, 0.0, 0.0, fail, False, None)
            self.run(max(self.min_load, bottom / 2))
            fail = self._lowest_failing(target)
        ok = self._highest_ok(target, fail)
        assert ok is not None
        while fail is not None and (fail - ok.load) / ok.load > self.rel_tol:
            self.run((ok.load + fail) / 2)
            fail = self._lowest_failing(target)
            ok = self._highest_ok(target, fail)
            assert ok is not None
        width = None if fail is None else (fail - ok.load) / ok.load
        return Sustained(target, ok.load, ok.tokens_per_s, fail, fail is not None, width)

    def _lowest_failing(self, target: float) -> float | None:
        failing = [p.load for p in self.probes.values() if p.violation > target]
        return min(failing) if failing else None

    def _highest_ok(self, target: float, below: float | None) -> Probe | None:
        ok = [p for p in self.probes.values() if p.violation <= target and (below is None or p.load < below)]
        return max(ok, key=lambda p: p.load) if ok else None

    def walk(self) -> list[Probe]:
        """Every probe, by load."""
        return [self.probes[k] for k in sorted(self.probes)]


# ---- intervals ------------------------------------------------------------------------------------
def bootstrap(groups: Sequence[Sequence[float]], statistic: Callable[[list[list[float]]], float], *,
              seed: int, resamples: int = 2000, level: float = 0.9) -> dict[str, float | int]:
    """A percentile bootstrap interval of ``statistic`` over ``groups`` of observations (e.g. one
    group per mix, one observation per seed): each resample draws every group's observations
    with replacement, within the group, from ``np.random.default_rng(seed)``.

    Returns ``{"median", "lo", "hi", "n"}``: the median and the ``(1 - level) / 2`` and
    ``(1 + level) / 2`` quantiles of the resampled statistic, rounded to 3 places, and ``n`` the
    number of observations. With one observation per group the interval is that point: a
    bootstrap cannot show spread it has not seen.
    """
    data = [np.asarray(g, dtype=float) for g in groups]
    if not data or any(len(g) == 0 for g in data):
        raise ValueError("bootstrap needs at least one observation in every group")
    if not 0 < level < 1 or resamples < 1:
        raise ValueError("bootstrap needs 0 < level < 1 and at least one resample")
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    for b in range(resamples):
        stats[b] = statistic([g[rng.integers(0, len(g), size=len(g))].tolist() for g in data])
    lo, mid, hi = np.quantile(stats, [(1 - level) / 2, 0.5, (1 + level) / 2])
    return {"median": round(float(mid), 3), "lo": round(float(lo), 3), "hi": round(float(hi), 3),
            "n": sum(len(g) for g in data)}

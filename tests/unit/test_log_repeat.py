"""Repeated warning lines: the first goes out, the repeats within the window are held and counted,
the next one after it goes out with the count (a fake clock, so the windows are the test's)."""

from __future__ import annotations

import logging

import pytest

from service.live.log_repeat import RepeatedLineFilter


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


@pytest.fixture
def setup() -> tuple[logging.Logger, Lines, FakeClock]:
    clock = FakeClock()
    handler = Lines()
    handler.addFilter(RepeatedLineFilter(10.0, clock=clock, max_lines=4))
    log = logging.getLogger("slicesched.test_log_repeat")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.DEBUG)
    return log, handler, clock


def test_repeats_are_held_and_summarised_once_per_window(setup: tuple[logging.Logger, Lines, FakeClock]) -> None:
    log, out, clock = setup
    for _ in range(500):  # an outage: one warning per refused call
        log.warning("Neo4j unavailable: %s", "unreachable")
        clock.now += 0.01  # 5 s in all
    assert out.lines == ["WARNING Neo4j unavailable: unreachable"]
    clock.now += 5.0  # 10 s after the first
    log.warning("Neo4j unavailable: %s", "unreachable")
    assert out.lines[-1] == "WARNING Neo4j unavailable: unreachable [repeated 499 times in the last 10 s]"
    clock.now += 3.0
    log.warning("Neo4j unavailable: %s", "unreachable")  # held again (a new window)
    clock.now += 20.0
    log.warning("Neo4j unavailable: %s", "unreachable")
    assert out.lines[-1] == "WARNING Neo4j unavailable: unreachable [repeated 1 time in the last 23 s]"
    clock.now += 30.0
    log.warning("Neo4j unavailable: %s", "unreachable")  # nothing held since: as it is
    assert out.lines[-1] == "WARNING Neo4j unavailable: unreachable" and len(out.lines) == 4


def test_other_lines_levels_and_loggers_pass(setup: tuple[logging.Logger, Lines, FakeClock]) -> None:
    log, out, _ = setup
    log.warning("a")
    log.warning("b")  # another text
    log.error("a")  # another level
    logging.getLogger("slicesched.test_log_repeat.child").warning("a")  # another logger (propagated to the handler)
    for _ in range(3):
        log.info("progress")  # below WARNING: never held
    assert out.lines == ["WARNING a", "WARNING b", "ERROR a", "WARNING a"] + ["INFO progress"] * 3
    log.warning("a")
    assert len(out.lines) == 7  # held


def test_only_so_many_lines_are_remembered(setup: tuple[logging.Logger, Lines, FakeClock]) -> None:
    log, out, _ = setup
    for text in ("a", "b", "c", "d", "e"):  # max_lines=4: "a" is forgotten
        log.warning(text)
    log.warning("a")  # forgotten, so it passes as new
    log.warning("e")  # remembered: held
    assert out.lines == ["WARNING a", "WARNING b", "WARNING c", "WARNING d", "WARNING e", "WARNING a"]


def test_bad_windows_are_refused() -> None:
    with pytest.raises(ValueError):
        RepeatedLineFilter(0.0)

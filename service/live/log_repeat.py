"""Repeated log lines held back: during a Neo4j outage every refused call logged the same warning
(issue 41's hand probes: about 5,500 lines in 3 minutes), burying what else happened.

:class:`RepeatedLineFilter` lets the first of identical lines (same logger, level and text) through,
holds the ones that follow within ``window_s``, and sends the next one after that with how many it
held (``[repeated N times in the last T s]``), so an outage of any length writes about one line per
distinct warning per window. ``slicesched serve`` puts it on its log handler.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class RepeatedLineFilter(logging.Filter):
    """``level``: lines below it always pass; ``clock``: monotonic seconds (a test's fake clock);
    ``max_lines``: distinct lines remembered at most (the longest unseen forgotten first)."""

    def __init__(self, window_s: float = 10.0, *, level: int = logging.WARNING,
                 clock: Callable[[], float] = time.monotonic, max_lines: int = 1000) -> None:
        super().__init__()
        if window_s <= 0 or max_lines < 1:
            raise ValueError("window_s must be > 0 and max_lines >= 1")
        self.window_s = window_s
        self.level = level
        self.clock = clock
        self.max_lines = max_lines
        self._lines: OrderedDict[tuple[str, int, str], tuple[float, int]] = OrderedDict()  # -> (sent at, held since)
        self._lock = threading.Lock()  # handlers filter outside their own lock, from any thread

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.level:
            return True
        text = record.getMessage()
        key = (record.name, record.levelno, text)
        now = self.clock()
        with self._lock:
            seen = self._lines.get(key)
            if seen is not None and now - seen[0] < self.window_s:
                self._lines[key] = (seen[0], seen[1] + 1)
                return False
            self._lines[key] = (now, 0)
            self._lines.move_to_end(key)
            while len(self._lines) > self.max_lines:
                self._lines.popitem(last=False)
        if seen is not None and seen[1]:
            times = "time" if seen[1] == 1 else "times"
            record.msg = f"{text} [repeated {seen[1]} {times} in the last {now - seen[0]:.0f} s]"
            record.args = None
        return True

"""The live service's wake-ups (:class:`service.live.notify.Signal`): all at once, or only the
waiters that can take the work, longest waiting first, never a missed one."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from service.live.notify import Signal

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_a_notification_between_the_check_and_the_wait_is_not_missed() -> None:
    async def go() -> bool:
        s = Signal()
        w = s.waiter("a")  # taken before the check
        s.notify(["a"], 1)  # arrives before the wait begins
        await asyncio.wait_for(w, 0.5)
        return w.done()

    assert run(go())


def test_keys_pick_the_waiters_and_n_bounds_them_longest_waiting_first() -> None:
    async def go() -> list[bool]:
        s = Signal()
        ws = [s.waiter(k) for k in ("a", "b", "c", "b", "d")]
        s.notify(["b", "c", "d"], 2)
        await asyncio.sleep(0)
        return [w.done() for w in ws]

    assert run(go()) == [False, True, True, False, False]


def test_notify_without_keys_wakes_everyone_and_forgets_them() -> None:
    async def go() -> tuple[list[bool], int]:
        s = Signal()
        ws = [s.waiter(k) for k in ("a", None, "b")]
        s.notify()
        return [w.done() for w in ws], s.waiting()

    assert run(go()) == ([True, True, True], 0)


def test_a_forgotten_waiter_takes_no_wake_up_from_another() -> None:
    async def go() -> list[bool]:
        s = Signal()
        first, second = s.waiter("a"), s.waiter("a")
        s.forget(first)  # it stopped waiting (it leased something, or its poll ended)
        s.notify(["a"], 1)
        return [first.done(), second.done()]

    assert run(go()) == [False, True]


def test_a_cancelled_waiter_does_not_count_against_n() -> None:
    async def go() -> list[bool]:
        s = Signal()
        gone, live = s.waiter("a"), s.waiter("a")
        gone.cancel()
        s.notify(["a"], 1)
        return [gone.cancelled(), live.done()]

    assert run(go()) == [True, True]

"""Showing that an asyncio event loop never waits on pybk, without timing it.

A bound on how late the loop ran a tick (the way these tests used to check it) fails on
a machine busy enough to delay any thread, and passes for a loop blocked a little less
than the bound.  :class:`LoopWatch` checks the property itself instead, on the loop's own
thread: while it watches, a profile hook on that thread records every *wait* entered
there with pybk code on the stack (a ``threading`` condition, event or lock wait, a
``concurrent.futures`` result, ``time.sleep``, a file sync or a ``select``/``poll``), which
is how any pybk call that blocks, for a disk, a bookie, ZooKeeper or another thread, has
to wait.  The loop's own wait for I/O (asyncio's selector) has no pybk frame under it
and is not counted.  It also counts the loop's ticks, so that a test holding the work
underneath can show the loop went on turning meanwhile (a loop blocked for the hold
would turn once at most).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import types
from concurrent.futures import Future
from typing import Any, Callable

#: The period of the watch's ticking task, in seconds.
TICK_S = 0.005

#: Python functions that wait for another thread (or a timeout), each with what says
#: that the call on ``self`` returns at once instead (an answer already there).
_WAITING_FUNCTIONS: dict[types.CodeType, Callable[[Any], bool]] = {
    threading.Condition.wait.__code__: lambda _condition: False,
    threading.Condition.wait_for.__code__: lambda _condition: False,
    threading.Semaphore.acquire.__code__: lambda _semaphore: False,  # see _returns_at_once
    threading.Event.wait.__code__: threading.Event.is_set,
    threading.Thread.join.__code__: lambda thread: not thread.is_alive(),
    Future.result.__code__: Future.done,
    Future.exception.__code__: Future.done,
}
#: C functions that wait for a disk, a socket or the clock.
_WAITING_BUILTINS = {"sleep", "fsync", "fdatasync", "sync_file_range", "select", "poll",
                     "epoll", "recv", "recv_multipart", "accept"}


class LoopWatch:
    """``async with LoopWatch() as watch``: afterwards ``watch.waits`` lists every wait the
    loop's thread entered under pybk code while the block ran (empty: it never waited on
    pybk), and ``watch.ticks`` how many times a 5 ms tick ran."""

    def __init__(self) -> None:
        self.waits: list[str] = []
        self.ticks = 0
        self._thread = threading.get_ident()
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "LoopWatch":
        self._thread = threading.get_ident()
        self._task = asyncio.create_task(self._tick())
        sys.setprofile(self._profile)
        return self

    async def __aexit__(self, *exc: object) -> None:
        sys.setprofile(None)
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self.ticks += 1

    def _profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in _WAITING_FUNCTIONS:
            if _returns_at_once(frame):
                return
            caller = frame.f_back
            what = frame.f_code.co_qualname
        elif event == "c_call" and getattr(arg, "__name__", None) in _WAITING_BUILTINS:
            caller, what = frame, arg.__qualname__
        else:
            return
        pybk_frame = _pybk_frame(caller)
        if pybk_frame is not None and threading.get_ident() == self._thread:
            self.waits.append(f"{what} under {pybk_frame}")

    def ticks_during(self, since: int) -> int:
        """Ticks since a count read earlier (``watch.ticks``)."""
        return self.ticks - since


def _returns_at_once(frame: types.FrameType) -> bool:
    """Whether the waiting function called in ``frame`` returns without waiting: its
    answer is there already, it was asked not to wait (``acquire(timeout=0)``, as a
    thread pool's submit does), or it is ``Thread.start`` waiting for the new thread to
    run (a step of starting one, never a wait for work)."""
    arguments = frame.f_locals
    if _WAITING_FUNCTIONS[frame.f_code](arguments["self"]):
        return True
    if arguments.get("blocking") is False or arguments.get("timeout") == 0:
        return True
    caller = frame.f_back
    while caller is not None:
        if caller.f_code is threading.Thread.start.__code__:
            return True
        caller = caller.f_back
    return False


def _pybk_frame(frame: types.FrameType | None) -> str | None:
    """The innermost pybk function on the stack from ``frame`` down, as
    ``module.function``, or None."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module == "pybk" or module.startswith("pybk."):
            return f"{module}.{frame.f_code.co_qualname}"
        frame = frame.f_back
    return None

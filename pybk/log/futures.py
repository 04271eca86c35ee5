"""Futures for the records of one batch: real ``concurrent.futures.Future`` objects that
share one condition and complete together.

Why: a plain Future makes its own Condition (a lock plus several objects the garbage
collector tracks).  With tens of thousands of appends in flight that costs more than
the rest of an append (about 10 µs against 2 µs per record, measured).  The records of a
batch are acknowledged at the same moment anyway, so they share one Condition, and
:meth:`BatchFutures.set_results` completes all of them under one acquisition of it, so
no waiter can see one completed and a sibling not (a Future's waiter trusts any wake-up
of its condition).  For the same reason the futures start RUNNING: an append cannot be
taken back, so ``cancel()`` returns False and never wakes the shared condition.

They are ordinary Futures to their users (``result``, ``exception``,
``add_done_callback``, ``concurrent.futures.wait`` and ``as_completed`` all work).  This
relies on the instance layout of ``concurrent.futures.Future``, unchanged since Python
3.2; it is checked at import, and plain Futures are used if it ever differs.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures import _base

_FIELDS = ("_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks")
_LAYOUT_KNOWN = (set(_FIELDS) <= set(vars(Future())) and hasattr(Future, "_invoke_callbacks")
                 and hasattr(_base, "RUNNING") and hasattr(_base, "FINISHED"))


class _SharedConditionFuture(Future):
    """A RUNNING Future whose condition is given (shared with its batch)."""

    def __init__(self, condition: threading.Condition) -> None:  # noqa: super() not called
        self._condition = condition
        self._state = _base.RUNNING
        self._result = None
        self._exception = None
        self._waiters: list = []
        self._done_callbacks: list = []


class BatchFutures:
    """The futures of one batch's records, completed all at once."""

    __slots__ = ("_condition", "futures")

    def __init__(self) -> None:
        self._condition = threading.Condition() if _LAYOUT_KNOWN else None
        self.futures: list[Future] = []

    def __len__(self) -> int:
        return len(self.futures)

    def new(self) -> Future:
        """One more record's future."""
        future = (_SharedConditionFuture(self._condition) if self._condition is not None
                  else Future())
        self.futures.append(future)
        return future

    def set_results(self, results: list[object]) -> None:
        """Complete the futures with ``results`` (one each, in order)."""
        if self._condition is None:
            for future, result in zip(self.futures, results):
                if future.set_running_or_notify_cancel():
                    future.set_result(result)
            return
        with self._condition:
            for future, result in zip(self.futures, results):
                future._result = result
                future._state = _base.FINISHED
                for waiter in future._waiters:
                    waiter.add_result(future)
            self._condition.notify_all()
        for future in self.futures:
            future._invoke_callbacks()

    def set_exception(self, error: BaseException) -> None:
        """Fail every future of the batch that is not done yet with ``error``."""
        if self._condition is None:
            for future in self.futures:
                if not future.done() and future.set_running_or_notify_cancel():
                    future.set_exception(error)
            return
        with self._condition:
            failed = [f for f in self.futures if f._state != _base.FINISHED]
            for future in failed:
                future._exception = error
                future._state = _base.FINISHED
                for waiter in future._waiters:
                    waiter.add_exception(future)
            self._condition.notify_all()
        for future in failed:
            future._invoke_callbacks()

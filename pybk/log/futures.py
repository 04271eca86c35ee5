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
3.2 (and on ``threading.Condition`` keeping its waiters in a deque, so that a batch
nobody waits for skips ``notify_all``); it is checked at import, and plain Futures are
used if it ever differs.

Where callbacks run.  A batch completes on whichever thread acknowledged it: the
bookie's journal thread, a thread that led a group commit (a blocking ``append``), a
ZeroMQ loop.  Those threads serve every append, so the application's code never runs
on them: waiters (``result``, ``wait``, ``as_completed``) are woken there directly, but
the futures' done-callbacks run on pybk's callback thread (named ``pybk-callbacks``),
one at a time, in the order the batches completed (a writer completes its batches in
position order).  A slow callback delays the callbacks after it, never an append nor a
waiter, and a callback may append (even blocking).  The thread starts when a callback
is due and ends after :data:`CALLBACK_THREAD_IDLE_S` with nothing to run; callbacks
still queued when the interpreter exits are run first.  A callback added to a future
that is done already runs at once on the caller's thread, as with any Future.  (With
plain Futures, the fallback, the whole completion happens on the callback thread.)
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
from concurrent.futures import Future, _base
from functools import partial
from typing import Any, Callable, Sequence

#: Seconds the callback thread waits for more work before it ends (a later callback
#: starts it again).
CALLBACK_THREAD_IDLE_S = 0.5
#: Seconds the interpreter's exit waits for callbacks still queued.
CALLBACK_DRAIN_AT_EXIT_S = 10.0

_FIELDS = ("_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks")
_FINISHED: str = getattr(_base, "FINISHED", "FINISHED")
_LAYOUT_KNOWN = (set(_FIELDS) <= set(vars(Future())) and hasattr(Future, "_invoke_callbacks")
                 and hasattr(_base, "RUNNING") and hasattr(_base, "FINISHED")
                 and isinstance(getattr(threading.Condition(), "_waiters", None),
                                collections.deque))


class _CallbackThread:
    """Runs work in the order it was submitted, on one thread of pybk's own that starts
    when work comes and ends after :data:`CALLBACK_THREAD_IDLE_S` without any."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._work: collections.deque[Callable[[], None]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._running = False  # the thread is inside a piece of work

    def submit(self, work: Callable[[], None]) -> None:
        """Queue ``work`` (which must not raise: see :func:`_invoke_callbacks`)."""
        with self._lock:
            self._work.append(work)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pybk-callbacks",
                                                daemon=True)
                self._thread.start()  # it waits for this lock before taking the work
            else:
                self._wake.notify()

    def drain(self, timeout: float) -> bool:
        """Wait until everything submitted so far has run (at once from the callback
        thread itself, which cannot wait for itself); False if ``timeout`` passed."""
        with self._lock:
            if self._thread is threading.current_thread():
                return True
            return self._wake.wait_for(lambda: not self._work and not self._running,
                                       timeout)

    def _run(self) -> None:
        work = self._work
        while True:
            with self._lock:
                self._running = False
                self._wake.notify_all()  # drain() waiters look again
                if not self._wake.wait_for(lambda: work, CALLBACK_THREAD_IDLE_S):
                    self._thread = None
                    return
                batch = list(work)
                work.clear()
                self._running = True
            for item in batch:
                item()


_callbacks = _CallbackThread()


def _new_callback_thread_after_fork() -> None:
    """A forked child has none of its parent's threads: it starts its own when needed."""
    global _callbacks
    _callbacks = _CallbackThread()


os.register_at_fork(after_in_child=_new_callback_thread_after_fork)
atexit.register(lambda: _callbacks.drain(CALLBACK_DRAIN_AT_EXIT_S))


def wait_for_callbacks(timeout: float) -> bool:
    """Wait until the done-callbacks of every batch completed so far have run; False if
    ``timeout`` seconds passed first.  (From a callback it returns at once.)"""
    return _callbacks.drain(timeout)


def _invoke_callbacks(futures: Sequence[Future]) -> None:
    # Future._invoke_callbacks logs and swallows what a callback raises.  It is private
    # (typeshed leaves it out); the layout checked at import includes it.
    for future in futures:
        future._invoke_callbacks()  # type: ignore[attr-defined]


def _complete_plain(futures: Sequence[Future], results: Sequence[object] | None,
                    error: BaseException | None) -> None:
    """Complete plain Futures (the fallback layout), on the callback thread: a plain
    Future runs its callbacks on the thread that completes it."""
    for i, future in enumerate(futures):
        if future.done() or not future.set_running_or_notify_cancel():
            continue
        if results is not None:
            future.set_result(results[i])
        else:
            future.set_exception(error)


class _SharedConditionFuture(Future):
    """A RUNNING Future whose condition is given (shared with its batch)."""

    # Future.__init__ is not called: it would make a condition of its own.
    def __init__(self, condition: threading.Condition) -> None:
        self._condition = condition
        self._state = _base.RUNNING
        self._result = None
        self._exception = None
        self._waiters: list = []
        self._done_callbacks: list = []

    # A pipelining caller asks every record's future for its result, mostly once it is
    # done: then the answer needs no lock.  A batch sets ``_result`` (or ``_exception``)
    # before ``_state``, and the GIL orders those stores, so FINISHED means the outcome
    # is there.
    def result(self, timeout: float | None = None) -> Any:
        if self._state is _FINISHED and self._exception is None:
            return self._result
        return super().result(timeout)

    def done(self) -> bool:
        return self._state is _FINISHED or super().done()


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

    def set_results(self, results: Sequence[object]) -> None:
        """Complete the futures with ``results`` (one each, in order): waiters wake now,
        callbacks run on the callback thread."""
        if self._condition is None:
            _callbacks.submit(partial(_complete_plain, list(self.futures), results, None))
            return
        with self._condition:
            for future, result in zip(self.futures, results):
                future._result = result
                future._state = _FINISHED
                for waiter in future._waiters:
                    waiter.add_result(future)
            if self._condition._waiters:  # type: ignore[attr-defined]  # checked at import
                self._condition.notify_all()  # a dozen Python calls, even for no waiter
        self._call_back(self.futures)

    def set_exception(self, error: BaseException) -> None:
        """Fail every future of the batch that is not done yet with ``error``: waiters
        wake now, callbacks run on the callback thread."""
        if self._condition is None:
            _callbacks.submit(partial(_complete_plain, list(self.futures), None, error))
            return
        with self._condition:
            failed = [f for f in self.futures if f._state != _base.FINISHED]
            for future in failed:
                future._exception = error
                future._state = _FINISHED
                for waiter in future._waiters:
                    waiter.add_exception(future)
            self._condition.notify_all()
        self._call_back(failed)

    @staticmethod
    def _call_back(finished: list[Future]) -> None:
        """Hand the callbacks of ``finished`` futures to the callback thread.  Their
        lists no longer change: a callback added to a finished future runs at once."""
        called = [f for f in finished
                  if f._done_callbacks]  # type: ignore[attr-defined]  # private, as above
        if called:
            _callbacks.submit(partial(_invoke_callbacks, called))

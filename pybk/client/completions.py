"""Ordered delivery of a ledger's add completions.

A ledger's adds are acknowledged on whichever thread a bookie's answer arrives (a
journal thread, a ZeroMQ loop, the client's worker after an ensemble change), often on
two at once.  The protocol promises the application its completions in entry-id order,
so deciding *which* adds completed (under the ledger's lock) is separated from *calling*
their callbacks: the decision appends to a :class:`CompletionQueue` under the lock, in
entry-id order, and :meth:`CompletionQueue.deliver` then calls them outside the lock, on
one thread at a time.  A thread that finds another delivering leaves its completions to
it, so no thread waits for another's callbacks, and callbacks never overlap.

Completions are queued by the run, not by the add: a list of callbacks for consecutive
entry ids (the ledger's slots, sliced), so deciding a thousand adds is one append.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Callable, Sequence

log = logging.getLogger(__name__)

#: ``done(entry_id, None)`` for an acknowledged add, ``done(None, error)`` for a failed one.
AddDone = Callable[[int | None, BaseException | None], None]


class CompletionQueue:
    """Completions decided under ``lock`` and delivered in that order, one at a time."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        # Runs of completions: (callbacks, id of the first, error).  Callback i of a run
        # is called with (first + i, None), or (None, error); None stands for no callback.
        self._queue: collections.deque[tuple[Sequence[AddDone | None], int | None,
                                             BaseException | None]] = collections.deque()
        self._deliverer: int | None = None  # the thread calling callbacks now
        self._idle = threading.Condition(lock)

    def put_range(self, dones: Sequence[AddDone | None], first: int | None,
                  error: BaseException | None = None) -> None:
        """Queue the completions of consecutive adds: ``dones[i]`` is called with
        ``(first + i, None)``, or with ``(None, error)`` when ``error`` is given (then
        ``first`` is not used).  Caller holds the lock and queues in entry-id order; the
        list is the queue's from now on."""
        self._queue.append((dones, first, error))

    def deliver(self) -> None:
        """Call the queued callbacks, unless another thread is at it (it calls ours too).

        Call without holding the lock."""
        me = threading.get_ident()
        with self._lock:
            if self._deliverer is not None or not self._queue:
                return
            self._deliverer = me
        queue = self._queue
        while True:
            with self._lock:
                if not queue:
                    self._deliverer = None
                    self._idle.notify_all()
                    return
                batch = list(queue)
                queue.clear()
            for dones, first, error in batch:
                for entry_id, done in enumerate(dones, first or 0):
                    if done is None:
                        continue
                    try:
                        if error is None:
                            done(entry_id, None)
                        else:
                            done(None, error)
                    except Exception:  # the application's bug must not stop the others
                        log.exception("an add's completion callback raised")

    def wait_delivered(self, timeout: float) -> bool:
        """Wait until everything queued so far was delivered (at once if called from a
        callback, which cannot wait for itself); False if ``timeout`` passed first."""
        with self._lock:
            if self._deliverer == threading.get_ident():
                return True
            return self._idle.wait_for(lambda: self._deliverer is None and not self._queue,
                                       timeout)

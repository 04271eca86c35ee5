"""Persistent watches and the thread that runs their callbacks.

A :class:`Watch` is a persistent subscription to one path: its callback runs with the
path after every change of the record there (created, set, deleted) and of the set of
its children, until :meth:`Watch.cancel`.  One store call is one change: a create that
also makes the ancestors calls a watch on one of them once.  A call says *that*
something changed, not what: the callback re-reads what it needs.

A :class:`Notifier` runs the callbacks of one store on a single thread, one at a time,
in the order the store published the changes (the store publishes while it still holds
its write lock, so that order is commit order).  No store lock is held while a callback
runs: a callback may read and write the store and cancel watches.  A callback that raises
is logged and harms nothing else.  The thread starts with the first watch.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Iterable

log = logging.getLogger(__name__)

WatchCallback = Callable[[str], None]

# How long close() waits for a callback that is still running before it gives up on it.
CLOSE_WAIT_S = 30.0


class Watch:
    """A persistent watch on one path (a cancel handle; also a context manager)."""

    def __init__(self, path: str, callback: WatchCallback,
                 on_cancel: Callable[["Watch"], None]) -> None:
        self.path = path
        self.callback = callback
        self._on_cancel = on_cancel
        self._active = True

    @property
    def active(self) -> bool:
        return self._active

    def cancel(self) -> None:
        """Stop the watch: its callback is not called again once this returns (unless it
        is running right now, on the notifier thread).  Cancelling twice is harmless."""
        if self._active:
            self._active = False
            self._on_cancel(self)

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def __repr__(self) -> str:
        return f"Watch({self.path!r}, active={self._active})"


class Notifier:
    """The watches of one store and the thread that calls them back.

    ``on_unwatched(path)``, if given, runs (on the cancelling thread, with no lock held)
    once the last watch on a path is cancelled, so a store can drop what it keeps per
    watched path."""

    def __init__(self, thread_name: str,
                 on_unwatched: Callable[[str], None] | None = None) -> None:
        self._thread_name = thread_name
        self._on_unwatched = on_unwatched
        self._lock = threading.Lock()
        self._watches: dict[str, list[Watch]] = {}
        # Unbounded on purpose: a bounded queue would make a store write wait for
        # callbacks, and a callback that writes to the store would then wait for itself.
        self._queue: queue.SimpleQueue[tuple[str, list[Watch]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, path: str, callback: WatchCallback) -> Watch:
        watch = Watch(path, callback, self._remove)
        with self._lock:
            self._watches.setdefault(path, []).append(watch)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name=self._thread_name,
                                                daemon=True)
                self._thread.start()
        return watch

    def _remove(self, watch: Watch) -> None:
        with self._lock:
            watches = self._watches.get(watch.path, [])
            if watch in watches:
                watches.remove(watch)
            unwatched = not watches and self._watches.pop(watch.path, None) is not None
        if unwatched and self._on_unwatched is not None:
            self._on_unwatched(watch.path)

    def watching(self, path: str) -> bool:
        """Whether any watch on ``path`` is active."""
        with self._lock:
            return path in self._watches

    def publish(self, paths: Iterable[str]) -> None:
        """Queue one call of every watch on each of ``paths`` (watches added later miss it)."""
        with self._lock:
            for path in paths:
                watches = self._watches.get(path)
                if watches:
                    self._queue.put((path, list(watches)))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            path, watches = item
            for watch in watches:
                if not watch.active:
                    continue
                try:
                    watch.callback(path)
                except Exception:
                    log.exception("watch callback %r on %s failed", watch.callback, path)

    def close(self) -> None:
        """Deliver what is queued, then stop the thread and cancel every watch.

        Called from a callback, it does not wait for the thread (which is itself)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            watches = [w for ws in self._watches.values() for w in ws]
        self._queue.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(CLOSE_WAIT_S)
            if thread.is_alive():
                log.warning("a watch callback still runs %.0f s after close; leaving it",
                            CLOSE_WAIT_S)
        for watch in watches:
            watch.cancel()

"""Handing work to the thread that owns ZeroMQ sockets, from any other thread.

ZeroMQ sockets are not thread-safe: each belongs to one thread, which sleeps in a poll.
Other threads (the bookie's journal thread completing an add, an application thread
sending a request) give that thread work through a :class:`Mailbox`: a queue of
callables and a pipe whose read end the owner's poller watches.  Wakes are coalesced:
until the owner drains the mailbox, more posts do not write to the pipe again, so a
burst of completions costs one system call.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from typing import Callable

log = logging.getLogger(__name__)


class Mailbox:
    """A queue of callables for one owner thread, which polls :meth:`fileno`."""

    def __init__(self) -> None:
        self._items: collections.deque[Callable[[], None]] = collections.deque()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._signalled = False
        self._closed = False
        self._lock = threading.Lock()  # a wake never writes to a closed (reused) fd

    def fileno(self) -> int:
        """The descriptor that turns readable when work is posted (for ``zmq.Poller``)."""
        return self._read_fd

    def post(self, work: Callable[[], None]) -> bool:
        """Queue ``work`` to run on the owner thread (any thread; never blocks).  False,
        queueing nothing, once the mailbox is closed."""
        with self._lock:  # one lock: a post never lands after close, nor wakes a closed fd
            if self._closed:
                return False
            self._items.append(work)
            if not self._signalled:  # else the owner has a wake pending and sees it too
                self._signalled = True
                try:
                    os.write(self._write_fd, b"\0")
                except BlockingIOError:
                    pass  # the pipe is full, hence readable: the owner wakes anyway
        return True

    def run_posted(self) -> None:
        """Run the work queued so far (owner thread only).  Work posted meanwhile wakes
        the owner again rather than running now, so sockets are not starved."""
        if not self._closed:
            try:
                while os.read(self._read_fd, 4096):
                    pass
            except BlockingIOError:
                pass
        # Order matters: empty the pipe, clear the flag, then count the items.  A post
        # that saw the flag still set appended its item before the count (it runs now);
        # a post after the clear writes a fresh wake (it runs on the next one).
        self._signalled = False
        for _ in range(len(self._items)):
            work = self._items.popleft()
            try:
                work()
            except Exception:  # one failed hand-off must not stop the owner thread
                log.exception("posted work failed")

    def close(self) -> None:
        """Refuse further posts and release the pipe.  Work already queued stays for a
        last :meth:`run_posted`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._read_fd)
            os.close(self._write_fd)

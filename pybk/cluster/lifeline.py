"""Child processes that die with their parent.

``pybk localcluster`` and :class:`~pybk.testing.zookeeper_server.ZooKeeperServer` start
child processes (bookies, a Java ZooKeeper).  When the parent stops normally it stops
them; when it is killed (SIGKILL, the OOM killer) it cannot, and without help they would
run on forever, holding ports and directories.  Two mechanisms, each for what it suits:

The death signal (Linux)
    :func:`death_signal_preexec` makes a ``preexec_fn`` that calls
    ``prctl(PR_SET_PDEATHSIG, sig)`` in the child between fork and exec: the kernel sends
    ``sig`` to the child the moment its parent dies, whatever the child runs (Java
    included) and without any polling.  Two caveats shape its use:

    * The "parent" is the *thread* that forked the child, not the process: a child
      started from a short-lived thread would be signalled when that thread ends while
      the process lives on.  So the signal is only asked for when the child is started
      from the main thread, which lives as long as the process; started from any other
      thread, a child gets none (and relies on its lifeline, if it has one).
    * The parent may die between the fork and the ``prctl``; the child then checks its
      parent id right after and exits instead of exec'ing.
    * A ``preexec_fn`` runs Python in the child of a possibly multi-threaded process,
      where only async-signal-safe work is sure to be safe; this one does nothing but
      call ``prctl`` (looked up and typed beforehand, in the parent) and ``getppid``.

    Where ``prctl`` does not exist (not Linux) it returns None: no death signal.

The lifeline (any POSIX system)
    A pipe whose write end only the parent holds (:class:`Lifeline`); the child gets the
    read end (``pass_fds``) and watches it (:func:`watch_lifeline`, e.g. ``pybk bookie
    --lifeline-fd N``).  A read returns end-of-file once every write end is closed, which
    the kernel does when the parent exits, however it exits.  The child then stops as it
    would on SIGTERM.  A process forked (not exec'd) from the parent inherits the write
    end and keeps the pipe open until it exits too; the death signal covers that case.

Nothing here polls for the parent (no ``getppid()`` loop), so a child of a live parent is
never stopped by mistake.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import signal
import sys
import threading
from typing import Callable

log = logging.getLogger(__name__)

#: prctl(2)'s option number (linux/prctl.h).
PR_SET_PDEATHSIG = 1

@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, or None where there is none.  Looked up in the parent, so that
    the child only calls it (no dynamic loading between fork and exec)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError) as e:
        log.debug("no prctl(): children get no death signal (%s)", e)
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                         ctypes.c_ulong]
    return function


def death_signal_preexec(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that has the kernel send ``sig`` to
    the child when this process dies, or None where that cannot be had: not Linux, or
    not called from the main thread (see the module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    prctl = _prctl()
    if prctl is None:
        return None
    parent_pid = os.getpid()

    def set_death_signal() -> None:  # runs in the child, between fork and exec
        if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return  # not granted: the child runs without it, as where there is no prctl
        if os.getppid() != parent_pid:
            os._exit(1)  # the parent died before the signal was set: follow it now

    return set_death_signal


class Lifeline:
    """A pipe for the lifelines of this process's children: :attr:`child_fd` goes to each
    child (``pass_fds``), and the write end stays here until :meth:`close` (or until the
    process ends).  Both ends are non-inheritable, so no other child holds either."""

    def __init__(self) -> None:
        self.child_fd, self._write_fd = os.pipe()

    def close(self) -> None:
        """Close both ends here: children watching their lifeline see end-of-file.
        Harmless when called twice."""
        for name in ("child_fd", "_write_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                os.close(fd)

    def __enter__(self) -> "Lifeline":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def watch_lifeline(fd: int, on_end: Callable[[], None]) -> threading.Thread:
    """Call ``on_end()`` (once, on a daemon thread) when ``fd`` reads end-of-file: the
    process holding the pipe's write end has exited.  Data read from it is ignored."""

    def watch() -> None:
        try:
            while os.read(fd, 512):
                pass
        except OSError as e:  # a closed or bad descriptor: as good as a broken lifeline
            log.warning("lifeline fd %d failed (%s): treating the parent as gone", fd, e)
        on_end()

    thread = threading.Thread(target=watch, name=f"pybk-lifeline-{fd}", daemon=True)
    thread.start()
    return thread

"""The journal: the bookie's write-ahead log, with group commit.

Every mutation (entry add, master key, fence, explicit LAC, ledger delete) is appended to
the journal and made durable with ``fdatasync`` before it is acknowledged.  Everything
queued while the previous sync ran goes out in the next group: one write, one fdatasync.

Deferred records (adds of ``DEFERRED_SYNC`` ledgers, BookKeeper's ``ackBeforeSync``) are
acknowledged once their group is written (in the page cache: they survive the process's
death, not a power cut), before any fdatasync; a group of deferred records only is not
synced at all.  The next fdatasync of the file covers them: the next group holding a
durable record or a marker (:meth:`Journal.mark`, which is how a force and a checkpoint
wait), a file roll, or the close.

The file format (record framing, types, file header) and reading files back (replay,
torn-tail detection) live in :mod:`pybk.storage.journal_codec`.

Files are written with zeros and synced up to ``journalPreAllocSizeMB`` ahead of the
records (as BookKeeper preallocates), a MiB after each group commit so that no group
waits for a large fill: a record's fdatasync then overwrites blocks the
file system already holds, which costs about half of syncing a write into a growing or
fallocated file (whose extent changes are metadata to sync too).  A zero length with a
zero checksum marks the end of the records.

Crash guarantees
----------------
A record is acknowledged only after the fdatasync that covers it returned, except a
deferred record, which is durable once a marker queued after it completed.  Replay
(:func:`pybk.storage.journal_codec.replay`) reads records in order and stops a file at
the first record that is truncated, fails its checksum or has an unknown type (a torn
write): nothing from there on in that file is applied, and what was discarded is logged.
Records of later files (written after a restart) are still replayed.

Journal files whose every record is older than the checkpoint's LastLogMark are no longer
needed; ``journalMaxBackups`` of them are kept, older ones are removed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

from pybk.errors import BookieClosed, BookKeeperError, DiskFull
from pybk.fileio import DEFAULT_IO, Buffer, FileIO, fsync_directory
from pybk.settings import ServerSettings
from pybk.stats import JournalStats
from pybk.storage.journal_codec import (
    HEADER_SIZE,
    LogMark,
    file_header,
    journal_file_name,
    list_journal_ids,
)

log = logging.getLogger(__name__)

#: A record's completion: ``callback(None)`` once durable, ``callback(error)`` on failure.
RecordCallback = Callable[[BaseException | None], None]
#: A marker's completion: ``callback(LogMark)``, or ``callback(error)`` on failure.
MarkCallback = Callable[[LogMark | BaseException], None]
# A taken queue: (record buffers, record callbacks, (bytes before, marker callback), bytes,
# deferred records' callbacks).
_Group = tuple[list[Buffer], list[RecordCallback], list[tuple[int, MarkCallback]], int,
               list[RecordCallback]]
_Result = TypeVar("_Result")


def _complete_all(callbacks: Iterable[Callable[[_Result], None]], result: _Result) -> None:
    """Call each completion callback; one that raises is logged and does not stop the rest
    (nor the journal thread)."""
    for callback in callbacks:
        try:
            callback(result)
        except Exception:  # a caller's bug must not wedge the journal
            log.exception("a journal completion callback raised")


class Waiter:
    """A one-shot completion for a caller that blocks (cheaper than a Future)."""

    __slots__ = ("_lock", "result")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.result: object = None

    def __call__(self, result: object) -> None:
        self.result = result
        self._lock.release()

    def pending(self) -> bool:
        return self._lock.locked()

    def wait(self) -> object:
        self._lock.acquire()
        return self.result


class Journal:
    """Appends records durably with group commit; one instance per journal directory.

    Ways in:

    * :meth:`submit` queues a record with a completion callback (many in flight); the
      journal thread writes and syncs groups.
    * :meth:`submit` with ``wake=False`` and then :meth:`wait`: when nobody is writing,
      the caller writes the group itself instead of handing it to the journal thread (a
      blocking caller then pays one fdatasync and no thread switch).
    * Submits with ``wake=False`` and then :meth:`lead`: the same for a caller that
      answers the records itself from their callbacks (the bookie server, once it has
      read every request that was ready); if a commit is running, the journal thread
      takes them as its next group.
    * :meth:`leading`: the same for a caller that submits through layers it does not
      control (asynchronous calls whose future it is about to wait for).

    Whichever thread commits, a record's callback runs only after the fdatasync that
    covers it (see "Crash guarantees").

    Callbacks run on the thread that synced the group, in queue order, as ``callback(None)``
    or ``callback(error)``; a marker's callback gets the :class:`LogMark` just after the
    records queued before it.  Keep callbacks short.

    The queue is three lists (record buffers, record callbacks, markers) that producers
    append to under ``queue_lock`` and the writer swaps for empty ones in one step, so taking
    a group costs nothing per record.  The journal thread sleeps on ``_wakeup``, a lock
    that producers release only when it sleeps.
    """

    def __init__(self, directory: str, settings: ServerSettings, io: FileIO = DEFAULT_IO,
                 first_journal_id: int = 1,
                 queue_lock: threading.Lock | None = None) -> None:
        self._dir = directory
        self._io = io
        self._max_file_bytes = settings.journalMaxSizeMB * 1024 * 1024
        self._prealloc_bytes = settings.journalPreAllocSizeMB * 1024 * 1024
        self._group_bytes = settings.journalBufferedWritesThreshold
        self._group_wait_s = settings.journalMaxGroupWaitMSec / 1000.0
        self._flush_when_empty = settings.journalFlushWhenQueueEmpty
        self._queue_limit = settings.journalQueueSize
        # An owner that already holds a lock around its own submits may share it, and then
        # submits with the *_locked methods: one lock per record instead of two.
        self._queue_lock = queue_lock or threading.Lock()
        self._buffers: list[Buffer] = []  # header, payload, header, payload, ...
        self._callbacks: list[RecordCallback] = []  # one per record
        self._markers: list[tuple[int, MarkCallback]] = []  # (bytes before, callback)
        self._written: list[RecordCallback] = []  # deferred records: one per submit
        self._unsynced = False  # deferred records written to the file and not yet synced
        self._queued_bytes = 0
        self._first_queued_at = 0.0  # monotonic time the queue's first record came
        self._group_queued_at = 0.0  # the same, for the group being committed
        #: Figures for :mod:`pybk.http.metrics`, updated by the committing thread.
        self.stats = JournalStats()
        self._wakeup = threading.Lock()
        self._wakeup.acquire()
        self._sleeping = False
        self._space = threading.Condition(threading.Lock())
        self._producers_waiting = 0
        self._commit_lock = threading.Lock()
        self._committer: int | None = None
        self._leaders = threading.local()
        self._closed = False
        self._failure: BaseException | None = None
        self._fd = -1
        self._journal_id = first_journal_id - 1
        self._offset = 0
        self._allocated = 0
        self._roll()
        self._thread = threading.Thread(target=self._run, name="pybk-journal", daemon=True)
        self._thread.start()

    # -- producers ---------------------------------------------------------------

    def submit(self, header: bytes, payload: bytes, callback: RecordCallback,
               wake: bool = True) -> None:
        """Queue a record; ``callback(None)`` once durable, ``callback(exc)`` on failure.

        ``wake=False`` leaves the group to the caller, who must then call :meth:`wait`
        with ``callback`` (a :class:`Waiter`).
        """
        with self._queue_lock:
            self.submit_locked(header, payload, callback, wake)

    def submit_locked(self, header: bytes, payload: bytes,
                      callback: RecordCallback, wake: bool = True) -> None:
        """:meth:`submit`, for a caller that holds the shared ``queue_lock``."""
        self.submit_many_locked((header, payload), len(header) + len(payload), callback,
                                wake)

    def submit_many_locked(self, buffers: Sequence[Buffer], nbytes: int,
                           callback: RecordCallback, wake: bool = True,
                           deferred: bool = False) -> None:
        """Queue several records (``buffers``: header, payload, header, payload, ... of
        ``nbytes`` in all) with one callback, called once all of them are durable (once
        written with ``deferred``: see the module docstring); they count as one against
        ``journalQueueSize``.  Caller holds ``queue_lock``."""
        if self._failure is not None or self._closed:
            raise self._failure or BookieClosed("the journal is closed")
        if not self._callbacks and not self._written:
            self._first_queued_at = time.monotonic()
        self._buffers += buffers
        (self._written if deferred else self._callbacks).append(callback)
        self._queued_bytes += nbytes
        if self._sleeping and (wake and not getattr(self._leaders, "active", False)
                               or not self._flush_when_empty):
            self._wake()

    @contextlib.contextmanager
    def leading(self) -> Iterator[None]:
        """Records this thread submits inside the block do not wake the journal thread;
        at its end, :meth:`lead` (for a caller that submits through layers it does not
        control)."""
        self._leaders.active = True
        try:
            yield
        finally:
            self._leaders.active = False
            self.lead()

    def lead(self) -> None:
        """Commit what is queued on this thread when nobody is writing: write and sync
        the group and run its callbacks here (one fdatasync, no thread switch: for a
        caller that submitted with ``wake=False`` and is about to wait for those records
        or answer them).  Otherwise, when a commit is already running, the journal thread
        takes the records as its next group."""
        if self._flush_when_empty and self._committer is None \
                and self._commit_lock.acquire(blocking=False):
            self._committer = threading.get_ident()
            try:
                self._commit_one_group()
            finally:
                self._committer = None
                self._commit_lock.release()
        if self._sleeping and (self._callbacks or self._markers or self._written):
            self._wake()

    def wait(self, waiter: Waiter) -> None:
        """Block until ``waiter``'s record is durable; raise what writing it raised.

        When nobody is writing, the caller writes and syncs the group itself (leader of
        the group commit): one fdatasync and no thread switch for a lone blocking add.
        """
        if self.is_committer_thread():
            raise BookKeeperError("a blocking journal write from a completion callback "
                                  "would wait for itself; use the asynchronous form")
        if self._flush_when_empty and self._commit_lock.acquire(blocking=False):
            self._committer = threading.get_ident()
            try:
                while waiter.pending() and self._commit_one_group():
                    pass
            finally:
                self._committer = None
                self._commit_lock.release()
        if self._sleeping and self._pending():
            self._wake()
        result = waiter.wait()
        if result is not None:
            raise result  # type: ignore[misc]

    def mark(self, callback: MarkCallback) -> None:
        """Call ``callback(LogMark)`` with the position after every record queued so far."""
        with self._queue_lock:
            self.mark_locked(callback)

    def mark_locked(self, callback: MarkCallback) -> None:
        """:meth:`mark`, for a caller that holds the shared ``queue_lock``."""
        if self._failure is not None or self._closed:
            raise self._failure or BookieClosed("the journal is closed")
        self._markers.append((self._queued_bytes, callback))
        if self._sleeping:
            self._wake()

    def sync(self) -> None:
        """Return once every record queued before the call is durable."""
        waiter = Waiter()
        self.mark(waiter)
        result = waiter.wait()
        if isinstance(result, BaseException):
            raise result

    def wait_for_queue_space(self) -> None:
        """Back-pressure: block while ``journalQueueSize`` records wait.

        Call it before taking locks that a completion callback may need; the journal's
        own thread never blocks here (it is the one that makes space).
        """
        if self.queued_records < self._queue_limit \
                or self._committer == threading.get_ident():
            return
        if self._sleeping:  # records held back by a leader (see leading) count too
            self._wake()
        with self._space:
            self._producers_waiting += 1
            try:
                while self.queued_records >= self._queue_limit and not self._closed \
                        and self._failure is None:
                    self._space.wait(0.1)
            finally:
                self._producers_waiting -= 1

    def is_committer_thread(self) -> bool:
        """Whether the calling thread is writing a group (and running its callbacks)."""
        return self._committer == threading.get_ident()

    @property
    def queued_records(self) -> int:
        """Records (or groups of records queued together) waiting to be written."""
        return len(self._callbacks) + len(self._written)

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped this journal, if one did."""
        return self._failure

    def _pending(self) -> bool:
        return bool(self._callbacks or self._markers or self._written)

    def _wake(self) -> None:
        try:
            self._wakeup.release()
        except RuntimeError:
            pass  # already released by another producer

    # -- the writing side --------------------------------------------------------

    def _run(self) -> None:
        while True:
            if not self._pending():
                if self._closed:
                    return
                self._sleeping = True
                # Re-check after announcing the sleep: a producer that appended before
                # it saw _sleeping False and did not wake us.
                if not self._pending():
                    self._wakeup.acquire(timeout=0.5)
                self._sleeping = False
                continue
            with self._commit_lock:
                self._committer = threading.get_ident()
                try:
                    self._commit_one_group()
                finally:
                    self._committer = None

    def _take_group(self) -> _Group:
        """Take everything queued: ``(buffers, record callbacks, markers, bytes)``.

        With ``journalFlushWhenQueueEmpty`` false, first wait for more records until
        ``journalBufferedWritesThreshold`` bytes or a marker are queued, or
        ``journalMaxGroupWaitMSec`` has passed (BookKeeper's group wait).
        """
        if not self._flush_when_empty:
            deadline = time.monotonic() + self._group_wait_s
            while (not self._closed and not self._markers
                   and self._queued_bytes < self._group_bytes):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._sleeping = True
                self._wakeup.acquire(timeout=min(remaining, 0.001))
                self._sleeping = False
        return self._swap_queue()

    def _swap_queue(self) -> _Group:
        with self._queue_lock:
            group = (self._buffers, self._callbacks, self._markers, self._queued_bytes,
                     self._written)
            self._group_queued_at = self._first_queued_at
            self._buffers, self._callbacks, self._markers, self._written = [], [], [], []
            self._queued_bytes = 0
        if self._producers_waiting:
            with self._space:
                self._space.notify_all()
        return group

    def _commit_one_group(self) -> bool:
        """Write and sync one group, then complete it.  Caller holds the commit lock."""
        buffers, callbacks, markers, nbytes, written = (
            self._swap_queue() if self._flush_when_empty else self._take_group())
        if not callbacks and not markers and not written:
            return False
        taken = time.monotonic()
        error: BaseException | None = self._failure
        acknowledged = False  # the deferred records' callbacks ran
        try:
            if buffers and error is None:
                self._write(buffers, nbytes)
                self.stats.flush.observe_since(taken)
            acknowledged = True
            if written:
                _complete_all(written, error)
            if (callbacks or markers) and self._unsynced and error is None:
                self._sync()
        except OSError as e:
            error = self._fail(e)
            if not acknowledged:
                _complete_all(written, error)
        if error is not None:
            _complete_all(callbacks, error)
            _complete_all([callback for _before, callback in markers], error)
            return True
        _complete_all(callbacks, None)
        if buffers:  # per group, each latency weighted by the group's records
            stats = self.stats
            records = len(buffers) // 2
            stats.queue.observe((taken - self._group_queued_at) * 1000.0, records)
            stats.add_entry.observe_since(self._group_queued_at, records)
            stats.process.observe_since(taken)
            stats.group_records.observe(records)
            stats.group_bytes.observe(nbytes)
            stats.bytes_written += nbytes
        start = self._offset - nbytes  # a group never spans two files
        for before, callback in markers:
            _complete_all((callback,), LogMark(self._journal_id, start + before))
        if self._allocated - self._offset < self._prealloc_bytes:
            try:  # after the group's callbacks: only the next group may wait for it
                self._zero_fill(ZERO_FILL_STEP)
            except OSError as e:
                self._fail(e)
        return True

    def _write(self, buffers: list[Buffer], nbytes: int) -> None:
        """Write a group at the end of the current file (rolling first if it does not
        fit); the caller syncs it (see :meth:`_sync`)."""
        if self._offset + nbytes > self._max_file_bytes and self._offset > HEADER_SIZE:
            self._roll()
        if self._offset + nbytes > self._allocated:  # behind: this group has to wait
            self._zero_fill(self._offset + nbytes - self._allocated)
        start = self._offset
        assert start >= HEADER_SIZE, "a journal group would span two files"
        written = self._io.write_all(self._fd, buffers)
        assert written == nbytes, "journal group size drifted"
        self._offset = start + written
        self._unsynced = True

    def _sync(self) -> None:
        synced_from = time.monotonic()
        self._io.fdatasync(self._fd)
        self._unsynced = False
        self.stats.sync.observe_since(synced_from)

    def _zero_fill(self, length: int) -> None:
        """Write zeros over the next ``length`` bytes past the zeroed part, and sync them."""
        _zero_fill(self._io, self._fd, self._allocated, length)
        self._allocated += length

    def _fail(self, error: OSError) -> BaseException:
        """A write or sync failed: the file's tail is now unknown, so stop this journal.

        After a failed fdatasync the kernel may have dropped the dirty pages, so retrying
        on the same file could acknowledge data that is not on disk.  Every later request
        fails with the same error until the bookie restarts (and replays what is valid).
        """
        if error.errno == errno.ENOSPC:
            failure: BaseException = DiskFull(f"journal {self._dir} is full: {error}")
        else:
            failure = BookKeeperError(f"journal write to {self._dir} failed: {error}")
        log.error("%s; the journal takes no more records", failure)
        self._failure = failure
        _buffers, callbacks, markers, _nbytes, written = self._swap_queue()
        _complete_all(written + callbacks, failure)
        _complete_all([callback for _before, callback in markers], failure)
        with self._space:
            self._space.notify_all()
        return failure

    def _roll(self) -> None:
        """Close the current file and start the next one (header written and synced)."""
        if self._fd >= 0:
            if self._unsynced:  # a marker after the roll syncs the new file only
                self._sync()
            os.close(self._fd)
            self._fd = -1
        self._journal_id += 1
        path = os.path.join(self._dir, journal_file_name(self._journal_id))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _zero_fill(self._io, fd, 0, ZERO_FILL_STEP)  # the rest follows a step after each group
            self._io.write_all(fd, [file_header(self._journal_id)])
            self._io.fdatasync(fd)
            fsync_directory(self._dir)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._offset = HEADER_SIZE
        self._allocated = ZERO_FILL_STEP
        log.debug("journal %s started", path)

    # -- housekeeping ------------------------------------------------------------

    def remove_old_files(self, mark: LogMark, keep_backups: int) -> list[int]:
        """Remove files wholly before ``mark``, keeping the newest ``keep_backups`` of them."""
        old = [j for j in list_journal_ids(self._dir) if j < mark.journal_id
               and j != self._journal_id]
        doomed = old[:max(0, len(old) - keep_backups)]
        for journal_id in doomed:
            os.unlink(os.path.join(self._dir, journal_file_name(journal_id)))
        if doomed:
            fsync_directory(self._dir)
            log.info("removed journals %s (checkpoint at %s)", doomed, mark)
        return doomed

    def close(self) -> None:
        """Write what is queued, then stop the journal thread and close the file."""
        self._closed = True
        self._wake()
        self._thread.join()
        with self._commit_lock:
            while self._commit_one_group():
                pass
            if self._fd >= 0:
                if self._unsynced and self._failure is None:
                    with contextlib.suppress(OSError):  # replay copes with a torn tail
                        self._sync()
                os.close(self._fd)
                self._fd = -1


#: Zeros are written ahead of the journal's end one step after each group (until
#: ``journalPreAllocSizeMB`` are ahead): about a millisecond of disk time per step, where
#: growing by the whole preallocation at once made every group behind it wait for it.
ZERO_FILL_STEP = 1024 * 1024
_ZEROS = bytes(ZERO_FILL_STEP)


def _zero_fill(io: FileIO, fd: int, start: int, length: int) -> None:
    """Write zeros over ``[start, start + length)`` and sync them (preallocation), through
    ``io`` like every other journal write (so that injected faults reach it too)."""
    end = start + length
    zeros = memoryview(_ZEROS)
    for chunk_start in range(start, end, len(_ZEROS)):
        io.pwrite_all(fd, zeros[:min(len(_ZEROS), end - chunk_start)], chunk_start)
    io.fdatasync(fd)

"""The floor of a pipelined durable append in Python: what ``append_async`` costs here
with no storage engine, only the work a durable, checksummed, twice-written append
cannot avoid.

Used by ``wal_bench.py`` (``floor_pipelined``) beside the WAL's own ``wal_pipelined``,
driven by the same loop, so that the WAL's rate reads as a ratio to it.

:class:`AppendFloor` has the WAL's face: ``append_async(data)`` returns a
``concurrent.futures.Future`` that is answered once the record is durable (the cheapest
real Futures known here: :class:`pybk.log.futures.BatchFutures`, which share one
condition per group; a plain Future per record costs several times more than the rest
of an append).  Each append
checksums its record (CRC-32C) and queues it; one committer thread takes everything
queued, writes it with one ``pwritev`` into a journal file of zeros synced beforehand (as
pybk's journal is written), runs one ``fdatasync`` for the group, answers the group's
futures, and then writes the records a second time, to an entry-log file, syncing that one
every ``ENTRY_LOG_SYNC_BYTES`` (a checkpoint's flush).  No index, no ledgers, no
positions, no metrics: whatever the WAL spends beyond this is its own.
"""

from __future__ import annotations

import os
import struct
import threading
from concurrent.futures import Future

from rawdisk import prepare_zero_fill

from pybk.checksum import crc32c
from pybk.log.futures import BatchFutures

RECORD_HEADER = struct.Struct(">II")   # length, CRC-32C of the record
JOURNAL_BYTES = 64 * 1024 * 1024       # zeros synced beforehand, rewritten from the start
ENTRY_LOG_SYNC_BYTES = 32 * 1024 * 1024
STOP_WAIT_S = 10.0                     # the committer ends after close(), bounded


class AppendFloor:
    """Durable appends with group commit and no engine (see the module docstring)."""

    def __init__(self, directory: str) -> None:
        self._journal = os.open(os.path.join(directory, "floor.journal"),
                                os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        prepare_zero_fill(self._journal, JOURNAL_BYTES)
        self._entry_log = os.open(os.path.join(directory, "floor.log"),
                                  os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._records: list[bytes] = []   # header, data, header, data, ...
        self._futures = BatchFutures()
        self._lock = threading.Lock()
        self._queued = threading.Condition(self._lock)
        self._closed = False
        self._iov_max = os.sysconf("SC_IOV_MAX")
        self._committer = threading.Thread(target=self._commit_groups, name="floor-commit")
        self._committer.start()

    def append_async(self, data: bytes) -> Future:
        header = RECORD_HEADER.pack(len(data), crc32c(data))
        with self._lock:
            self._records += (header, data)
            future = self._futures.new()
            if len(self._futures) == 1:
                self._queued.notify()
        return future

    def sync(self) -> None:
        """Nothing: every append is durable when its future is answered."""

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._queued.notify()
        self._committer.join(STOP_WAIT_S)
        os.close(self._journal)
        os.close(self._entry_log)

    def _commit_groups(self) -> None:
        journal_offset, unsynced = 0, 0
        while True:
            with self._lock:
                while not self._futures and not self._closed:
                    self._queued.wait()
                if not self._futures:
                    return
                buffers, futures = self._records, self._futures
                self._records, self._futures = [], BatchFutures()
            size = sum(map(len, buffers))
            if journal_offset + size > JOURNAL_BYTES:
                journal_offset = 0
            for start in range(0, len(buffers), self._iov_max):
                journal_offset += os.pwritev(self._journal,
                                             buffers[start:start + self._iov_max],
                                             journal_offset)
            os.fdatasync(self._journal)
            futures.set_results([True] * len(futures))
            for start in range(0, len(buffers), self._iov_max):
                unsynced += os.writev(self._entry_log, buffers[start:start + self._iov_max])
            if unsynced >= ENTRY_LOG_SYNC_BYTES:
                os.fdatasync(self._entry_log)
                unsynced = 0

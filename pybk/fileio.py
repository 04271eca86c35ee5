"""The few file system calls pybk's durable writes go through.

A bottom module (it imports nothing of pybk): the storage engine and the embedded
metadata store both write durably through it.

The journal, the entry logs and the LastLogMark write through a :class:`FileIO`, so that a
test can put a fault-injecting layer underneath (:mod:`pybk.testing.faultyio`): drop, truncate
or garble what was written since the last sync, as a power cut would.  The renames and
removals that complete a durable step (an entry log's or a LastLogMark's rename into place,
an entry log's removal by garbage collection) go through it too, so that such a layer can
stop a process just before them.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
from typing import Callable, Sequence

#: What durable writes take: bytes, or a view of bytes held elsewhere (an entry as it
#: arrived in a bookie server's message, written without a copy).
Buffer = bytes | memoryview

# Linux refuses writev() with more buffers than IOV_MAX (1024).
_IOV_MAX = 1024


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux), or None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()
# SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER
_WRITE_AND_WAIT = 1 | 2 | 4


class FileIO:
    """Plain POSIX calls: whole writes (retrying short ones), fdatasync and fsync."""

    def write_all(self, fd: int, buffers: Sequence[Buffer]) -> int:
        """Write ``buffers`` at the file position, in order, completely; return the byte count."""
        total = 0
        for start in range(0, len(buffers), _IOV_MAX):
            chunk: list[bytes | memoryview] = list(buffers[start:start + _IOV_MAX])
            remaining = sum(map(len, chunk))
            total += remaining
            while remaining:
                written = os.writev(fd, chunk)
                remaining -= written
                if remaining:
                    chunk = _skip(chunk, written)
        return total

    def pwrite_all(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        """Write ``data`` at ``offset`` completely."""
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def write_out(self, fd: int, offset: int, nbytes: int) -> None:
        """Write the file's dirty pages in ``[offset, offset + nbytes)`` to the disk and
        wait for them, without the metadata and cache flush of an fdatasync.  This paces
        writeback; it makes nothing durable.  (Linux ``sync_file_range``; elsewhere an
        fdatasync.)"""
        if _sync_file_range is None:
            os.fdatasync(fd)
        elif _sync_file_range(fd, offset, nbytes, _WRITE_AND_WAIT) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"sync_file_range: {os.strerror(error)}")

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def rename(self, source: str, target: str) -> None:
        """Rename ``source`` to ``target``, replacing it (durable after a directory fsync)."""
        os.replace(source, target)

    def unlink(self, path: str) -> None:
        """Remove ``path`` (durable after a directory fsync)."""
        os.unlink(path)


def _skip(buffers: list[bytes | memoryview], count: int) -> list[bytes | memoryview]:
    """The buffers that remain after the first ``count`` bytes were written."""
    while count:
        head = buffers[0]
        if len(head) <= count:
            count -= len(head)
            buffers.pop(0)
        else:
            buffers[0] = memoryview(head)[count:]
            count = 0
    return buffers


def fsync_directory(path: str) -> None:
    """Make a directory's entries (created, renamed or removed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(path: str, data: bytes, io: FileIO | None = None) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file."""
    io = io or DEFAULT_IO
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        io.write_all(fd, [data])
        io.fsync(fd)
    finally:
        os.close(fd)
    io.rename(tmp, path)
    fsync_directory(os.path.dirname(os.path.abspath(path)))


def lock_file(path: str, shared: bool = False) -> int:
    """Take an exclusive lock on ``path`` (created if missing); returns its descriptor.

    Raises BlockingIOError at once if another process (or another open of the file in this
    process) holds it.  The kernel releases the lock when the process dies, even by kill -9.
    ``shared`` takes a shared lock instead, for readers: several may hold one at once, and
    none while an exclusive one is held (nor an exclusive one while they hold theirs).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


# struct flock (Linux): l_type, l_whence, l_start, l_len, l_pid (and padding).
_FLOCK = struct.Struct("hhqqi4x")


def hold_presence(path: str) -> int:
    """Announce that this process is using what ``path`` (created if missing) stands for,
    until the returned descriptor is closed or the process dies (even by kill -9).

    An open-file-description write lock (``F_OFD_SETLK``), not ``flock``: another process
    asks :func:`presence_held` without taking any lock, so asking never makes this call
    fail or wait.  Raises BlockingIOError if another open of the file holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    except BaseException:
        os.close(fd)
        raise
    return fd


def presence_held(path: str) -> bool:
    """Whether a process holds :func:`hold_presence` on ``path`` now (False if there is no
    such file).  Takes no lock (``F_OFD_GETLK``): the holder is never disturbed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK,
                             _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    finally:
        os.close(fd)
    return _FLOCK.unpack(answer)[0] != fcntl.F_UNLCK


DEFAULT_IO = FileIO()

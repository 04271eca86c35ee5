"""A fault-injecting FileIO that acts out power loss.

:class:`FaultyFileIO` remembers, per file, every write made since the file's last
fdatasync/fsync (through any descriptor: a sync flushes the file, not the descriptor; the
path comes from ``/proc/self/fd``), with the bytes it overwrote.  :func:`lose_unsynced`
then does to those writes what a power cut may: undo them, zero or garble them.

In a child process it also appends each step to a log file (a write *before* it happens, a
sync, rename or removal *after* it returned), so a parent can rebuild the unsynced writes
after a SIGKILL with :func:`read_unsynced`; ``kill_when`` makes the child SIGKILL itself
before a chosen operation (a write, a sync, a rename, a removal, or any other step a test
announces with :meth:`FaultyFileIO.step`, such as an index commit), so that a crash lands
exactly where unsynced data waits.

What a power cut may do, as simulated here:

* bytes of *fresh* space (past the old end of file, or preallocated zeros) may come back
  as written, as before (zeros, or cut off when past the old end), zeroed or garbled;
* bytes that *overwrote* earlier data come back old or new, whole (a sector is written
  atomically; garbling them would be a broken disk, not a power cut).

Only the journal, the entry logs and the LastLogMark write through FileIO; LMDB syncs its
own commits, and directory entries (created, renamed or removed files) and
``posix_fallocate`` are not simulated (they are kept).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import BinaryIO, Callable, Sequence

from pybk.fileio import Buffer, FileIO

BLOCK = 4096
MODES = ("drop", "zero", "garble", "mixed")


@dataclass(frozen=True)
class Write:
    """One write not yet synced: where, how long, and what it overwrote."""

    offset: int
    length: int
    old_size: int          # the file's size before the write
    old: bytes | None      # earlier bytes under [offset, old_size), None if all zero


#: ``kill_when(op, path, offset)`` -> SIGKILL the process before the operation.  ``op`` is
#: ``write`` (at ``offset``), ``sync``, ``rename`` (``path`` is the source), ``unlink``, or
#: what :meth:`FaultyFileIO.step` was given.
KillPredicate = Callable[[str, str, int], bool]


class FaultyFileIO(FileIO):
    """FileIO that tracks unsynced writes (and can log them, and can kill its process)."""

    def __init__(self, log_path: str | None = None,
                 kill_when: KillPredicate | None = None) -> None:
        self.unsynced: dict[str, list[Write]] = {}
        self._lock = threading.Lock()
        self._kill_when = kill_when
        self._log_fd = (os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                        if log_path else -1)

    def write_all(self, fd: int, buffers: Sequence[Buffer]) -> int:
        self._before_write(fd, os.lseek(fd, 0, os.SEEK_CUR), sum(len(b) for b in buffers))
        return super().write_all(fd, buffers)

    def pwrite_all(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        self._before_write(fd, offset, len(data))
        super().pwrite_all(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        path = self._maybe_kill("sync", fd, 0)
        super().fdatasync(fd)
        self._after_sync(path)

    def fsync(self, fd: int) -> None:
        path = self._maybe_kill("sync", fd, 0)
        super().fsync(fd)
        self._after_sync(path)

    def rename(self, source: str, target: str) -> None:
        self.step("rename", source)
        super().rename(source, target)
        with self._lock:
            _rename(self.unsynced, source, target)
            self._log({"rename": source, "to": target})

    def unlink(self, path: str) -> None:
        self.step("unlink", path)
        super().unlink(path)
        with self._lock:
            self.unsynced.pop(path, None)
            self._log({"unlink": path})

    def step(self, op: str, path: str, offset: int = 0) -> None:
        """A durable step about to be taken (``op`` on ``path``): SIGKILL this process
        first if ``kill_when`` says so."""
        if self._kill_when is not None and self._kill_when(op, path, offset):
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # pragma: no cover - the signal arrives first

    def crash(self, mode: str, rng: random.Random,
              keep: Callable[[str, Write], bool] | None = None) -> int:
        """Act out a power cut on the files now (their writers must be stopped)."""
        with self._lock:
            damaged = lose_unsynced(self.unsynced, mode, rng, keep)
            self.unsynced.clear()
        return damaged

    # -- internals ---------------------------------------------------------------

    def _maybe_kill(self, op: str, fd: int, offset: int) -> str:
        path = os.readlink(f"/proc/self/fd/{fd}")
        self.step(op, path, offset)
        return path

    def _before_write(self, fd: int, offset: int, length: int) -> None:
        path = self._maybe_kill("write", fd, offset)
        old_size = os.fstat(fd).st_size
        with open(path, "rb") as f:  # the fd may be write-only
            f.seek(offset)
            old = f.read(max(0, min(length, old_size - offset)))
        write = Write(offset, length, old_size, old if old.count(0) != len(old) else None)
        with self._lock:
            self.unsynced.setdefault(path, []).append(write)
            self._log({"w": path, "o": offset, "n": length, "s": old_size,
                       "old": write.old.hex() if write.old is not None else None})

    def _after_sync(self, path: str) -> None:
        with self._lock:
            self.unsynced.pop(path, None)
            self._log({"sync": path})

    def _log(self, record: dict) -> None:
        if self._log_fd >= 0:
            os.write(self._log_fd, json.dumps(record).encode() + b"\n")


def read_unsynced(log_path: str) -> dict[str, list[Write]]:
    """Rebuild a (killed) process's unsynced writes from its FaultyFileIO log."""
    unsynced: dict[str, list[Write]] = {}
    with open(log_path, "rb") as f:
        lines = f.read().split(b"\n")[:-1]  # an unfinished last line: the write never began
    for line in lines:
        record = json.loads(line)
        if "sync" in record:
            unsynced.pop(record["sync"], None)
        elif "unlink" in record:
            unsynced.pop(record["unlink"], None)
        elif "rename" in record:
            _rename(unsynced, record["rename"], record["to"])
        else:
            old = bytes.fromhex(record["old"]) if record["old"] is not None else None
            unsynced.setdefault(record["w"], []).append(
                Write(record["o"], record["n"], record["s"], old))
    return unsynced


def _rename(unsynced: dict[str, list[Write]], source: str, target: str) -> None:
    """The source's unsynced writes now belong to the target; the replaced file's went
    with it."""
    unsynced.pop(target, None)
    moved = unsynced.pop(source, None)
    if moved:
        unsynced[target] = moved


def lose_unsynced(unsynced: dict[str, list[Write]], mode: str, rng: random.Random,
                  keep: Callable[[str, Write], bool] | None = None) -> int:
    """Do to unsynced writes what a power cut may; return how many bytes were at stake.

    ``mode``: ``drop`` undoes every write; ``zero`` / ``garble`` zero / garble their fresh
    bytes; ``mixed`` picks kept, zeroed or garbled per 4 KiB block.  Overwrites of earlier
    data come back old or new (drop: old).  ``keep(path, write)`` spares a write.
    """
    assert mode in MODES, mode
    touched = 0
    for path, writes in unsynced.items():
        if not os.path.exists(path):  # removed since: nothing left to lose
            continue
        with open(path, "r+b") as f:
            for write in reversed(writes):  # undo the newest first
                if keep is None or not keep(path, write):
                    touched += _lose(f, write, mode, rng)
    return touched


def _lose(f: BinaryIO, write: Write, mode: str, rng: random.Random) -> int:
    start, end = write.offset, write.offset + write.length
    if write.old is not None:  # the overwritten part: old or new, whole
        if mode == "drop" or rng.random() < 0.5:
            f.seek(start)
            f.write(write.old)
        start += len(write.old)
    if mode == "drop":
        if start < write.old_size:  # preallocated space: back to zeros
            f.seek(start)
            f.write(bytes(min(end, write.old_size) - start))
        if end > write.old_size:
            f.truncate(max(write.old_size, start))
        return write.length
    for block_start in range(start, end, BLOCK):
        block_end = min(end, (block_start // BLOCK + 1) * BLOCK)
        choice = mode if mode != "mixed" else rng.choice(("keep", "zero", "garble"))
        if choice != "keep":
            f.seek(block_start)
            f.write(bytes(block_end - block_start) if choice == "zero"
                    else rng.randbytes(block_end - block_start))
    return write.length

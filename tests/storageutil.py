"""Helpers for storage tests: crash images of a running bookie, and a sync counter."""

from __future__ import annotations

import os
import shutil

from pybk.fileio import FileIO
from pybk.settings import ServerSettings
from pybk.storage import Bookie


def directories(settings: ServerSettings) -> list[str]:
    return [settings.journalDirectory, *settings.ledgerDirectories]


def close_as_if_crashed(bookie: Bookie, scratch: str) -> None:
    """Leave the bookie's directories as a kill -9 at this moment would.

    Copies every directory while the bookie runs (acknowledged journal records are
    already on disk), closes the bookie (which checkpoints), then puts the copies back,
    so the next start sees the state of the moment of the copy, not of a clean close.
    """
    dirs = directories(bookie.settings)
    copies = [os.path.join(scratch, f"crash-image-{i}") for i in range(len(dirs))]
    for source, copy in zip(dirs, copies):
        shutil.copytree(source, copy, copy_function=_copy_if_present)
    bookie.close()
    for source, copy in zip(dirs, copies):
        shutil.rmtree(source)
        shutil.move(copy, source)


def _copy_if_present(source: str, destination: str) -> None:
    """Copy a file unless the running bookie removed it since it was listed (a
    checkpoint renames its temporary LastLogMark, GC removes entry logs)."""
    try:
        shutil.copy2(source, destination)
    except FileNotFoundError:
        pass


class CountingIO(FileIO):
    """Counts fdatasync calls on journal files (paths ending in .txn)."""

    def __init__(self) -> None:
        self.journal_syncs = 0

    def fdatasync(self, fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".txn"):
            self.journal_syncs += 1
        super().fdatasync(fd)


class EntryLogWriteOutRecorder(FileIO):
    """Records the ranges written out (``write_out``) and the fdatasyncs of entry logs."""

    def __init__(self) -> None:
        self.written_out: list[tuple[int, int]] = []  # (offset, bytes)
        self.syncs = 0

    def write_out(self, fd: int, offset: int, nbytes: int) -> None:
        super().write_out(fd, offset, nbytes)
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            self.written_out.append((offset, nbytes))

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            self.syncs += 1


class JournalWriteFailure(FileIO):
    """Fails journal writes with ``error_number`` (e.g. ENOSPC, EIO) once armed."""

    def __init__(self, error_number: int) -> None:
        self.error_number = error_number
        self.armed = False

    def write_all(self, fd: int, buffers):
        if self.armed and os.readlink(f"/proc/self/fd/{fd}").endswith(".txn"):
            raise OSError(self.error_number, os.strerror(self.error_number))
        return super().write_all(fd, buffers)

"""Helpers for storage tests: crash images of a running bookie, and a sync counter."""

from __future__ import annotations

import os
import shutil

from pybk.settings import ServerSettings
from pybk.storage import Bookie
from pybk.storage.fileio import FileIO


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
        shutil.copytree(source, copy)
    bookie.close()
    for source, copy in zip(dirs, copies):
        shutil.rmtree(source)
        shutil.move(copy, source)


class CountingIO(FileIO):
    """Counts fdatasync calls on journal files (paths ending in .txn)."""

    def __init__(self) -> None:
        self.journal_syncs = 0

    def fdatasync(self, fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".txn"):
            self.journal_syncs += 1
        super().fdatasync(fd)


class EntryLogSyncRecorder(FileIO):
    """Records, for each fdatasync of an entry log (``.log``), how many bytes had been
    written to it since its previous one."""

    def __init__(self) -> None:
        self.unsynced: dict[str, int] = {}
        self.synced_runs: list[int] = []

    def write_all(self, fd: int, buffers) -> int:
        written = super().write_all(fd, buffers)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(".log"):
            self.unsynced[path] = self.unsynced.get(path, 0) + written
        return written

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if self.unsynced.get(path):
            self.synced_runs.append(self.unsynced.pop(path))


class JournalWriteFailure(FileIO):
    """Fails journal writes with ``error_number`` (e.g. ENOSPC, EIO) once armed."""

    def __init__(self, error_number: int) -> None:
        self.error_number = error_number
        self.armed = False

    def write_all(self, fd: int, buffers):
        if self.armed and os.readlink(f"/proc/self/fd/{fd}").endswith(".txn"):
            raise OSError(self.error_number, os.strerror(self.error_number))
        return super().write_all(fd, buffers)

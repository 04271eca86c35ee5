"""LastLogMark: the journal position a checkpoint covers, kept in every ledger directory.

File ``<ledger dir>/current/lastMark``, 20 bytes, big-endian::

    0  8  journal id
    8  8  offset in that journal
    16 4  CRC-32C of bytes 0..15

Written atomically (temporary file, fsync, rename, directory fsync) only after the entry
logs and the index are durable.  At start the smallest valid mark of all directories is
used: replaying from an older mark is always safe, because replay is idempotent.
"""

from __future__ import annotations

import logging
import os
import struct

from pybk.checksum import crc32c
from pybk.errors import CorruptData
from pybk.fileio import DEFAULT_IO, FileIO, write_file_atomically
from pybk.storage.journal_codec import LogMark

log = logging.getLogger(__name__)

MARK = struct.Struct(">QQ")
assert MARK.size + 4 == 20, "lastMark is documented as 20 bytes"
FILE_NAME = "lastMark"


def _path(ledger_dir: str) -> str:
    return os.path.join(ledger_dir, "current", FILE_NAME)


def write_mark(ledger_dirs: list[str], mark: LogMark, io: FileIO = DEFAULT_IO) -> None:
    body = MARK.pack(*mark)
    data = body + struct.pack(">I", crc32c(body))
    for directory in ledger_dirs:
        write_file_atomically(_path(directory), data, io)


def read_directory_mark(ledger_dir: str) -> LogMark | None:
    """The mark in one ledger directory; None if it has none; CorruptData if it is
    damaged."""
    try:
        with open(_path(ledger_dir), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if len(data) != MARK.size + 4 or struct.unpack_from(">I", data, MARK.size)[0] != \
            crc32c(data[:MARK.size]):
        raise CorruptData(f"{_path(ledger_dir)} is damaged ({len(data)} bytes, or a bad "
                          "checksum)")
    return LogMark(*MARK.unpack_from(data))


def read_mark(ledger_dirs: list[str]) -> LogMark:
    """Where a bookie replays its journal from: :func:`replay_start` of the directories'
    marks (a damaged one is logged and counts as none)."""
    marks = []
    for directory in ledger_dirs:
        try:
            marks.append(read_directory_mark(directory))
        except CorruptData:
            log.warning("ignoring damaged %s; replaying the journal from its start",
                        _path(directory))
            marks.append(None)
    return replay_start(marks)


def replay_start(marks: list[LogMark | None]) -> LogMark:
    """The oldest of the ledger directories' marks, or (0, 0), replay everything, if a
    directory has none."""
    if not marks or None in marks:
        return LogMark(0, 0)
    return min(mark for mark in marks if mark is not None)

"""What a WAL holds: its first and last positions, the space it takes, and its figures,
for the owner's WAL (:class:`pybk.log.wal.WAL`) and a read-only one
(:class:`pybk.log.readonly.ReadOnlyWAL`) alike.

Each figure is read when asked, from the log's metadata and its segments' ledgers; none
is kept up to date in the background.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from pybk.errors import NoNode, NoSuchEntry, NoSuchLedger, NoSuchLog
from pybk.log.batch import batch_lengths
from pybk.log.metadata import read_log
from pybk.log.position import Position
from pybk.log.reader import LogReader
from pybk.meta.ledger_metadata import LedgerState

if TYPE_CHECKING:
    from pybk.client import BookKeeper
    from pybk.log.writer import LogWriter


@dataclass(frozen=True)
class WALStats:
    """A WAL's figures (:meth:`WAL.stats`, :meth:`ReadOnlyWAL.stats`).

    ``first_position`` and ``last_position`` are those of the first and the last record
    the handle can read (None: it holds none); ``space_used_bytes`` is what its directory
    takes on disk.  The counters count since the handle was opened: on the owner's WAL,
    ``appends`` and ``appended_bytes`` (appends taken, whether or not they then became
    durable, and their bytes: values, keys and headers), ``syncs`` (the journal's fdatasyncs) and
    ``journal_bytes_written``; on a read-only WAL, ``journal_records_read`` (records it
    read from the owner's journal: :mod:`pybk.storage.readonly`) and ``owner_running``
    (whether a process has the WAL open now).  A figure the handle does not keep is
    None."""

    first_position: Position | None
    last_position: Position | None
    space_used_bytes: int
    appends: int | None = None
    appended_bytes: int | None = None
    syncs: int | None = None
    journal_bytes_written: int | None = None
    journal_records_read: int | None = None
    owner_running: bool | None = None


def first_position(bk: "BookKeeper", name: str, writer: "LogWriter | None" = None,
                   writerless: "Callable[[], bool] | None" = None) -> Position | None:
    """The position of the first record of log ``name`` that a reader finds, or None if
    it has none (``writer``, ``writerless``: as :class:`LogReader` takes them)."""
    try:
        record = LogReader(bk, name, writer=writer, writerless=writerless).read_next(0)
    except NoSuchLog:
        return None
    return record[0] if record is not None else None


def last_position(bk: "BookKeeper", name: str,
                  writer: "LogWriter | None" = None) -> Position | None:
    """The position of the last record of log ``name`` that a reader finds (in the
    writer's process: the last acknowledged one), or None if it has none.

    Looks at the newest segments (the log head's tail), newest first: a log's older
    segments are all before them, and opening drops every empty segment but the
    newest."""
    try:
        metadata = read_log(bk.metadata, name).metadata
    except NoNode:
        return None
    for segment in reversed(metadata.tail):
        own = writer.ledger_for(segment.ledger_id) if writer is not None else None
        try:
            handle = own or bk.open_ledger(segment.ledger_id, b"", recovery=False)
            if handle.metadata.state is LedgerState.CLOSED:
                last = handle.metadata.closed_last_entry_id()
            elif own is not None:
                last = own.last_add_confirmed
            else:
                last = handle.read_last_add_confirmed()
            if last < 0:
                continue
            records, _ = batch_lengths(next(handle.read_entries(last, last)).data)
        except (NoSuchLedger, NoSuchEntry):
            continue  # truncated away meanwhile: what is left is later
        position = Position(segment.number, last, len(records) - 1)
        return position if records and position >= metadata.truncated_before else None
    return None


def space_used_bytes(path: str) -> int:
    """Bytes the files under ``path`` take on disk (allocated blocks, as ``du`` counts;
    the journal's preallocated zeros included).  Files deleted while it counts are
    skipped."""
    total = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total
